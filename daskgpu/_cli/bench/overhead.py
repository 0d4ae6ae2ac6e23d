"""The sections ``launch`` and ``submit``: what one call costs on top of the work.

``launch`` times the host's share of a warm launch on device arrays, against
a Numba dispatcher and against ``cuLaunchKernel`` itself; ``submit`` a Dask
task round trip that launches, against one that does not.
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
