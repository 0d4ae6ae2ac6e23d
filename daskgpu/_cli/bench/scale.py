"""The section ``scale``: what ``map_kernel`` costs per chunk as the chunks grow in number.

A ``map_kernel`` task carries its own chunk's place and, beyond a few chunks,
reads the launch (the kernel's PTX and parameters) from one key of the graph,
so its bytes and the scheduler's work per task should not grow with the
number of chunks. This section checks that against
``da.map_blocks(np.add, x, x)`` over the same chunks: the bytes of every task
of the optimized graph, pickled as the scheduler pickles a task for a worker,
and the client's time to build, optimize and pickle it, both per chunk; at
:data:`MEMORY_CHUNKS` chunks, the memory and the time it takes to build the
graph and materialize and optimize it (:func:`graph_memory`,
:func:`graph_seconds`); on the run's cluster, also the time of
``client.compute`` per chunk. The graph rows need neither a GPU nor CuPy, and
:func:`graph_cost` and :func:`graph_memory` are what
``tests/dask/map_kernel/test_mapping_costs.py`` measures with.

The sections ``small-chunks`` and ``batch`` time many small chunks end to end,
grouped into launches sized for the GPU, against one task a chunk.

Materializing and optimizing is the work of whichever process turns the
collection into tasks: the client under dask's local schedulers
(``.compute()`` without a distributed Client), the scheduler under
``distributed``, whose client sends the graph unmaterialized.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import time
import tracemalloc

import numpy as np

from daskgpu._cli.bench.common import BenchCluster, ratio, unique, wait_persisted

#: Elements (float32) of each chunk: small, so that what is measured is the tasks.
CHUNK = 4

#: Chunks of the rows of memory and build time: what issue #38 measured.
MEMORY_CHUNKS = 20_000

#: What the rows compare against.
BASELINE = f"da.map_blocks(np.add, x, x) on the same {CHUNK}-element chunks"


@dataclasses.dataclass(frozen=True)
class GraphCost:
    """What one array's optimized graph costs on the client, in total.

    Attributes
    ----------
    chunks : int
        Chunks of the array.
    tasks : int
        Tasks of its optimized graph, inputs and the launch key (where there is one)
        included.
    nbytes : int
        Bytes of all those tasks, each pickled on its own.
    seconds : float
        Seconds to build the array, materialize and optimize its graph and
        pickle every task.

    Examples
    --------
    >>> GraphCost(chunks=100, tasks=201, nbytes=300_000, seconds=0.02).bytes_per_chunk
    3000.0
    """

    chunks: int
    tasks: int
    nbytes: int
    seconds: float

    @property
    def bytes_per_chunk(self) -> float:
        return self.nbytes / self.chunks

    @property
    def seconds_per_chunk(self) -> float:
        return self.seconds / self.chunks


@dataclasses.dataclass(frozen=True)
class GraphMemory:
    """The Python memory that building one array's optimized graph takes, in bytes.

    Counted by :mod:`tracemalloc` from just before the array is built (its
    input already is) to when its graph is materialized and optimized, the
    optimized graph still held: every block Python or NumPy allocated, at its
    size asked, not what the allocators keep around it (free lists,
    fragmentation), so it is less than the process's resident memory grows
    by.

    Attributes
    ----------
    chunks : int
        Chunks of the array.
    peak : int
        The most bytes allocated at once on the way: what the process must have.
    held : int
        Bytes still allocated at the end: the array and its optimized graph.

    Examples
    --------
    >>> GraphMemory(chunks=100, peak=2 << 20, held=1 << 20).peak_mib
    2.0
    """

    chunks: int
    peak: int
    held: int

    @property
    def peak_mib(self) -> float:
        return self.peak / (1 << 20)

    @property
    def held_mib(self) -> float:
        return self.held / (1 << 20)


def ones(chunks: int):
    """A float32 dask array of ones in ``chunks`` chunks of :data:`CHUNK` elements."""
    import dask.array as da

    return da.ones(chunks * CHUNK, chunks=CHUNK, dtype=np.float32)


def saxpy(x, name=None, group=False):
    """``2 x + x`` by ``map_kernel`` and the bench's saxpy kernel: daskgpu's graph, one
    launch per chunk (what a task costs is measured here), or grouped with ``group``."""
    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    return dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(2.0), x, x, name=name,
                         group=group)


def add(x, name=None):
    """``x + x`` by ``da.map_blocks(np.add)``: the baseline's graph."""
    import dask.array as da

    return da.map_blocks(np.add, x, x, name=name, dtype=x.dtype)


def optimized_tasks(arr) -> dict:
    """The tasks of ``arr``'s graph, materialized and optimized as ``compute`` does, by key."""
    return dict(arr.__dask_optimize__(arr.__dask_graph__(), arr.__dask_keys__()))


def pickled(task) -> bytes:
    """``task`` pickled as the scheduler pickles a task's ``run_spec`` for a worker."""
    from distributed.protocol.pickle import dumps

    return dumps(task)


def graph_cost(build, x) -> GraphCost:
    """What ``build(x)``'s graph costs: built, optimized and every task pickled, timed.

    Examples
    --------
    >>> cost = graph_cost(add, ones(10))
    >>> cost.chunks, cost.tasks  # 10 of ones, 10 of np.add
    (10, 20)
    """
    t0 = time.perf_counter()
    tasks = optimized_tasks(build(x))
    nbytes = sum(len(pickled(task)) for task in tasks.values())
    seconds = time.perf_counter() - t0
    return GraphCost(x.numblocks[0], len(tasks), nbytes, seconds)


def graph_memory(build, x) -> GraphMemory:
    """What building ``build(x)``'s graph, materialized and optimized, takes of memory.

    See :class:`GraphMemory` for what is counted. Garbage of earlier work is
    collected first, so that its release does not fall inside the count.

    Examples
    --------
    >>> memory = graph_memory(add, ones(10))
    >>> memory.chunks, memory.peak >= memory.held > 0
    (10, True)
    """
    gc.collect()
    tracemalloc.start()
    try:
        arr = build(x)
        tasks = optimized_tasks(arr)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del arr, tasks
    return GraphMemory(x.numblocks[0], peak, held)


def graph_seconds(build, x) -> float:
    """Seconds to build ``build(x)`` and materialize and optimize its graph, untraced.

    Examples
    --------
    >>> graph_seconds(add, ones(10)) > 0
    True
    """
    gc.collect()  # earlier garbage is not this graph's to collect
    t0 = time.perf_counter()
    optimized_tasks(build(x))
    return time.perf_counter() - t0


def bench_scale(cluster: BenchCluster | None = None, chunk_counts=(100, 10_000, 100_000),
                memory_chunks: int | None = MEMORY_CHUNKS, compute_chunks: int | None = 10_000,
                repeat: int = 3) -> list:
    """Bytes, memory and client time of ``map_kernel``'s graph vs ``map_blocks``'.

    For each count of ``chunk_counts``, two rows: the bytes of all tasks of the
    optimized graph per chunk, and the time to build, optimize and pickle it
    per chunk (the best of ``repeat``). At ``memory_chunks`` chunks, three
    more (goal 1.5 each): the peak memory of building, materializing and
    optimizing the graph and the memory still held at the end (both of one
    :func:`graph_memory`: tracing is slow, and the count barely varies), and
    the time of the same, untraced (the best of ``repeat``), each on an input
    of its own. With a ``cluster``, one more: the time of ``client.compute``
    to its result per chunk, at ``compute_chunks`` chunks already persisted
    (on a GPU cluster, daskgpu's tasks run on the GPUs).
    Without one, or with ``compute_chunks`` None, nothing starts a cluster.
    Each comparison alternates daskgpu and the baseline, so drift hits both alike.
    """
    # Warm: the first map_kernel call plans the kernel's image, and the first of
    # either allocates what later calls reuse, which the memory rows would count.
    graph_cost(saxpy, ones(10))
    graph_cost(add, ones(10))
    rows = []
    for count in chunk_counts:
        x = ones(count)
        ours, base = [], []
        for _ in range(repeat):  # interleaved, so drift hits both alike
            ours.append(graph_cost(saxpy, x))
            base.append(graph_cost(add, x))
        rows.append(ratio(f"graph bytes per chunk, {count:,} chunks (every task pickled)",
                          [c.bytes_per_chunk for c in ours], [c.bytes_per_chunk for c in base],
                          "B", BASELINE, goal=1.25))
        rows.append(ratio(f"build+optimize+pickle per chunk, {count:,} chunks",
                          [c.seconds_per_chunk for c in ours],
                          [c.seconds_per_chunk for c in base], "us", BASELINE, goal=2.0,
                          scale=1e6))
    if memory_chunks:
        rows += _memory_rows(memory_chunks, repeat)
    if cluster is not None and compute_chunks:
        rows.append(_compute_row(cluster, compute_chunks, repeat))
    return rows


def _memory_rows(count: int, repeat: int) -> list:
    # A fresh input each time: its own layer, once materialized, stays cached on
    # it, and would spare whichever graph came second the work of the first.
    ours = graph_memory(saxpy, ones(count))
    base = graph_memory(add, ones(count))
    mib = 1 / (1 << 20)
    rows = [ratio(f"graph memory, {count:,} chunks (peak: build+optimize)", [ours.peak],
                  [base.peak], "MiB", BASELINE, goal=1.5, scale=mib),
            ratio(f"graph memory, {count:,} chunks (held: optimized graph)", [ours.held],
                  [base.held], "MiB", BASELINE, goal=1.5, scale=mib)]
    ours, base = [], []
    for _ in range(repeat):
        ours.append(graph_seconds(saxpy, ones(count)))
        base.append(graph_seconds(add, ones(count)))
    rows.append(ratio(f"graph build+optimize, {count:,} chunks", ours, base, "s", BASELINE,
                      goal=1.5))
    return rows


def _compute_row(cluster: BenchCluster, count: int, repeat: int) -> dict:
    # client.compute to the result per chunk, on inputs already on the workers.
    client = cluster.start()  # first: the input persists on its client, the default one
    x = wait_persisted(ones(count))

    def per_chunk(build, prefix):
        t0 = time.perf_counter()
        client.compute(build(x, name=unique(prefix))).result()
        return (time.perf_counter() - t0) / count

    # Warm (imports, links), and checked: 2 x + x, and x + x.
    for build, value in ((saxpy, 3), (add, 2)):
        result = client.compute(build(x, name=unique("scale-check"))).result()
        assert result.shape == (count * CHUNK,) and (result == value).all(), build.__name__
    ours, base = [], []
    for _ in range(repeat):
        ours.append(per_chunk(saxpy, "scale"))
        base.append(per_chunk(add, "scale-add"))
    return ratio(f"client.compute per chunk, {count:,} chunks of {CHUNK} float32", ours, base,
                 "us", BASELINE, goal=1.5, scale=1e6)


#: Elements (float32) of each chunk of the small-chunks section: 1 KiB, a chunk far
#: smaller than a launch should be.
SMALL_CHUNK = 256


def bench_small_chunks(cluster: BenchCluster, counts=(10_000, 100_000), measured: int = 10_000,
                       repeat: int = 2) -> list:
    """``map_kernel`` over many small chunks end to end, against ``da.map_blocks``.

    An array of ``count`` chunks of :data:`SMALL_CHUNK` float32 (read by
    ``da.from_array`` from host memory) mapped by the bench's saxpy, its result
    gathered, with launches grouped as by default
    (``daskgpu.launch-bytes``), against ``da.map_blocks`` calling the same
    Numba kernel on each chunk of the same array on the same cluster (goal
    0.1). ``da.map_blocks`` is measured at ``measured`` chunks and, beyond,
    extrapolated from there per chunk, as the row says; the per-chunk row's
    goal is 50 us.
    """
    import dask.array as da

    from daskgpu._cli.bench.common import numba_chunk

    client = cluster.start()
    base_per_chunk = None
    rows = []
    for count in counts:
        xn = np.arange(count * SMALL_CHUNK, dtype=np.float32)

        def ours_once(xn=xn):
            x = da.from_array(xn, chunks=SMALL_CHUNK)
            t0 = time.perf_counter()
            result = client.compute(saxpy(x, name=unique("small"), group=None)).result()
            seconds = time.perf_counter() - t0
            assert np.array_equal(result, 3 * xn), "map_kernel over small chunks"
            return seconds

        def base_once(xn=xn):
            x = da.from_array(xn, chunks=SMALL_CHUNK)
            t0 = time.perf_counter()
            result = client.compute(da.map_blocks(
                numba_chunk, x, x, dtype=np.float32, meta=np.empty((0,), np.float32),
                name=unique("small-base"))).result()
            seconds = time.perf_counter() - t0
            assert np.allclose(result, 3 * xn), "map_blocks over small chunks"
            return seconds

        ours = [ours_once() for _ in range(repeat)]
        if count <= measured:
            base = [base_once() for _ in range(repeat)]
            base_per_chunk = min(base) / count
            label = "da.map_blocks + Numba kernel per chunk, same cluster and array"
        else:
            base = [base_per_chunk * count] if base_per_chunk else [float("nan")]
            label = (f"da.map_blocks + Numba kernel per chunk, extrapolated from "
                     f"{measured:,} chunks")
        rows.append(ratio(f"map over {count:,} chunks of {SMALL_CHUNK} float32, end to end",
                          ours, base, "s", label, goal=0.1))
        if count > measured:
            rows.append(ratio(f"map over {count:,} chunks of {SMALL_CHUNK} float32, per chunk",
                              [min(ours) / count], [50e-6], "us", "50 us a chunk (the goal)",
                              goal=1.0, scale=1e6))
    return rows


#: Bytes of each stored chunk of the batch section: a common zarr chunk, far smaller
#: than a launch should be.
BATCH_CHUNK_BYTES = 64 << 10

#: Chunks written to the batch section's store a slice at a time: building it needs
#: little memory.
BATCH_WRITE_CHUNKS = 512


def bench_batch(cluster: BenchCluster, count: int = 100_000, measured: int = 10_000,
                chunk_bytes: int = BATCH_CHUNK_BYTES, repeat: int = 1, directory=None) -> list:
    """``daskgpu batch`` over a zarr store of ``count`` chunks of ``chunk_bytes``, grouped
    (the default), against one task a chunk (``group=False``), same cluster and store.

    Both run the bench's one-step ``compute`` kernel, each into an output of its own,
    end to end (planning, reads, launches, writes and the ledger). One task a chunk
    is measured over the first ``measured`` chunks (``max_chunks``) and, for a larger
    store, scaled to all of them, as the row says. The goal is 0.2. The store and the
    outputs are written under ``directory`` (default: a new temporary folder), which is
    removed afterwards. Where that disk has too little room for them, the section
    says so in one line and gives no row; otherwise it says first where it writes
    and how much.
    """
    from dask.utils import format_bytes

    from daskgpu._cli.bench.kernels import compute
    from daskgpu._dask.batch import run_batch

    size = f"{chunk_bytes >> 10} KiB" if chunk_bytes % 1024 == 0 else f"{chunk_bytes} B"
    parent = directory or tempfile.gettempdir()
    # At most the store and one output at a time: each run's output is removed after it.
    need, free = 2 * count * chunk_bytes, shutil.disk_usage(parent).free
    if need > free:
        print(f"batch: skipped, it writes up to {format_bytes(need)} under {parent} and "
              f"{format_bytes(free)} is free there; point TMPDIR at a larger disk", flush=True)
        return []
    print(f"batch: a zarr store of {count:,} chunks of {size} and its outputs, up to "
          f"{format_bytes(need)}, under {parent}; every chunk written is synced, so the "
          "disk sets the pace", flush=True)
    client = cluster.start()
    per_chunk = max(1, chunk_bytes // 4)  # float32
    folder = tempfile.mkdtemp(prefix="daskgpu-bench-batch-", dir=directory)
    try:
        store = _batch_store(os.path.join(folder, "x.zarr"), count, per_chunk)

        def run(name, group, max_chunks=None):
            out = os.path.join(folder, name)
            t0 = time.perf_counter()
            report = run_batch(compute, [store], [(out, np.float32)], scalars=[np.int32(1)],
                               order="out,in,scalar", client=client, progress=False,
                               resume=False, group=group, max_chunks=max_chunks)
            seconds = time.perf_counter() - t0
            done = count if max_chunks is None else min(count, max_chunks)
            assert len(report.computed) == done and not report.failed, report.summary()
            _check_batch(store, out, per_chunk, done)
            shutil.rmtree(out)
            return seconds

        ours = [run("grouped.zarr", None) for _ in range(repeat)]
        base = [run("apart.zarr", False, max_chunks=min(count, measured))
                for _ in range(repeat)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    label = "daskgpu batch one task a chunk (group=False), same cluster and store"
    if count > measured:
        base = [b * count / measured for b in base]
        label += f", measured over {measured:,} chunks and scaled to {count:,}"
    return [ratio(f"batch over {count:,} zarr chunks of {size}, grouped", ours, base, "s",
                  label, goal=0.2)]


def _batch_store(path, count, per_chunk) -> str:
    """A zarr array of ``count`` chunks of ``per_chunk`` float32; its path."""
    import zarr

    z = zarr.open_array(path, mode="w", shape=(count * per_chunk,), chunks=(per_chunk,),
                        dtype=np.float32)
    step = BATCH_WRITE_CHUNKS * per_chunk
    for start in range(0, count * per_chunk, step):
        stop = min(start + step, count * per_chunk)
        z[start:stop] = _batch_values(start, stop)
    return path


def _batch_values(start, stop):
    """The store's values from ``start`` to ``stop``: small, so that sin and cos stay exact."""
    return (np.arange(start, stop) % 1000).astype(np.float32) / np.float32(1000)


def _check_batch(store, out, per_chunk, done) -> None:
    """The first, a middle and the last chunk written hold the kernel's one step."""
    import zarr

    z = zarr.open_array(out, mode="r")
    for chunk in sorted({0, done // 2, done - 1}):
        start, stop = chunk * per_chunk, (chunk + 1) * per_chunk
        x = _batch_values(start, stop)
        expected = np.sin(x) * np.float32(0.5) + np.cos(x) * np.float32(0.5)
        assert np.allclose(z[start:stop], expected, atol=1e-6), f"batch chunk {chunk}"
