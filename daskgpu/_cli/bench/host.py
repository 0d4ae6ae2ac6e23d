"""The sections over host (numpy) chunks: ``map-host``, ``chain`` and ``host-copies``.

``map-host`` and ``chain`` map kernels over host chunks on the run's cluster,
against ``da.map_blocks`` + Numba and against what the pinned copies of
those bytes take; ``host-copies`` times, in this process, what one host chunk
costs on the host side.
"""

from __future__ import annotations

import time

import numpy as np

from daskgpu._cli.bench.common import (
    BenchCluster,
    host_inputs,
    noop_chunk,
    numba_chunk,
    placed_noop_chunk,
    ratio,
    timed,
    unique,
    wait_persisted,
)


def host_copy_counters() -> np.ndarray:
    """On a worker: seconds its copy threads have spent copying, per thread, and
    the page-locked output buffers it has made."""
    from daskgpu._runtime.gpu.host_staging import pinned_outputs, stager

    pipeline = stager()
    return np.array([pipeline.busy_seconds / pipeline.threads, pinned_outputs().made])


def pinned_copy_seconds(nbytes_in: int, nbytes_out: int) -> float:
    """Seconds the pinned copy limit allows for these bytes, measured on this GPU."""
    from cuda.bindings import driver

    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.driver import check

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


def staging_copy_seconds(nbytes: int) -> float:
    """On a worker: seconds its copy threads take to copy ``nbytes`` of pageable memory
    into page-locked memory, as the pipeline stages pageable inputs, measured here.

    Together with :func:`pinned_copy_seconds` it gives the practical limit of a map
    over pageable chunks: each input byte is copied by the CPU before its DMA.
    """
    from concurrent.futures import ThreadPoolExecutor

    from daskgpu import _config
    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.copy_pipeline import PinnedSlot

    device.current()
    threads = int(_config.get("copy-threads"))
    size = 256 << 20
    src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    pinned = PinnedSlot(size)
    step = -(-size // threads)
    try:
        with ThreadPoolExecutor(threads) as pool:
            def copy():
                list(pool.map(lambda o: np.copyto(pinned.array[o:o + step], src[o:o + step]),
                              range(0, size, step)))
            copy()  # warm: first touch of both buffers, the pool's threads
            seconds = min(timed(copy, 5))
    finally:
        pinned.free()
    return nbytes * seconds / size


def launches_without_dask(x_name: str, y_name: str, repeat: int = 3, dask_worker=None) -> tuple:
    """On a worker: the map's launches on this worker's chunks of ``x_name`` and ``y_name``,
    without Dask's tasks.

    Each pair of chunks gets the launch a ``map_kernel`` task makes (saxpy into
    a fresh output), as many at once as the worker has threads. Returns the
    best of ``repeat`` runs in seconds and the number of launches in one.
    Against the map's own time, it leaves Dask's share: starting the graph and
    the time between a thread's tasks.
    """
    from concurrent.futures import ThreadPoolExecutor

    from daskgpu._cli.bench import kernels as k
    from daskgpu._image.array_info import Zeroed

    def chunks(name):
        return {key[1:]: v for key, v in dask_worker.data.items()
                if isinstance(key, tuple) and key[0] == name}

    xs, ys = chunks(x_name), chunks(y_name)
    pairs = [(xs[i], ys[i]) for i in sorted(xs) if i in ys]
    if not pairs:
        return 0.0, 0
    two = np.float32(2.0)

    def launch(pair):
        x, y = pair
        out = Zeroed(np.empty_like(x))
        k.saxpy.forall(x.size)(out, two, x, y)
        return out.array

    with ThreadPoolExecutor(dask_worker.state.nthreads) as pool:
        first = launch(pairs[0])  # warm, and checked
        np.testing.assert_allclose(first, 2 * pairs[0][0] + pairs[0][1], rtol=1e-6)
        seconds = min(timed(lambda: list(pool.map(launch, pairs)), repeat))
    return seconds, len(pairs)


def bench_map_host(cluster: BenchCluster, size_bytes: int = 1 << 30,
                   chunk_bytes: int = 64 << 20) -> list:
    """``map_kernel`` on host-resident chunks vs ``map_blocks`` + Numba and the pinned limit."""
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    client = cluster.client
    x, y = host_inputs(size_bytes, chunk_bytes)

    def ours():
        out = dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(2.0), x, y,
                            name=unique("saxpy"))
        return wait_persisted(out)

    def baseline():
        return wait_persisted(
            da.map_blocks(numba_chunk, x, y, dtype=np.float32, name=unique("numba")))

    def floor():
        return wait_persisted(
            da.map_blocks(placed_noop_chunk, x, y, dtype=np.float32, name=unique("noop")))

    ours(), baseline(), floor()  # warm: links, Numba compiles once per worker
    before = client.run(host_copy_counters)
    dg_t = timed(ours)
    after = client.run(host_copy_counters)
    busy, made = np.array([after[w] - before[w] for w in after]).T
    nb_t = timed(baseline)
    floor_t = timed(floor, 5)
    check = ours()[:1000].compute()
    np.testing.assert_allclose(check, 2 * x[:1000].compute() + y[:1000].compute(), rtol=1e-6)
    limit = client.submit(pinned_copy_seconds, 2 * size_bytes, size_bytes, pure=False).result()
    staging = client.submit(staging_copy_seconds, 2 * size_bytes, pure=False).result()
    direct = client.run(launches_without_dask, x.name, y.name)  # each worker its chunks, at once
    what = f"map_kernel saxpy, 3 x {size_bytes >> 20} MiB host chunks of {chunk_bytes >> 20} MiB"
    chunks = len(dg_t) * x.npartitions
    practical = max(limit, staging)
    return [
        ratio(what, dg_t, nb_t, "s", "da.map_blocks + Numba kernel per chunk"),
        ratio(what, dg_t, [limit], "s", "pinned H2D+D2H copy limit of these bytes",
              goal=round(1 / 0.6, 2)),
        # Pageable inputs are copied by the CPU before their DMA: the practical limit
        # is the slower of the two, each measured here.
        ratio(what, dg_t, [practical], "s",
              "practical limit: the larger of that DMA and the copy threads' staging copy "
              "of the inputs", goal=round(1 / 0.9, 2)),
        # What scheduling these tasks costs with no work in them, against the same
        # limit: the map cannot come nearer the limit than this share.
        ratio("  Dask's floor: a no-op map_blocks on the same chunks, placed as ours",
              floor_t, [practical], "s", "the practical limit above"),
        # The same launches without Dask's tasks: the remainder is Dask's share
        # (starting the graph, the time between a thread's tasks).
        ratio("  the same launches on the workers' chunks, without Dask's tasks", dg_t,
              [max(seconds for seconds, _ in direct.values())], "s",
              "each worker launching on its chunks with as many threads"),
        # Near 1, host copies bound the map; well below, the pipeline leaves
        # the copy threads idle.
        ratio("  copy threads' busy time, per thread, during those runs", [max(busy)],
              [sum(dg_t)], "s", "the runs' wall time"),
        # Near 0, output chunks reuse page-locked buffers freed by earlier runs.
        ratio("  page-locked output buffers made during those runs", [sum(made)], [chunks],
              "", "output chunks written"),
    ]


def bench_chain(cluster: BenchCluster, size_bytes: int = 1 << 30,
                chunk_bytes: int = 64 << 20) -> list:
    """Two map_kernels in a chain over host chunks, against the single map and Numba's chain.

    Also the single map on inputs that are already page-locked: the outputs of
    an earlier map_kernel, which go to the GPU by DMA without the copy threads.
    """
    import dask
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    client = cluster.client
    x, y = host_inputs(size_bytes, chunk_bytes)
    two = np.float32(2.0)

    def saxpy(a, b, name="saxpy"):
        return dg.map_kernel(k.saxpy, dg.Out(np.float32, like=a), two, a, b, name=unique(name))

    def single():
        return wait_persisted(saxpy(x, y))

    def chain():
        return wait_persisted(saxpy(saxpy(x, y), y))

    def unfused_chain():
        with dask.config.set({"daskgpu.fuse-chains": False}):
            return wait_persisted(saxpy(saxpy(x, y), y))

    def numba_chain():
        first = da.map_blocks(numba_chunk, x, y, dtype=np.float32, name=unique("numba"))
        return wait_persisted(
            da.map_blocks(numba_chunk, first, y, dtype=np.float32, name=unique("numba")))

    single(), chain(), unfused_chain(), numba_chain()  # warm
    one_t, chain_t, nb_t = timed(single), timed(chain), timed(numba_chain)
    unfused_t = timed(unfused_chain)
    got = chain()[:1000].compute()
    x0, y0 = x[:1000].compute(), y[:1000].compute()
    np.testing.assert_allclose(got, 2 * (2 * x0 + y0) + y0, rtol=1e-6)

    # Page-locked inputs: persisted map_kernel outputs equal to x and y.
    zeros = da.zeros_like(x)
    xp = wait_persisted(dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(1),
                                      x, zeros, name=unique("copy")))
    yp = wait_persisted(dg.map_kernel(k.saxpy, dg.Out(np.float32, like=y), np.float32(1),
                                      y, zeros, name=unique("copy")))
    locked = client.run(_page_locked_chunks, xp.name, yp.name)

    def pinned_inputs():
        return wait_persisted(saxpy(xp, yp))

    def noop():
        return wait_persisted(
            da.map_blocks(noop_chunk, xp, yp, dtype=np.float32, name=unique("noop")))

    pinned_inputs(), noop()
    before = client.run(host_copy_counters)
    locked_t = timed(pinned_inputs)
    after = client.run(host_copy_counters)
    busy = max(after[w][0] - before[w][0] for w in after)
    noop_t = timed(noop)
    limit = client.submit(pinned_copy_seconds, 2 * size_bytes, size_bytes, pure=False).result()
    what = f"2 chained map_kernels, 3 x {size_bytes >> 20} MiB host, {chunk_bytes >> 20} MiB chunks"
    locked_chunks, all_chunks = np.sum(list(locked.values()), axis=0)
    return [
        ratio(what, chain_t, one_t, "s", "the single map_kernel", goal=1.25),
        ratio(what, chain_t, nb_t, "s", "the same chain of da.map_blocks + Numba"),
        ratio("  the same chain unfused (daskgpu.fuse-chains false)", unfused_t, one_t, "s",
              "the single map_kernel"),
        ratio("map_kernel saxpy on page-locked inputs (earlier map_kernel outputs)",
              locked_t, [limit], "s", "pinned H2D+D2H copy limit of these bytes",
              goal=round(1 / 0.85, 2)),
        # What the scheduling alone costs on those chunks, against the same limit.
        ratio("  Dask's floor: a no-op map_blocks on those chunks", noop_t, [limit], "s",
              "pinned H2D+D2H copy limit of these bytes"),
        # Near 0: page-locked inputs went by DMA, not through the copy threads.
        ratio("  copy threads' busy time, per thread, during those runs", [busy],
              [sum(locked_t)], "s", "the runs' wall time"),
        ratio("  input chunks that are page-locked", [locked_chunks], [all_chunks], "",
              "input chunks"),
    ]


def _page_locked_chunks(*names, dask_worker=None) -> tuple:
    """On a worker: how many of its chunks of arrays ``names`` are page-locked, of all."""
    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.pinned_arrays import is_page_locked

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
    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.copy_pipeline import PinnedSlot
    from daskgpu._runtime.gpu.driver import check
    from daskgpu._runtime.gpu.pinned_arrays import PageLockedBuffer

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
        return timed(fn, repeat)

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
            ratio(f"copying a {chunk_bytes >> 20} MiB chunk into pinned memory, "
                  f"{threads} threads", to_pinned, best(dma), "ms",
                  "the DMA of that pinned chunk to the GPU", scale=1e3),
            ratio(f"writing a {chunk_bytes >> 20} MiB output into fresh pages, {threads} threads",
                  best(lambda: parallel_copy(np.empty_like(src))),
                  best(lambda: parallel_copy(reused)), "ms",
                  "the same into pages written before", scale=1e3),
            ratio(f"page-locking a {chunk_bytes >> 20} MiB chunk in place and unlocking it",
                  best(lock_in_place), to_pinned, "ms",
                  "copying it into pinned memory (as daskgpu does)", scale=1e3),
            ratio(f"making a page-locked {chunk_bytes >> 20} MiB output buffer and freeing it",
                  best(lambda: PageLockedBuffer(chunk_bytes).free()), best(host_alloc), "ms",
                  "cuMemHostAlloc and cuMemFreeHost", scale=1e3),
        ]
    finally:
        pool.shutdown()
        driver.cuMemFree(dev)
        pinned.free()
    return rows
