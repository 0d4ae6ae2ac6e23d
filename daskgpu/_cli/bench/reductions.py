"""The section ``reductions``: a histogram across chunks, and random states built on the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

from daskgpu._cli.bench.common import BenchCluster, ratio, timed, unique, wait_persisted


def _numba_hist_chunk(x):
    # By hand: a Numba kernel per chunk (its arrays copied in and back by Numba).
    from daskgpu._cli.bench import kernels as k

    counts = np.zeros(256, np.int64)
    k.numba_hist256[(x.size + 255) // 256, 256](counts, x, np.float32(0), np.float32(1))
    return counts[None, :]


def states_build_seconds(n: int, seed: int, start: int, builder, repeat: int = 5):
    """On a worker: seconds to build ``n`` random states from ``start`` on its GPU, and the ends."""
    from cuda.bindings import driver

    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.driver import check
    from daskgpu._runtime.random_states import build

    device.current()
    build(seed, start, (n,), (1,), builder)  # warm: links the states kernel
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        states = build(seed, start, (n,), (1,), builder)
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        times.append(time.perf_counter() - t0)
    ends = states.copy_to_host()[[0, -1]]
    return times, [[int(e["s0"]), int(e["s1"])] for e in ends]


def bench_reductions(cluster: BenchCluster, size_bytes: int = 4 << 30,
                     chunk_bytes: int = 64 << 20, states: int = 1 << 24,
                     states_start: int = 1 << 30, numba_start: int = 1 << 24) -> list:
    """A 256-bin histogram and random-state construction, against what users write by hand.

    The histogram of ``size_bytes`` of float32 host chunks: ``map_kernel`` with a
    per-chunk output summed across chunks, against ``da.histogram`` on the
    workers' CPUs and against ``map_blocks`` + a Numba kernel + a hand-written
    sum. Random states: ``states`` of them from global index ``states_start``,
    built on a worker's GPU, against Numba's ``create_xoroshiro128p_states(states,
    seed, subsequence_start)``, which jumps ``subsequence_start`` times on the host,
    one after the other (2**30 of them take minutes). Numba runs, in a process of
    its own meanwhile (:mod:`~daskgpu._cli.bench.fresh`), at ``numba_start`` (a
    lower bound of its cost at ``states_start``), and its cost at ``states_start``
    is also extrapolated from its measured time per jump.
    """
    from daskgpu._compiler.random_states import builder
    from daskgpu._image.random_states import host_states

    seed = 2024
    numba_states = subprocess.Popen(
        [sys.executable, "-m", "daskgpu._cli.bench.fresh", str(states), str(seed),
         str(numba_start), str(min(numba_start, 1 << 23) or 1)],
        stdout=subprocess.PIPE, text=True)
    client = cluster.client
    ours_t, cpu_t, hand_t = _histogram_seconds(size_bytes, chunk_bytes)

    built_t, ends = client.submit(states_build_seconds, states, seed, states_start, builder(),
                                  pure=False).result()
    want = host_states(seed, np.array([states_start, states_start + states - 1], np.uint64))
    assert ends == [[int(w["s0"]), int(w["s1"])] for w in want], "states differ from Numba's"
    print(f"  states: daskgpu {min(built_t):.4f} s at offset {states_start}", flush=True)
    numba = json.loads(numba_states.communicate()[0])
    numba_want = host_states(seed, np.array([numba_start, numba_start + states - 1], np.uint64))
    assert numba["ends"] == [[int(w["s0"]), int(w["s1"])] for w in numba_want], \
        "Numba's states differ from the jump table's"
    extrapolated = numba["seconds"] + (states_start - numba_start) * numba["per_jump"]
    what = f"256-bin histogram, {size_bytes >> 20} MiB float32 host, {chunk_bytes >> 20} MiB chunks"
    where = f"{states >> 20}M random states at offset 2**{states_start.bit_length() - 1}"
    return [
        ratio(what, ours_t, cpu_t, "s", "da.histogram on the workers' CPUs"),
        ratio(what, ours_t, hand_t, "s", "da.map_blocks + Numba kernel + a sum by hand"),
        ratio(f"{where}, on the worker's GPU", built_t, [numba["seconds"]], "s",
              f"numba create_xoroshiro128p_states(n, seed, subsequence_start=2**"
              f"{numba_start.bit_length() - 1}), measured: a lower bound"),
        ratio(f"{where}, on the worker's GPU", built_t, [extrapolated], "s",
              f"the same at 2**{states_start.bit_length() - 1}, extrapolated from "
              f"Numba's {numba['per_jump'] * 1e9:.0f} ns per host jump"),
    ]


def _histogram_seconds(size_bytes: int, chunk_bytes: int) -> tuple:
    # The histogram's times: daskgpu, da.histogram, by hand. Its input, on the
    # cluster, is released on return, before the random states are built.
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    x = wait_persisted(da.random.default_rng(0).random(size_bytes // 4, dtype=np.float32,
                                                       chunks=chunk_bytes // 4))
    low, high = np.float32(0), np.float32(1)

    def ours():
        # tpb=: its shared bins are static shared memory; 256 threads, as the Numba baseline
        return dg.map_kernel(k.hist256, dg.Out(np.int64, per_chunk=256, combine="sum"), x,
                             low, high, tpb=256, name=unique("hist")).compute()

    def cpu():
        return da.histogram(x, bins=256, range=(0, 1))[0].compute()

    def by_hand():
        per_chunk = da.map_blocks(_numba_hist_chunk, x, dtype=np.int64, new_axis=1,
                                  chunks=((1,) * x.npartitions, (256,)), name=unique("numba"))
        return per_chunk.sum(axis=0).compute()

    results = [ours(), cpu(), by_hand()]  # warm, and all three must agree
    for r in results[1:]:
        np.testing.assert_array_equal(results[0], r)
    assert results[0].sum() == x.size
    ours_t, cpu_t, hand_t = timed(ours), timed(cpu), timed(by_hand)
    print(f"  histogram: daskgpu {min(ours_t):.3f} s, da.histogram {min(cpu_t):.3f} s, "
          f"map_blocks + Numba {min(hand_t):.3f} s", flush=True)
    return ours_t, cpu_t, hand_t
