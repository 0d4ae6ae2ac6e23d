"""The section ``scale``: what ``map_kernel`` costs per chunk as the chunks grow in number.

A ``map_kernel`` task carries its own chunk's place and, beyond a few chunks,
reads the launch (the kernel's PTX and parameters) from one key of the graph,
so its bytes and the scheduler's work per task should not grow with the
number of chunks. This section checks that against
``da.map_blocks(np.add, x, x)`` over the same chunks: the bytes of every task
of the optimized graph, pickled as the scheduler pickles a task for a worker,
and the client's time to build, optimize and pickle it, both per chunk; on the
run's cluster, also the time of ``client.compute`` per chunk. The graph rows
need neither a GPU nor CuPy, and :func:`graph_cost` is what
``tests/dask/test_mapping_costs.py`` measures with.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from daskgpu._cli.bench.common import BenchCluster, ratio, unique, wait_persisted

#: Elements (float32) of each chunk: small, so that what is measured is the tasks.
CHUNK = 4

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


def ones(chunks: int):
    """A float32 dask array of ones in ``chunks`` chunks of :data:`CHUNK` elements."""
    import dask.array as da

    return da.ones(chunks * CHUNK, chunks=CHUNK, dtype=np.float32)


def saxpy(x, name=None):
    """``2 x + x`` by ``map_kernel`` and the bench's saxpy kernel: daskgpu's graph."""
    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    return dg.map_kernel(k.saxpy, dg.Out(np.float32, like=x), np.float32(2.0), x, x, name=name)


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


def bench_scale(cluster: BenchCluster | None = None, chunk_counts=(100, 10_000, 100_000),
                compute_chunks: int | None = 10_000, repeat: int = 3) -> list:
    """Bytes and client time per chunk of ``map_kernel``'s graph vs ``map_blocks``'.

    For each count of ``chunk_counts``, two rows: the bytes of all tasks of the
    optimized graph per chunk, and the time to build, optimize and pickle it
    per chunk (the best of ``repeat``). With a ``cluster``, one more: the time
    of ``client.compute`` to its result per chunk, at ``compute_chunks`` chunks
    already persisted (on a GPU cluster, daskgpu's tasks run on the GPUs).
    Without one, or with ``compute_chunks`` None, nothing starts a cluster.
    """
    graph_cost(saxpy, ones(10))  # warm: the first map_kernel call plans the kernel's image
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
    if cluster is not None and compute_chunks:
        rows.append(_compute_row(cluster, compute_chunks, repeat))
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
