"""The sections ``launch``, ``chain-graphs`` and ``submit``: what one call costs on top
of the work.

``launch`` times the host's share of a warm launch on device arrays, against
a Numba dispatcher and against ``cuLaunchKernel`` itself; ``chain-graphs`` a
long fused chain on small host chunks replayed from one captured CUDA graph,
against the same tasks launching kernel by kernel; ``submit`` a Dask task
round trip that launches, against one that does not.
"""

from __future__ import annotations

import time

import numpy as np

from daskgpu._cli.bench.common import BenchCluster, ratio, timed


def _sync():
    from cuda.bindings import driver

    driver.cuCtxSynchronize()


def bench_launch(n: int = 20000, size: int = 1024) -> list:
    """Warm host time per launch on device arrays: daskgpu vs a Numba dispatcher."""
    import cupy as cp

    from daskgpu._cli.bench import kernels as k

    x = cp.ones(size, cp.float32)
    out = cp.empty_like(x)
    blocks = (size + 255) // 256
    dg_launch = k.add[blocks, 256]
    nb_launch = k.numba_add[blocks, 256]

    def per_launch(fn):
        for _ in range(100):
            fn(out, x, x)
        _sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(out, x, x)
        _sync()
        return (time.perf_counter() - t0) / n

    floor_launch = _prepacked_launch(k.add, blocks, out, x, x)
    dg = [per_launch(dg_launch) for _ in range(3)]
    nb = [per_launch(nb_launch) for _ in range(3)]
    floor = [per_launch(floor_launch) for _ in range(3)]
    metered = [_metered(per_launch, dg_launch) for _ in range(3)]
    assert float(out[0]) == 2.0
    what = f"warm host overhead per launch ({size} elements, device arrays)"
    return [
        ratio(what, dg, nb, "us", "numba dispatcher launch", goal=0.3, scale=1e6),
        ratio(what, dg, floor, "us", "cuLaunchKernel with a parameter buffer packed once",
              goal=2.0, scale=1e6),
        ratio("  the same with GPU time reported to Dask's fine performance metrics",
              metered, floor, "us", "cuLaunchKernel with a parameter buffer packed once",
              goal=1.5, scale=1e6),
    ]


def _metered(per_launch, launch) -> float:
    """``per_launch(launch)`` while a worker's recorder (the Dask plugin's) is installed."""
    from daskgpu._dask.workers.gpu_time import digest_gpu_time
    from daskgpu._runtime import metrics

    metrics.add_recorder(digest_gpu_time)
    try:
        return per_launch(launch)
    finally:
        metrics.remove_recorder(digest_gpu_time)


def _prepacked_launch(kernel, blocks, *arrays):
    """The floor from Python: ``cuLaunchKernel`` of the same linked kernel, its
    parameters packed once, on the arrays of the first call."""
    from cuda.bindings import driver

    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.linked_kernel import linked

    image = kernel.images[0]
    linked_kernel = linked(image, device.current())
    values = []
    for a in arrays:
        ptr = a.__cuda_array_interface__["data"][0]
        values += (0, 0, a.size, a.dtype.itemsize, ptr, *a.shape, *a.strides)
    params = linked_kernel.layout.pack(values)
    function, stream = linked_kernel.function, driver.CUstream(0)

    def launch(*_):
        driver.cuLaunchKernel(function, blocks, 1, 1, 256, 1, 1, 0, stream, params, 0)

    return launch


def bench_submit(cluster: BenchCluster, n: int = 200, size: int = 1024) -> dict:
    """Per-task round trip of ``client.submit(launch, ...)`` vs a plain Dask task."""
    from daskgpu._cli.bench import kernels as k

    client = cluster.client
    x = np.ones(size, np.float32)
    launch = k.add.forall(size)

    def plain(out, a, b):
        np.add(a, b, out=out)
        return out

    def loop(fn):
        for _ in range(n):
            client.submit(fn, np.empty_like(x), x, x, pure=False).result()

    loop(launch), loop(plain)  # warm: imports, link
    dg = [t / n for t in timed(lambda: loop(launch))]
    base = [t / n for t in timed(lambda: loop(plain))]
    return ratio(f"client.submit round trip per task ({size} float32)", dg, base, "ms",
                 "plain Dask task moving the same arrays", goal=1.2, scale=1e3)


def bench_chain_graphs(chunks: int = 2000, chunk_elements: int = 256, launches: int = 8,
                       repeat: int = 3) -> list:
    """A chain of ``launches`` fused ``map_kernel``s on small host chunks: the fused tasks
    replayed from one captured CUDA graph, against the same tasks launching kernel by
    kernel (``daskgpu.chain-graphs`` 0); per chunk, in this process, without Dask.

    Each of ``chunks`` chunks of ``chunk_elements`` float32 goes through ``saxpy``
    ``launches`` times (``z = 2 z + y``). Both ways run the very tasks a
    ``map_kernel`` graph holds, on the same chunks, and must give equal results.
    Without a GPU (or with ``daskgpu.simulate`` on) it says so in one line and
    gives no row.
    """
    import dask

    from daskgpu._runtime import backends
    from daskgpu._runtime.gpu.chains.graphs import chain_graphs

    devices = backends.GPU.devices()
    if backends.current().simulated or not devices.names:
        reason = "daskgpu.simulate is on" if devices.names else devices.reason or "no GPU"
        print(f"chain-graphs: skipped, it needs a GPU ({reason})", flush=True)
        return []
    rng = np.random.default_rng(0)
    n = chunks * chunk_elements
    xn, yn = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    tasks = chain_tasks(xn, yn, chunk_elements, launches)

    def run(least):
        with dask.config.set({"daskgpu.chain-graphs": least}):
            return [launch(*values) for launch, values in tasks]

    before = chain_graphs.captures
    apart, graphed = run(0), run(launches)  # warm: links; the graph is captured
    captured = chain_graphs.captures - before
    for one, other in zip(apart, graphed):
        np.testing.assert_array_equal(one, other)
    want = xn[:chunk_elements].astype(np.float64)
    for _ in range(launches):
        want = 2 * want + yn[:chunk_elements]
    np.testing.assert_allclose(graphed[0], want, rtol=1e-5)
    separate, graph = [], []
    for _ in range(repeat):  # side by side, in turns
        separate += timed(lambda: run(0), 1)
        graph += timed(lambda: run(launches), 1)
    return [ratio(f"{launches}-kernel fused chain, {chunks} chunks of {chunk_elements} "
                  f"float32 ({captured} graph captured)", graph, separate, "us",
                  "the same tasks launching kernel by kernel (daskgpu.chain-graphs 0)",
                  goal=0.5, scale=1e6 / chunks)]


def chain_tasks(xn, yn, chunk_elements: int, launches: int) -> list:
    """``(fused launch, its values and place)`` of each task of a chain of ``launches``
    saxpy maps over ``xn`` and ``yn`` in chunks of ``chunk_elements``: what the graph's
    tasks run, their chunks looked up here."""
    import dask.array as da
    from dask._task_spec import DataNode, TaskRef

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    x, y = da.from_array(xn, chunks=chunk_elements), da.from_array(yn, chunks=chunk_elements)
    z = x
    for _ in range(launches):
        # One launch per chunk: what a graph replays is measured on the chunks as given.
        z = dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(2.0), z, y,
                          group=False)
    graph = dict(z.__dask_graph__())
    arrays = {x.name: xn, y.name: yn}
    chunks = {}  # one object per key, as a worker holds it: every launch reads y's chunk

    def value(arg):
        if isinstance(arg, DataNode):
            return arg.value
        if isinstance(arg, TaskRef):
            name, *index = arg.key if isinstance(arg.key, tuple) else (arg.key,)
            if name in arrays:  # a chunk of an input
                start = index[0] * chunk_elements
                return chunks.setdefault(arg.key, arrays[name][start:start + chunk_elements])
            return value(graph[arg.key])  # the launch, a key of its own in a large graph
        return arg

    tasks = []
    for i in range(z.npartitions):
        task = graph[(z.name, i)]
        launch, *values = (value(a) for a in task.args)
        tasks.append((launch, tuple(values)))
    return tasks
