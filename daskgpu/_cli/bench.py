"""``daskgpu bench``: daskgpu against what a user would write by hand, side by side.

Every figure is measured in the same run as its baseline, on the same data, and
reported as a ratio; absolute times mean something only on the GPU machine.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np

_COLD_DASKGPU = """
import pickle, sys, time
t0 = time.perf_counter()
import numpy as np
launch = pickle.loads(open(sys.argv[1], "rb").read())
x = np.ones(1 << 20, np.float32)
out = launch(np.empty_like(x), x, x)
assert out[0] == 2.0
print(time.perf_counter() - t0)
"""

_COLD_NUMBA = """
import pickle, sys, time
t0 = time.perf_counter()
import numpy as np
kernel = pickle.loads(open(sys.argv[1], "rb").read())
x = np.ones(1 << 20, np.float32)
out = np.empty_like(x)
kernel[(x.size + 255) // 256, 256](out, x, x)
assert out[0] == 2.0
print(time.perf_counter() - t0)
"""


def _fresh_process(script: str, blob: bytes, env=None) -> float:
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        f.write(blob)
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, f.name], capture_output=True, text=True,
            env=env, check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench subprocess failed:\n{out.stderr}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)


def bench_cold(repeat: int = 3) -> dict:
    """Fresh process to first result: a pickled daskgpu launch vs a pickled Numba dispatcher."""
    import cloudpickle

    from daskgpu._cli import bench_kernels as k

    launch_blob = pickle.dumps(k.add.forall(1 << 20))
    numba_blob = cloudpickle.dumps(k.numba_add)
    env = dict(os.environ)
    # numba is importable in the daskgpu child, but must not be imported there.
    dg = [_fresh_process(_COLD_DASKGPU, launch_blob, env) for _ in range(repeat)]
    nb = [_fresh_process(_COLD_NUMBA, numba_blob, env) for _ in range(repeat)]
    return _ratio("cold start, fresh process to first result", dg, nb, "s",
                  "numba pickled dispatcher", goal=0.3)


_ADD_CONSTANT = """
def add_c(out, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i] + C
"""


def _add_constant(c: float):
    """A new ``out = x + y + c`` kernel function; Numba freezes the global ``C`` into the code."""
    from numba import cuda

    # Globals, not a closure: the simulator swaps ``cuda`` in globals only.
    namespace = {"__name__": __name__, "cuda": cuda, "C": c}
    exec(_ADD_CONSTANT, namespace)
    return namespace["add_c"]


def _first_task_run(kernel, size: int) -> float:
    """On a worker: launch ``kernel`` on new CuPy arrays of ``size`` float32; ``out[0]``."""
    import cupy as cp

    x = cp.ones(size, cp.float32)
    out = cp.empty_like(x)
    kernel[(size + 255) // 256, 256](out, x, x)
    return float(out[0])  # copies back, so the launch has finished


def _prepare_worker(size: int) -> None:
    """On a started worker: what a user's first task finds ready on both sides.

    The worker plugin has imported daskgpu's runtime and made the GPU current;
    here Numba's CUDA target and CuPy get the same, so that the first timed
    task measures linking (daskgpu) against compiling (Numba) alone.
    """
    import cupy as cp
    from numba import cuda

    cuda.current_context()
    cp.empty_like(cp.ones(size, cp.float32))
    cp.cuda.Device().synchronize()


def bench_first_task(repeat: int = 3, size: int = 1024) -> list:
    """First task of a kernel on a started worker: daskgpu links PTX, Numba compiles."""
    import itertools
    import random

    from numba import cuda

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k

    # Every kernel bakes in its own constant, so its PTX, image hash and
    # dispatcher are new: no module cache, disk cache (cache-dir, were it on)
    # or Numba dispatcher can serve it. The random start keeps a disk cache
    # left by an earlier run from matching too.
    constants = itertools.count(random.randrange(1 << 20))

    def ours():
        c = float(next(constants))  # integers below 2**24 add exactly in float32
        return dg.jit(k.ADD_SIG)(_add_constant(c)), c  # compiled here, untimed

    def numba():
        c = float(next(constants))
        return cuda.jit(_add_constant(c)), c  # compiles on the worker, on first call

    def first_task(client, kernel, c):
        t0 = time.perf_counter()
        value = client.submit(_first_task_run, kernel, size, pure=False).result(timeout=300)
        seconds = time.perf_counter() - t0
        assert value == 2.0 + c, (value, c)
        return seconds

    def on_new_cluster(kernel, c):
        # A new cluster, not client.restart(): its workers are as fresh, and
        # its cost stays out of the timing either way.
        from distributed import Client

        from daskgpu._dask.cluster import LocalGPUCluster

        with LocalGPUCluster(threads_per_worker=_Cluster.threads_per_worker,
                             dashboard_address=None) as cluster, \
                Client(cluster, set_as_default=False) as fresh:
            fresh.run(_prepare_worker, size)
            return first_task(fresh, kernel, c)

    # On a started worker: its first link against Numba's first compile.
    cold_dg, cold_nb = [], []
    for _ in range(repeat):
        cold_dg.append(on_new_cluster(*ours()))
        cold_nb.append(on_new_cluster(*numba()))
    # On workers that have linked and compiled before: each further new kernel.
    client = _Cluster.get()
    client.run(_prepare_worker, size)
    client.run(_first_task_run, ours()[0], size)
    client.run(_first_task_run, numba()[0], size)
    dg_t, nb_t = [], []
    for _ in range(repeat):  # interleaved, so drift on the worker hits both alike
        dg_t.append(first_task(client, *ours()))
        nb_t.append(first_task(client, *numba()))
    return [
        _ratio(f"first task on a started worker ({size} float32)", cold_dg, cold_nb, "ms",
               "the first task of a Numba dispatcher there (compiles)", goal=0.05, scale=1e3),
        _ratio("  then: first task of each further new kernel", dg_t, nb_t, "ms",
               "a new Numba dispatcher, compiled in that task", scale=1e3),
    ]


def _sync():
    from cuda.bindings import driver

    driver.cuCtxSynchronize()


def bench_launch(n: int = 20000, size: int = 1024) -> dict:
    """Warm host time per launch on device arrays: daskgpu vs a Numba dispatcher."""
    import cupy as cp

    from daskgpu._cli import bench_kernels as k

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
    assert float(out[0]) == 2.0
    what = f"warm host overhead per launch ({size} elements, device arrays)"
    return [
        _ratio(what, dg, nb, "us", "numba dispatcher launch", goal=0.3, scale=1e6),
        _ratio(what, dg, floor, "us", "cuLaunchKernel with a parameter buffer packed once",
               goal=2.0, scale=1e6),
    ]


def _prepacked_launch(kernel, blocks, *arrays):
    """The floor from Python: ``cuLaunchKernel`` of the same linked kernel, its
    parameters packed once, on the arrays of the first call."""
    from cuda.bindings import driver

    from daskgpu._runtime import device
    from daskgpu._runtime.launcher import linked

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


class _Cluster:
    """One LocalGPUCluster and Client shared by the Dask sections of a run."""

    client = None
    threads_per_worker = 2  # --threads-per-worker
    array_bytes = 1 << 30  # --size

    @classmethod
    def get(cls):
        if cls.client is None:
            import dask.config
            from distributed import Client

            from daskgpu import _config
            from daskgpu._dask.cluster import LocalGPUCluster

            # The chain section holds two mapped arrays' outputs while it maps a
            # third: page-locked memory for all three keeps its outputs off the
            # copy threads, as a user holding that much would configure it.
            locked = max(int(_config.get("pinned-output-bytes")), 4 * cls.array_bytes)
            with dask.config.set({"daskgpu.pinned-output-bytes": locked}):
                cls.client = Client(LocalGPUCluster(threads_per_worker=cls.threads_per_worker,
                                                    dashboard_address=None))
        return cls.client


def _wait_persisted(arr):
    from distributed import wait

    arr = arr.persist()
    wait(arr)
    return arr


def _timed(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_submit(n: int = 200, size: int = 1024) -> dict:
    """Per-task round trip of ``client.submit(launch, ...)`` vs a plain Dask task."""
    from daskgpu._cli import bench_kernels as k

    client = _Cluster.get()
    x = np.ones(size, np.float32)
    launch = k.add.forall(size)

    def plain(out, a, b):
        np.add(a, b, out=out)
        return out

    def loop(fn):
        for _ in range(n):
            client.submit(fn, np.empty_like(x), x, x, pure=False).result()

    loop(launch), loop(plain)  # warm: imports, link
    dg = [t / n for t in _timed(lambda: loop(launch))]
    base = [t / n for t in _timed(lambda: loop(plain))]
    return _ratio(f"client.submit round trip per task ({size} float32)", dg, base, "ms",
                  "plain Dask task moving the same arrays", goal=1.2, scale=1e3)


def _numba_chunk(x, y):
    # What a user writes by hand: map_blocks calling a Numba kernel per chunk.
    from daskgpu._cli import bench_kernels as k

    out = np.empty_like(x)  # CuPy chunks get a CuPy array (NEP 18)
    k.numba_saxpy[(x.size + 255) // 256, 256](out, np.float32(2.0), x, y)
    return out


def _noop_chunk(x, *rest):
    # Dask's own per-chunk cost: a task that does nothing but hand back its chunk.
    return x


def _alloc_chunk(x, *rest):
    # Dask's per-chunk cost when each task makes a new chunk, as every kernel
    # with an output must: an uninitialised array like x (CuPy for CuPy chunks).
    return np.empty_like(x)


def _unique(prefix: str) -> str:
    # Each timed run gets fresh keys: equal keys would be served from the
    # results of the previous run still held by the cluster.
    import uuid

    return f"{prefix}-{uuid.uuid4().hex}"


def host_copy_counters() -> np.ndarray:
    """On a worker: seconds its copy threads have spent copying, per thread, and
    the page-locked output buffers it has made."""
    from daskgpu._runtime.launcher import pinned_outputs, stager

    pipeline = stager()
    return np.array([pipeline.busy_seconds / pipeline.threads, pinned_outputs().made])


def _host_inputs(size_bytes: int, chunk_bytes: int):
    import dask.array as da

    n, c = size_bytes // 4, chunk_bytes // 4
    rng = da.random.default_rng(0)
    x = _wait_persisted(rng.random(n, dtype=np.float32, chunks=c))
    y = _wait_persisted(rng.random(n, dtype=np.float32, chunks=c))
    return x, y


def pinned_copy_seconds(nbytes_in: int, nbytes_out: int) -> float:
    """Seconds the pinned copy limit allows for these bytes, measured on this GPU."""
    from cuda.bindings import driver

    from daskgpu._runtime import device
    from daskgpu._runtime._cuda import check

    device.current()
    size = 256 << 20
    host = check(driver.cuMemHostAlloc(size, 0), "cuMemHostAlloc")
    dev = check(driver.cuMemAlloc(size), "cuMemAlloc")
    try:
        def rate(copy):
            copy()
            check(driver.cuCtxSynchronize(), "sync")
            t0 = time.perf_counter()
            for _ in range(8):
                copy()
            check(driver.cuCtxSynchronize(), "sync")
            return 8 * size / (time.perf_counter() - t0)

        h2d = rate(lambda: driver.cuMemcpyHtoDAsync(dev, host, size, 0))
        d2h = rate(lambda: driver.cuMemcpyDtoHAsync(host, dev, size, 0))
        return nbytes_in / h2d + nbytes_out / d2h
    finally:
        driver.cuMemFree(dev)
        driver.cuMemFreeHost(host)


def bench_map_host(size_bytes: int = 1 << 30, chunk_bytes: int = 64 << 20) -> list:
    """``map_kernel`` on host-resident chunks vs ``map_blocks`` + Numba and the pinned limit."""
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k

    client = _Cluster.get()
    x, y = _host_inputs(size_bytes, chunk_bytes)

    def ours():
        out = dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(2.0), x, y,
                            name=_unique("saxpy"))
        return _wait_persisted(out)

    def baseline():
        return _wait_persisted(
            da.map_blocks(_numba_chunk, x, y, dtype=np.float32, name=_unique("numba")))

    ours(), baseline()  # warm: links, Numba compiles once per worker
    before = client.run(host_copy_counters)
    dg_t = _timed(ours)
    after = client.run(host_copy_counters)
    busy, made = np.array([after[w] - before[w] for w in after]).T
    nb_t = _timed(baseline)
    check = ours()[:1000].compute()
    np.testing.assert_allclose(check, 2 * x[:1000].compute() + y[:1000].compute(), rtol=1e-6)
    limit = client.submit(pinned_copy_seconds, 2 * size_bytes, size_bytes, pure=False).result()
    what = f"map_kernel saxpy, 3 x {size_bytes >> 20} MiB host chunks of {chunk_bytes >> 20} MiB"
    chunks = len(dg_t) * x.npartitions
    return [
        _ratio(what, dg_t, nb_t, "s", "da.map_blocks + Numba kernel per chunk"),
        _ratio(what, dg_t, [limit], "s", "pinned H2D+D2H copy limit of these bytes",
               goal=1 / 0.8),
        # Near 1, host copies bound the map; well below, the pipeline leaves
        # the copy threads idle.
        _ratio("  copy threads' busy time, per thread, during those runs", [max(busy)],
               [sum(dg_t)], "s", "the runs' wall time"),
        # Near 0, output chunks reuse page-locked buffers freed by earlier runs.
        _ratio("  page-locked output buffers made during those runs", [sum(made)], [chunks],
               "", "output chunks written"),
    ]


def bench_chain(size_bytes: int = 1 << 30, chunk_bytes: int = 64 << 20) -> list:
    """Two map_kernels in a chain over host chunks, against the single map and Numba's chain.

    Also the single map on inputs that are already page-locked: the outputs of
    an earlier map_kernel, which go to the GPU by DMA without the copy threads.
    """
    import dask
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k

    client = _Cluster.get()
    x, y = _host_inputs(size_bytes, chunk_bytes)
    two = np.float32(2.0)

    def saxpy(a, b, name="saxpy"):
        return dg.map_kernel(k.saxpy, dg.Out(np.float32, like=a), two, a, b, name=_unique(name))

    def single():
        return _wait_persisted(saxpy(x, y))

    def chain():
        return _wait_persisted(saxpy(saxpy(x, y), y))

    def unfused_chain():
        with dask.config.set({"daskgpu.fuse-chains": False}):
            return _wait_persisted(saxpy(saxpy(x, y), y))

    def numba_chain():
        first = da.map_blocks(_numba_chunk, x, y, dtype=np.float32, name=_unique("numba"))
        return _wait_persisted(
            da.map_blocks(_numba_chunk, first, y, dtype=np.float32, name=_unique("numba")))

    single(), chain(), unfused_chain(), numba_chain()  # warm
    one_t, chain_t, nb_t = _timed(single), _timed(chain), _timed(numba_chain)
    unfused_t = _timed(unfused_chain)
    got = chain()[:1000].compute()
    x0, y0 = x[:1000].compute(), y[:1000].compute()
    np.testing.assert_allclose(got, 2 * (2 * x0 + y0) + y0, rtol=1e-6)

    # Page-locked inputs: persisted map_kernel outputs equal to x and y.
    zeros = da.zeros_like(x)
    xp = _wait_persisted(dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(1),
                                       x, zeros, name=_unique("copy")))
    yp = _wait_persisted(dg.map_kernel(k.saxpy, dg.Out(np.float32, like=y), np.float32(1),
                                       y, zeros, name=_unique("copy")))
    locked = client.run(_page_locked_chunks, xp.name, yp.name)

    def pinned_inputs():
        return _wait_persisted(saxpy(xp, yp))

    def noop():
        return _wait_persisted(
            da.map_blocks(_noop_chunk, xp, yp, dtype=np.float32, name=_unique("noop")))

    pinned_inputs(), noop()
    before = client.run(host_copy_counters)
    locked_t = _timed(pinned_inputs)
    after = client.run(host_copy_counters)
    busy = max(after[w][0] - before[w][0] for w in after)
    noop_t = _timed(noop)
    limit = client.submit(pinned_copy_seconds, 2 * size_bytes, size_bytes, pure=False).result()
    what = f"2 chained map_kernels, 3 x {size_bytes >> 20} MiB host, {chunk_bytes >> 20} MiB chunks"
    locked_chunks, all_chunks = np.sum(list(locked.values()), axis=0)
    return [
        _ratio(what, chain_t, one_t, "s", "the single map_kernel", goal=1.25),
        _ratio(what, chain_t, nb_t, "s", "the same chain of da.map_blocks + Numba"),
        _ratio("  the same chain unfused (daskgpu.fuse-chains false)", unfused_t, one_t, "s",
               "the single map_kernel"),
        _ratio("map_kernel saxpy on page-locked inputs (earlier map_kernel outputs)",
               locked_t, [limit], "s", "pinned H2D+D2H copy limit of these bytes",
               goal=round(1 / 0.85, 2)),
        # What the scheduling alone costs on those chunks, against the same limit.
        _ratio("  Dask's floor: a no-op map_blocks on those chunks", noop_t, [limit], "s",
               "pinned H2D+D2H copy limit of these bytes"),
        # Near 0: page-locked inputs went by DMA, not through the copy threads.
        _ratio("  copy threads' busy time, per thread, during those runs", [busy],
               [sum(locked_t)], "s", "the runs' wall time"),
        _ratio("  input chunks that are page-locked", [locked_chunks], [all_chunks], "",
               "input chunks"),
    ]


def _page_locked_chunks(*names, dask_worker=None) -> tuple:
    """On a worker: how many of its chunks of arrays ``names`` are page-locked, of all."""
    from daskgpu._runtime import device
    from daskgpu._runtime.pinned_arrays import is_page_locked

    device.current()  # the thread client.run uses may have no context yet
    chunks = [v for k, v in dask_worker.data.items()
              if isinstance(k, tuple) and k[0] in names and isinstance(v, np.ndarray)]
    return sum(bool(is_page_locked(c)) for c in chunks), len(chunks)


def bench_host_copies(chunk_bytes: int = 64 << 20, repeat: int = 5) -> list:
    """What one host chunk costs on the host side, against the DMA the GPU needs for it.

    Pageable numpy chunks are copied into pinned memory by ``daskgpu.copy-threads``
    threads; outputs get page-locked buffers, recycled, instead of fresh pageable
    pages. These rows show how much of map-host's distance to the pinned-copy
    limit is the host's own, and what the recycling saves.
    """
    from concurrent.futures import ThreadPoolExecutor

    from cuda.bindings import driver

    from daskgpu import _config
    from daskgpu._runtime import device
    from daskgpu._runtime._cuda import check
    from daskgpu._runtime.pinned_arrays import PageLockedBuffer
    from daskgpu._runtime.staging import PinnedSlot

    device.current()
    threads = int(_config.get("copy-threads"))
    src = np.random.default_rng(0).integers(0, 255, chunk_bytes, dtype=np.uint8)
    pinned = PinnedSlot(chunk_bytes)
    dev = check(driver.cuMemAlloc(chunk_bytes), "cuMemAlloc")
    pool = ThreadPoolExecutor(threads)
    step = -(-chunk_bytes // threads)

    def parallel_copy(dst):
        list(pool.map(lambda o: np.copyto(dst[o:o + step], src[o:o + step]),
                      range(0, chunk_bytes, step)))

    def best(fn):
        fn()  # warm: first-touch of the buffers, the pool's threads
        return _timed(fn, repeat)

    def dma():
        check(driver.cuMemcpyHtoDAsync(dev, pinned.ptr, chunk_bytes, 0), "cuMemcpyHtoDAsync")
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def lock_in_place():
        check(driver.cuMemHostRegister(src.ctypes.data, chunk_bytes, 0), "cuMemHostRegister")
        check(driver.cuMemHostUnregister(src.ctypes.data), "cuMemHostUnregister")

    def host_alloc():
        driver.cuMemFreeHost(check(driver.cuMemHostAlloc(chunk_bytes, 0), "cuMemHostAlloc"))

    reused = np.empty_like(src)
    try:
        to_pinned = best(lambda: parallel_copy(pinned.array))
        rows = [
            _ratio(f"copying a {chunk_bytes >> 20} MiB chunk into pinned memory, "
                   f"{threads} threads", to_pinned, best(dma), "ms",
                   "the DMA of that pinned chunk to the GPU", scale=1e3),
            _ratio(f"writing a {chunk_bytes >> 20} MiB output into fresh pages, {threads} threads",
                   best(lambda: parallel_copy(np.empty_like(src))),
                   best(lambda: parallel_copy(reused)), "ms",
                   "the same into pages written before", scale=1e3),
            _ratio(f"page-locking a {chunk_bytes >> 20} MiB chunk in place and unlocking it",
                   best(lock_in_place), to_pinned, "ms",
                   "copying it into pinned memory (as daskgpu does)", scale=1e3),
            _ratio(f"making a page-locked {chunk_bytes >> 20} MiB output buffer and freeing it",
                   best(lambda: PageLockedBuffer(chunk_bytes).free()), best(host_alloc), "ms",
                   "cuMemHostAlloc and cuMemFreeHost", scale=1e3),
        ]
    finally:
        pool.shutdown()
        driver.cuMemFree(dev)
        pinned.free()
    return rows


def bench_map_device(size_bytes: int = 1 << 30, chunk_counts=(16, 256)) -> list:
    """``map_kernel`` on CuPy chunks vs ``map_blocks`` + Numba, and a no-op, on the same chunks.

    Run at each number of chunks in ``chunk_counts``: few large chunks show the
    launch's own cost, many small ones the cost per task.
    """
    rows = []
    for count in chunk_counts:
        rows += _map_device_rows(size_bytes, size_bytes // count)
    return rows


def _map_device_rows(size_bytes: int, chunk_bytes: int) -> list:
    import cupy as cp
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k

    _Cluster.get()
    x, y = _host_inputs(size_bytes, chunk_bytes)
    xg = _wait_persisted(x.map_blocks(cp.asarray))
    yg = _wait_persisted(y.map_blocks(cp.asarray))
    nchunks = xg.numblocks[0]

    def ours():
        return _wait_persisted(
            dg.map_kernel(k.saxpy, dg.Out(np.float32, like=xg), np.float32(2.0), xg, yg,
                          name=_unique("saxpy")))

    def baseline():
        return _wait_persisted(
            da.map_blocks(_numba_chunk, xg, yg, dtype=np.float32, name=_unique("numba")))

    def noop():
        return _wait_persisted(
            da.map_blocks(_noop_chunk, xg, yg, dtype=np.float32, name=_unique("noop")))

    def alloc():
        return _wait_persisted(
            da.map_blocks(_alloc_chunk, xg, yg, dtype=np.float32, name=_unique("alloc")))

    ours(), baseline(), noop(), alloc()
    dg_t = [t / nchunks for t in _timed(ours)]
    nb_t = [t / nchunks for t in _timed(baseline)]
    noop_t = [t / nchunks for t in _timed(noop)]
    alloc_t = [t / nchunks for t in _timed(alloc)]
    launch_only = _Cluster.get().submit(device_chunk_seconds, chunk_bytes, pure=False).result()
    what = f"map_kernel per chunk, {nchunks} CuPy chunks of {chunk_bytes >> 20} MiB"
    return [
        _ratio(what, dg_t, nb_t, "ms", "da.map_blocks + Numba kernel per chunk", goal=1.0,
               scale=1e3),
        _ratio("  of which: allocate + launch on one CuPy chunk, no Dask", [launch_only[0]],
               [launch_only[1]], "ms", "the same with a Numba dispatcher", scale=1e3),
        # How much of the per-chunk time is Dask's scheduling, not daskgpu's.
        _ratio("  Dask's floor: a no-op map_blocks on the same chunks", dg_t, noop_t, "ms",
               "da.map_blocks of a no-op returning its first chunk", goal=1.1, scale=1e3),
        # The same floor for a task that makes a new chunk, as any output does.
        _ratio("  the floor with a new output chunk per task", dg_t, alloc_t, "ms",
               "da.map_blocks of np.empty_like of its first chunk", scale=1e3),
    ]


def device_chunk_seconds(chunk_bytes: int, repeat: int = 20) -> tuple:
    """Per-chunk seconds of output allocation + launch on CuPy arrays: daskgpu, Numba."""
    import cupy as cp

    from daskgpu._cli import bench_kernels as k

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


def bench_compute(size_bytes: int = 256 << 20, chunk_bytes: int = 32 << 20, iters: int = 2000) -> dict:
    """A compute-bound kernel over host chunks vs the same kernel on the whole array in one process."""
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k

    _Cluster.get()
    n, c = size_bytes // 4, chunk_bytes // 4
    x = _wait_persisted(da.random.default_rng(1).random(n, dtype=np.float32, chunks=c))

    def ours():
        return _wait_persisted(
            dg.map_kernel(k.compute, dg.Out(np.float32, like=x), x, np.int32(iters),
                          name=_unique("compute")))

    whole = x.compute()

    def one_process():
        out = np.empty_like(whole)
        k.compute.forall(whole.size)(out, whole, np.int32(iters))

    ours(), one_process()
    return _ratio(f"compute-bound kernel ({iters} sin/cos steps), {size_bytes >> 20} MiB host",
                  _timed(ours), _timed(one_process), "s",
                  "the same kernel on the whole array in one process", goal=1.05)


def bench_scaling(size_bytes: int = 512 << 20, chunk_bytes: int = 16 << 20,
                  iters: int = 2000, devices=None) -> list:
    """A compute-bound ``map_kernel`` on 1, 2, ... N GPUs, one cluster each.

    Each row compares the time on n GPUs with the ideal, a nth of the time on
    one; a ratio of at most 1/0.9 is a speed-up of at least 0.9 n.
    """
    import dask.array as da
    from distributed import Client

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k
    from daskgpu._dask.cluster import resolve_devices

    devices = list(devices or resolve_devices(None, simulate=False)[0])
    n, c = size_bytes // 4, chunk_bytes // 4
    rows, one_gpu = [], None
    for count in range(1, len(devices) + 1):
        with dg.LocalGPUCluster(devices=devices[:count], dashboard_address=None) as cluster, \
                Client(cluster):
            x = _wait_persisted(da.random.default_rng(2).random(n, dtype=np.float32, chunks=c))

            def run():
                return _wait_persisted(dg.map_kernel(
                    k.compute, dg.Out(np.float32, like=x), x, np.int32(iters),
                    name=_unique("scaling")))

            run()
            seconds = min(_timed(run))
        one_gpu = one_gpu or seconds
        rows.append(_ratio(
            f"compute-bound map_kernel, {size_bytes >> 20} MiB, on {count} GPU(s)",
            [seconds], [one_gpu / count], "s", f"1/{count} of the time on one GPU",
            goal=round(1 / 0.9, 2)))
    return rows


_NUMBA_STATES = """
import json, sys, time
import numpy as np
from numba import cuda
from numba.cuda.random import create_xoroshiro128p_states, init_xoroshiro128p_states_cpu, xoroshiro128p_dtype
n, seed, start, jumps = map(int, sys.argv[1:5])
init_xoroshiro128p_states_cpu(np.empty(2, xoroshiro128p_dtype), 1, 1)  # compiled before timing
cuda.current_context()
t0 = time.perf_counter()
states = create_xoroshiro128p_states(n, seed, subsequence_start=start)
cuda.synchronize()
seconds = time.perf_counter() - t0
t0 = time.perf_counter()
init_xoroshiro128p_states_cpu(np.empty(1, xoroshiro128p_dtype), seed, jumps)
per_jump = (time.perf_counter() - t0) / jumps
ends = states.copy_to_host()[[0, -1]]
print(json.dumps({"seconds": seconds, "per_jump": per_jump,
                  "ends": [[int(e["s0"]), int(e["s1"])] for e in ends]}))
"""


def _numba_hist_chunk(x):
    # By hand: a Numba kernel per chunk (its arrays copied in and back by Numba).
    from daskgpu._cli import bench_kernels as k

    counts = np.zeros(256, np.int64)
    k.numba_hist256[(x.size + 255) // 256, 256](counts, x, np.float32(0), np.float32(1))
    return counts[None, :]


def states_build_seconds(n: int, seed: int, start: int, builder, repeat: int = 5):
    """On a worker: seconds to build ``n`` random states from ``start`` on its GPU, and the ends."""
    from cuda.bindings import driver

    from daskgpu._runtime import device
    from daskgpu._runtime._cuda import check
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


def bench_reductions(size_bytes: int = 4 << 30, chunk_bytes: int = 64 << 20,
                     states: int = 1 << 24, states_start: int = 1 << 30,
                     numba_start: int = 1 << 24) -> list:
    """A 256-bin histogram and random-state construction, against what users write by hand.

    The histogram of ``size_bytes`` of float32 host chunks: ``map_kernel`` with a
    per-chunk output summed across chunks, against ``da.histogram`` on the
    workers' CPUs and against ``map_blocks`` + a Numba kernel + a hand-written
    sum. Random states: ``states`` of them from global index ``states_start``,
    built on a worker's GPU, against Numba's ``create_xoroshiro128p_states(states,
    seed, subsequence_start)``, which jumps ``subsequence_start`` times on the host,
    one after the other (2**30 of them take minutes). Numba runs, in a process of
    its own meanwhile, at ``numba_start`` (a lower bound of its cost at
    ``states_start``), and its cost at ``states_start`` is also extrapolated
    from its measured time per jump.
    """
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli import bench_kernels as k
    from daskgpu._compiler.random_states import builder
    from daskgpu._image.random_states import host_states

    seed = 2024
    numba_states = subprocess.Popen(
        [sys.executable, "-c", _NUMBA_STATES, str(states), str(seed), str(numba_start),
         str(min(numba_start, 1 << 23) or 1)],
        stdout=subprocess.PIPE, text=True)
    client = _Cluster.get()
    x = _wait_persisted(da.random.default_rng(0).random(size_bytes // 4, dtype=np.float32,
                                                        chunks=chunk_bytes // 4))
    low, high = np.float32(0), np.float32(1)

    def ours():
        return dg.map_kernel(k.hist256, dg.Out(np.int64, per_chunk=256, combine="sum"), x,
                             low, high, name=_unique("hist")).compute()

    def cpu():
        return da.histogram(x, bins=256, range=(0, 1))[0].compute()

    def by_hand():
        per_chunk = da.map_blocks(_numba_hist_chunk, x, dtype=np.int64, new_axis=1,
                                  chunks=((1,) * x.npartitions, (256,)), name=_unique("numba"))
        return per_chunk.sum(axis=0).compute()

    results = [ours(), cpu(), by_hand()]  # warm, and all three must agree
    for r in results[1:]:
        np.testing.assert_array_equal(results[0], r)
    assert results[0].sum() == x.size
    ours_t, cpu_t, hand_t = _timed(ours), _timed(cpu), _timed(by_hand)
    print(f"  histogram: daskgpu {min(ours_t):.3f} s, da.histogram {min(cpu_t):.3f} s, "
          f"map_blocks + Numba {min(hand_t):.3f} s", flush=True)
    del x

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
        _ratio(what, ours_t, cpu_t, "s", "da.histogram on the workers' CPUs"),
        _ratio(what, ours_t, hand_t, "s", "da.map_blocks + Numba kernel + a sum by hand"),
        _ratio(f"{where}, on the worker's GPU", built_t, [numba["seconds"]], "s",
               f"numba create_xoroshiro128p_states(n, seed, subsequence_start=2**"
               f"{numba_start.bit_length() - 1}), measured: a lower bound"),
        _ratio(f"{where}, on the worker's GPU", built_t, [extrapolated], "s",
               f"the same at 2**{states_start.bit_length() - 1}, extrapolated from "
               f"Numba's {numba['per_jump'] * 1e9:.0f} ns per host jump"),
    ]


SECTIONS = {
    "cold": bench_cold,
    "first-task": bench_first_task,
    "launch": bench_launch,
    "submit": bench_submit,
    "map-host": bench_map_host,
    "host-copies": bench_host_copies,
    "map-device": bench_map_device,
    "chain": bench_chain,
    "compute": bench_compute,
    "scaling": bench_scaling,
    "reductions": bench_reductions,
}


def _ratio(what, ours, base, unit, base_name, goal=None, scale=1.0) -> dict:
    a, b = min(ours) * scale, min(base) * scale
    return {
        "what": what,
        "daskgpu": a,
        "baseline": b,
        "baseline_name": base_name,
        "unit": unit,
        "ratio": a / b,
        "goal": goal,
        "samples_daskgpu": [x * scale for x in ours],
        "samples_baseline": [x * scale for x in base],
    }


def _table(rows) -> str:
    lines = [f"{'comparison':<58} {'daskgpu':>10} {'baseline':>10} {'ratio':>7} {'goal':>6}"]
    for r in rows:
        goal = "" if r.get("goal") is None else f"<={r['goal']}"
        lines.append(
            f"{r['what'][:58]:<58} {r['daskgpu']:>9.3g}{r['unit'][:1]} "
            f"{r['baseline']:>9.3g}{r['unit'][:1]} {r['ratio']:>7.3f} {goal:>6}"
        )
        lines.append(f"    baseline: {r['baseline_name']}; unit {r['unit']}")
    return "\n".join(lines)


def section_sizes(name: str, size: int) -> dict:
    """The data sizes of section ``name`` when each mapped host array is ``size`` bytes.

    The map sections use arrays of ``size`` in 64 MiB chunks (smaller for small
    sizes; map-device chooses its own chunk counts); compute and scaling, which
    run many steps per element, a quarter and a half of it. Other sections take
    no size.

    Examples
    --------
    >>> section_sizes("map-host", 1 << 30)
    {'size_bytes': 1073741824, 'chunk_bytes': 67108864}
    >>> section_sizes("compute", 256 << 20)
    {'size_bytes': 67108864, 'chunk_bytes': 8388608}
    >>> section_sizes("map-device", 1 << 30)
    {'size_bytes': 1073741824}
    >>> section_sizes("launch", 1 << 30)
    {}
    """
    share, chunks = {"map-host": (1, 16), "chain": (1, 16), "map-device": (1, None),
                     "compute": (4, 8), "scaling": (2, 32)}.get(name, (None, None))
    if share is None:
        return {}
    size_bytes = size // share
    if chunks is None:
        return {"size_bytes": size_bytes}
    default_chunk = inspect.signature(SECTIONS[name]).parameters["chunk_bytes"].default
    return {"size_bytes": size_bytes,
            "chunk_bytes": min(default_chunk, max(1 << 20, size_bytes // chunks))}


def main(argv=None) -> int:
    from dask.utils import parse_bytes

    from daskgpu._cli.common import Parser  # usage errors exit 2; help without markup

    parser = Parser(prog="daskgpu bench", description=__doc__)
    parser.add_argument("sections", nargs="*", default=list(SECTIONS),
                        help=f"which comparisons to run (default all: {', '.join(SECTIONS)})")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--size", default="1GiB", type=parse_bytes, metavar="BYTES",
                        help="bytes of each mapped host array, e.g. 256MiB (default 1GiB)")
    parser.add_argument("--threads-per-worker", type=int, default=2, metavar="N",
                        help="threads of each LocalGPUCluster worker (default 2)")
    args = parser.parse_args(argv)
    _Cluster.threads_per_worker = args.threads_per_worker
    _Cluster.array_bytes = args.size
    rows = []
    for name in args.sections:
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
        result = SECTIONS[name](**section_sizes(name, args.size))
        result = result if isinstance(result, list) else [result]
        rows += result
        print(_table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    if _Cluster.client is not None:
        _Cluster.client.cluster.close()
        _Cluster.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
