"""The sections where data stays on the GPU: ``map-device`` and ``iterate``.

``map-device`` maps over chunks already on the GPU (CuPy): with no host copies
to hide it, what is left is the cost per chunk: daskgpu's against
``da.map_blocks`` + Numba, and Dask's own floor on the same chunks, and how much
of it is spent inside the tasks rather than around them.

``iterate`` runs a 2-D heat equation for many steps with ``dg.iterate``, whose
tasks keep their chunk on the GPU for a block of steps, against the same kernel
looped on one device array without Dask, a loop of ``map_kernel`` steps, and the
Dask + CuPy ``map_overlap`` loop a Dask user writes today; each a cost per step.
"""

from __future__ import annotations

import math
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


# -- iterate ---------------------------------------------------------------------------

#: The steps the loops of map_kernel and of map_overlap run: enough for a cost per step,
#: since each of their steps costs the same as the last.
LOOP_STEPS = 100


def bench_iterate(cluster: BenchCluster, size_bytes: int = 256 << 20, chunks: int = 16,
                  block_steps=None) -> list:
    """A 2-D heat equation on ``size_bytes`` of float32 (8192 x 8192 by default) in
    ``chunks`` chunks, ``cluster.options.time_steps`` steps: its cost per step with
    ``dg.iterate`` against the other ways to run it.

    The baselines: the same kernel looped on one device array with numba-cuda (no
    Dask: what one GPU can do), a Python loop of ``map_kernel`` steps and a Dask +
    CuPy ``map_overlap`` loop (these two over at most :data:`LOOP_STEPS` steps).
    Every run holds the array's edge fixed (``boundary="none"``) and must give the
    one-device loop's result. Without a GPU (or with ``daskgpu.simulate`` on) it says
    so in one line and gives no row; without CuPy, no CuPy rows.
    """
    from daskgpu._runtime import backends

    devices = backends.GPU.devices()
    if backends.current().simulated or not devices.names:
        reason = "daskgpu.simulate is on" if devices.names else devices.reason or "no GPU"
        print(f"iterate: skipped, it needs a GPU ({reason})", flush=True)
        return []
    steps = cluster.options.time_steps
    n = int(math.isqrt(size_bytes // 4))
    side = max(1, math.isqrt(chunks))
    chunk = -(-n // side)
    u0 = np.zeros((n, n), np.float32)
    u0[n // 3: 2 * n // 3, n // 3: 2 * n // 3] = 100.0
    cluster.start()  # its client is the default one
    alone, want = one_device_seconds(u0, steps)
    loop = min(steps, LOOP_STEPS)
    try:
        import cupy
    except ImportError:
        print("iterate: no CuPy, so no rows for CuPy chunks or map_overlap", flush=True)
        cupy = None
    # Each run starts from its input persisted on the workers and ends when its result
    # is persisted there: gathering it to the client is no part of a step. Two steps
    # first warm what a run's first task pays once (linking, CuPy's own kernels, pools).
    runs = {"iterate": (False, steps, lambda u, n: _iterate(u, n, block_steps)),
            "map_kernel": (False, loop, _map_kernel_loop)}
    if cupy is not None:
        runs["iterate-cupy"] = (True, steps, lambda u, n: _iterate(u, n, block_steps))
        runs["map_overlap"] = (True, loop, _overlap_loop)
    per_step = {}
    for name, (on_device, count, run) in runs.items():
        u = _persisted_input(u0, chunk, on_device)
        run(u, 2)
        t0 = time.perf_counter()
        result = run(u, count)
        if on_device:  # CuPy tasks end once their work is queued: time it to its end
            cluster.client.run(_synchronize_device)
        per_step[name] = [(time.perf_counter() - t0) / count]
        if count == steps:  # the same steps as the one-device loop: the same result
            got = result.compute()
            got = got.get() if on_device else got
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        del result
    anchor = (f"the kernel looped on one device array, numba-cuda, daskgpu's launch shape, "
              f"no Dask ({steps} steps)")
    what = f"iterate, 2-D heat {n}x{n} float32, {side * side} chunks"
    rows = []
    if cupy is not None:  # state on the device, as the anchor's: the headline
        rows += [
            ratio(f"{what} on the GPU (CuPy), per step", per_step["iterate-cupy"], [alone],
                  "ms", anchor, goal=1.25, scale=1e3),
            ratio("  against a Dask + CuPy map_overlap loop", per_step["iterate-cupy"],
                  per_step["map_overlap"], "ms",
                  f"u.map_overlap(cupy step, depth=1) once a step ({loop} steps)",
                  goal=0.1, scale=1e3),
        ]
    # Host chunks cross PCIe and are joined with their halos on the host once a block.
    rows += [
        ratio(f"{what} on the host, per step", per_step["iterate"], [alone], "ms", anchor,
              scale=1e3),
        ratio("  against a loop of map_kernel steps", per_step["iterate"],
              per_step["map_kernel"], "ms",
              f"dg.map_kernel(depth=1) once a step ({loop} steps)", goal=0.1, scale=1e3),
    ]
    return rows


def _synchronize_device() -> None:
    """Wait for the work queued on this worker's GPU (run on each worker)."""
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _persisted_input(u0, chunk: int, on_device: bool):
    import dask.array as da

    u = da.from_array(u0, chunks=chunk)
    if on_device:
        import cupy as cp

        u = u.map_blocks(cp.asarray)
    return wait_persisted(u)


def one_device_seconds(u0, steps: int) -> tuple:
    """Seconds per step of the heat kernel looped on one device array with numba-cuda,
    two buffers taking turns; and the final state.

    It launches in the grid and blocks daskgpu's ``forall`` picks for the whole array
    (:func:`forall_shape`), so that the rows compare what Dask and chunks cost, not two
    launch shapes: on an H100 the common 16 x 16 blocks take 2.5 times as long a step
    for this kernel (its first index, the row, runs along a block's x threads).
    """
    from numba import cuda

    from daskgpu._cli.bench import kernels as k

    grid, block = forall_shape(k.heat, u0.shape)
    a, b = cuda.to_device(u0), cuda.device_array_like(u0)
    k.numba_heat[grid, block](b, a, np.float32(0.2))  # compiled and warm
    a, b = cuda.to_device(u0), cuda.device_array_like(u0)
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        k.numba_heat[grid, block](b, a, np.float32(0.2))
        a, b = b, a
    cuda.synchronize()
    return (time.perf_counter() - t0) / max(steps, 1), a.copy_to_host()


def forall_shape(kernel, shape: tuple) -> tuple:
    """``(griddim, blockdim)`` that daskgpu's ``forall`` over ``shape`` launches ``kernel``
    (a daskgpu kernel with a signature) in, on this thread's GPU."""
    from daskgpu._image.launch_config import LaunchConfig
    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.linked_kernel import linked

    state, image = device.current(), kernel.images[0]
    grid, block = linked(image, state).dims(LaunchConfig(ntasks=tuple(shape)), state,
                                            image.name)
    return tuple(grid[:len(shape)]), tuple(block[:len(shape)])


def _iterate(u, steps: int, block_steps):
    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    return wait_persisted(dg.iterate(k.heat, dg.Out(np.float32, like=u), u, np.float32(0.2),
                                     steps=steps, depth=1, boundary="none",
                                     block_steps=block_steps))


def _map_kernel_loop(u, steps: int):
    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    for step in range(steps):
        u = dg.map_kernel(k.heat, dg.Out(np.float32, like=u), u, np.float32(0.2), depth=1,
                          boundary="none")
        if step % 10 == 9:  # a user's loop keeps its graph short
            u = wait_persisted(u)
    return wait_persisted(u)


def cupy_heat_step(u):
    """The heat step on a CuPy chunk and its halo, as a Dask + CuPy user writes it."""
    out = u.copy()
    out[1:-1, 1:-1] = u[1:-1, 1:-1] + np.float32(0.2) * (
        u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1])
    return out


def _overlap_loop(u, steps: int):
    for step in range(steps):
        u = u.map_overlap(cupy_heat_step, depth=1, boundary="none", dtype=np.float32)
        if step % 10 == 9:  # a user's loop keeps its graph short
            u = wait_persisted(u)
    return wait_persisted(u)
