"""The section ``map-device``: ``map_kernel`` over chunks already on the GPU (CuPy).

With no host copies to hide it, what is left is the cost per chunk: daskgpu's
against ``da.map_blocks`` + Numba, and Dask's own floor on the same chunks,
and how much of it is spent inside the tasks rather than around them.
"""

from __future__ import annotations

import time

import numpy as np

from daskgpu._cli.bench.common import (
    BenchCluster,
    cupy_chunk,
    host_inputs,
    noop_chunk,
    numba_chunk,
    placed_alloc_chunk,
    placed_noop_chunk,
    ratio,
    task_seconds,
    timed,
    unique,
    wait_persisted,
)


def bench_map_device(cluster: BenchCluster, size_bytes: int = 1 << 30,
                     chunk_counts=(16, 256)) -> list:
    """``map_kernel`` on CuPy chunks vs ``map_blocks`` + Numba, and a no-op, on the same chunks.

    Run at each number of chunks in ``chunk_counts``: few large chunks show the
    launch's own cost, many small ones the cost per task.
    """
    rows = []
    for count in chunk_counts:
        rows += _map_device_rows(cluster, size_bytes, size_bytes // count)
    return rows


def _map_device_rows(cluster: BenchCluster, size_bytes: int, chunk_bytes: int) -> list:
    import cupy as cp
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    client = cluster.start()  # first: the inputs persist on its client, the default one
    x, y = host_inputs(size_bytes, chunk_bytes)
    xg = wait_persisted(x.map_blocks(cp.asarray))
    yg = wait_persisted(y.map_blocks(cp.asarray))
    nchunks = xg.numblocks[0]

    def ours():
        return wait_persisted(
            dg.map_kernel(k.saxpy, dg.Out(np.float32, like=xg), np.float32(2.0), xg, yg,
                          name=unique("saxpy")))

    def baseline():
        return wait_persisted(
            da.map_blocks(numba_chunk, xg, yg, dtype=np.float32, name=unique("numba")))

    def cupy():
        return wait_persisted(
            da.map_blocks(cupy_chunk, xg, yg, dtype=np.float32, name=unique("cupy")))

    def noop():
        return wait_persisted(
            da.map_blocks(noop_chunk, xg, yg, dtype=np.float32, name=unique("noop")))

    def placed(chunk, name):
        # Restricted to GPU workers by the placement plugin, as map_kernel's tasks are:
        # what the restriction costs in the scheduler, apart from daskgpu's own.
        def run():
            return wait_persisted(
                da.map_blocks(chunk, xg, yg, dtype=np.float32, name=unique(name)))
        return run

    noop_gpu, alloc_gpu = placed(placed_noop_chunk, "noop-gpu"), placed(placed_alloc_chunk,
                                                                          "alloc-gpu")
    runs = {"ours": ours, "numba": baseline, "cupy": cupy, "noop": noop,
            "noop_gpu": noop_gpu, "alloc_gpu": alloc_gpu}
    for run in runs.values():
        run()  # warm: compiled, linked, and the workers' first task behind them
    per_chunk = {name: [] for name in runs}
    for _ in range(3):  # interleaved, so drift on the machine hits every variant alike
        for name, run in runs.items():
            per_chunk[name] += [t / nchunks for t in timed(run, repeat=1)]
    dg_t, nb_t, noop_t = per_chunk["ours"], per_chunk["numba"], per_chunk["noop"]
    launch_only = client.submit(device_chunk_seconds, chunk_bytes, pure=False).result()
    # Untimed runs under the task stream: the time inside each task, apart from
    # Dask's around it, against the same work outside Dask and other task bodies.
    inside = {name: float(np.mean(task_seconds(client, runs[name])))
              for name in ("ours", "cupy", "alloc_gpu")}
    what = f"map_kernel per chunk, {nchunks} CuPy chunks of {chunk_bytes >> 20} MiB"
    return [
        ratio(what, dg_t, nb_t, "ms", "da.map_blocks + Numba kernel per chunk", goal=1.0,
              scale=1e3),
        ratio("  of which: allocate + launch on one CuPy chunk, no Dask", [launch_only[0]],
              [launch_only[1]], "ms", "the same with a Numba dispatcher", scale=1e3),
        ratio("  against CuPy's RawKernel per chunk (CUDA C)", dg_t, per_chunk["cupy"], "ms",
              "da.map_blocks calling a cp.RawKernel, as RAPIDS users write it", scale=1e3),
        # How much of the per-chunk time is Dask's scheduling, not daskgpu's.
        ratio("  Dask's floor: a no-op map_blocks on the same chunks", dg_t, noop_t, "ms",
              "da.map_blocks of a no-op returning its first chunk", scale=1e3),
        ratio("  the floor placed on GPU workers as map_kernel's tasks are", dg_t,
              per_chunk["noop_gpu"], "ms",
              "the no-op map_blocks restricted by daskgpu's placement plugin",
              goal=1.1, scale=1e3),
        # The same floor for a task that makes a new chunk, as any output does.
        ratio("  the placed floor with a new output chunk per task", dg_t,
              per_chunk["alloc_gpu"], "ms",
              "the placed map_blocks of np.empty_like of its first chunk", scale=1e3),
        # Where the per-chunk time is spent: inside the task (Dask's task stream,
        # mean of one run) or around it. Far above 1, the same work takes longer
        # inside a worker's task than in a plain loop.
        ratio("  time inside each task, by Dask's task stream", [inside["ours"]],
              [launch_only[0]], "ms", "the same allocation + launch outside Dask (above)",
              scale=1e3),
        ratio("  the same against a RawKernel task's", [inside["ours"]], [inside["cupy"]],
              "ms", "time inside each task of the RawKernel map_blocks", scale=1e3),
        ratio("  the same against the placed floor's task", [inside["ours"]],
              [inside["alloc_gpu"]], "ms", "time inside each np.empty_like task", scale=1e3),
    ]


def device_chunk_seconds(chunk_bytes: int, repeat: int = 20) -> tuple:
    """Per-chunk seconds of output allocation + launch on CuPy arrays: daskgpu, Numba."""
    import cupy as cp

    from daskgpu._cli.bench import kernels as k

    x = cp.ones(chunk_bytes // 4, cp.float32)
    launch = k.saxpy.ptx_kernel().forall(x.size)

    def ours():
        launch(cp.zeros_like(x), np.float32(2.0), x, x)

    def numba():
        k.numba_saxpy[(x.size + 255) // 256, 256](cp.empty_like(x), np.float32(2.0), x, x)

    out = []
    for fn in (ours, numba):
        fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        cp.cuda.Device().synchronize()
        out.append((time.perf_counter() - t0) / repeat)
    return tuple(out)
