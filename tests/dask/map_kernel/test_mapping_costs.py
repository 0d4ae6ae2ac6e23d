"""What map_kernel does once per call and once per task: kept small, and bounded."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import numpy as np
import pytest
from kit.kernels import saxpy_lazy as saxpy
from layers import EXPRESSIONS, hlg_only, launch_keys

import daskgpu as dg
from daskgpu._bounded import BoundedCache
from daskgpu._dask import cluster_facts
from daskgpu._dask.launch_core.resources import LAUNCH_SHARE
from daskgpu._dask.map_kernel import api as mapping
from daskgpu._dask.map_kernel import chunk_task
from daskgpu._dask.map_kernel.graphs import hlg as graph_hlg


def test_the_launch_cache_is_bounded():
    assert isinstance(chunk_task.launches, BoundedCache)
    cache = BoundedCache(2, "map_kernel launches")
    made = []

    def make(key):
        return lambda: made.append(key) or key

    assert [cache.get(k, make(k)) for k in (1, 2, 1, 3, 1)] == [1, 2, 1, 3, 1]
    assert made == [1, 2, 3, 1]  # 3 filled it: 1, the oldest, went first
    cache.clear()
    assert cache.get(2, make(2)) == 2 and made[-1] == 2


def test_gpu_clusters_remember_only_a_bounded_few():
    assert isinstance(cluster_facts.gpu_clusters, BoundedCache)
    seen = BoundedCache(2, "scheduler addresses with GPU workers")
    for address in ("tcp://a:1", "tcp://b:1"):
        seen.put(address, True)
    assert "tcp://a:1" in seen and "tcp://c:1" not in seen
    seen.put("tcp://c:1", True)
    assert "tcp://c:1" in seen and "tcp://a:1" not in seen


@pytest.mark.slow
def test_a_gpu_cluster_is_asked_for_its_workers_once():
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    with dask.config.set({"daskgpu.simulate": True}), LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
            resources={"GPU": 1}) as cluster, Client(cluster) as client:
        x = da.arange(8, chunks=4, dtype=np.float32)
        cluster_facts.gpu_clusters.clear()
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
        assert client.scheduler.address in cluster_facts.gpu_clusters
        asked = []
        client.scheduler_info = lambda *a, **k: asked.append(1)  # must not be needed now
        w = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(3), x, x)
        assert not asked
        for r in (z, w):
            if not EXPRESSIONS:  # expressions carry no annotations
                assert r.__dask_graph__().layers[r.name].annotations == {
                    "resources": {"GPU": LAUNCH_SHARE}}
        np.testing.assert_array_equal(w.compute(), 4 * np.arange(8, dtype=np.float32))
    cluster_facts.gpu_clusters.clear()


@hlg_only
def test_the_out_placeholder_has_the_chunks_and_no_tasks():
    x = da.ones((6, 4), chunks=(4, 3))
    p = graph_hlg.placeholder(dg.Out(np.float32, like=x))
    assert p.chunks == x.chunks and len(dict(p.__dask_graph__())) == 0


# -- what each task costs as the chunks grow in number -----------------------------
# Measured as `daskgpu bench scale` measures: every task of the optimized graph,
# pickled as the scheduler pickles a task for a worker.

@pytest.fixture(scope="module")
def graph_costs():
    pytest.importorskip("distributed")
    from daskgpu._cli.bench import scale

    scale.graph_cost(scale.saxpy, scale.ones(10))  # the first call plans the kernel's image
    return {(build.__name__, count): scale.graph_cost(build, scale.ones(count))
            for count in (100, 10_000) for build in (scale.saxpy, scale.add)}


@pytest.mark.parametrize("count", [100, 10_000])
def test_a_chunk_costs_at_most_twice_the_bytes_of_map_blocks(graph_costs, count):
    ours, base = graph_costs["saxpy", count], graph_costs["add", count]
    assert ours.tasks == base.tasks + 1  # the launch key
    assert ours.bytes_per_chunk <= 2 * base.bytes_per_chunk, (ours, base)


def test_the_bytes_of_a_chunk_do_not_grow_with_the_chunks(graph_costs):
    few, many = graph_costs["saxpy", 100], graph_costs["saxpy", 10_000]
    assert many.bytes_per_chunk <= 1.25 * few.bytes_per_chunk, (few, many)


def test_ten_thousand_chunks_build_in_a_few_seconds(graph_costs):
    # Built, optimized and every task pickled; generous, for a slow shared machine.
    # Each task carrying all chunks' tables, as it once did, takes minutes.
    assert graph_costs["saxpy", 10_000].seconds < 10, graph_costs["saxpy", 10_000]


def test_a_small_graph_carries_the_launch_in_each_task_a_large_one_reads_one_key():
    # A key of its own costs a round trip through the scheduler before any
    # chunk starts; it pays for itself once the tasks would carry more bytes
    # of the launch than graph_hlg.EMBED_BYTES together.
    from dask._task_spec import DataNode

    from daskgpu._cli.bench import scale

    one = scale.saxpy(scale.ones(1))
    size = len(pickle.dumps(dict(one.__dask_graph__())[(one.name, 0)].args[0].value))
    most = graph_hlg.EMBED_BYTES // size
    for count, embedded in ((1, True), (most, True), (most + 1, False)):
        arr = scale.saxpy(scale.ones(count))
        graph = dict(arr.__dask_graph__())
        first = graph[(arr.name, 0)].args[0]
        assert isinstance(first, DataNode) is embedded, (count, most)
        assert bool(launch_keys(graph)) is not embedded
        if embedded:
            assert isinstance(first.value, chunk_task.ChunkLaunch)


def test_a_launching_task_carries_neither_the_ptx_nor_main():
    pytest.importorskip("distributed")
    from daskgpu._cli.bench import scale
    from daskgpu._dask.launch_core.walk import runs_launch

    arr = scale.saxpy(scale.ones(100))
    tasks = scale.optimized_tasks(arr)
    launching = [scale.pickled(t) for t in tasks.values() if runs_launch(t)]
    assert len(launching) == 100
    for blob in launching:
        assert b".entry" not in blob and b"__main__" not in blob
    # The PTX is there once, in the launch key every task reads.
    (key,) = launch_keys(tasks)
    assert b".entry" in scale.pickled(tasks[key])


# -- what building a large graph costs the process that materializes it ------------
# Issue #38: at 20,000 chunks, at most 1.5 times map_blocks' memory and time
# (`daskgpu bench scale` measures both); here at fewer chunks, memory only:
# Python's allocations do not depend on the machine's load as its time does.

def test_a_large_graph_takes_at_most_one_and_a_half_times_the_memory_of_map_blocks():
    pytest.importorskip("distributed")
    from daskgpu._cli.bench import scale

    scale.graph_cost(scale.saxpy, scale.ones(10))  # the first call plans the kernel's image
    ours = scale.graph_memory(scale.saxpy, scale.ones(2_000))
    base = scale.graph_memory(scale.add, scale.ones(2_000))
    assert ours.peak <= 1.5 * base.peak, (ours, base)
    assert ours.held <= 1.5 * base.held, (ours, base)


def _large_saxpy():
    from daskgpu._cli.bench import scale

    arr = scale.saxpy(scale.ones(1_000))  # over EMBED_BYTES: the launch is a key
    assert f"{arr.name}-launch" in arr.__dask_graph__().layers
    return arr


@hlg_only
def test_the_launch_key_is_no_root_for_fuse_roots_to_fuse_into_the_tasks():
    # fuse_roots would turn the launch layer into a dict of tasks and cull it
    # key by key, to fuse what low-level fusion fuses anyway.
    from dask.blockwise import Blockwise, fuse_roots

    arr = _large_saxpy()
    graph = arr.__dask_graph__()
    assert graph.layers[f"{arr.name}-launch"].annotations == graph_hlg.LAUNCH_KEY_ANNOTATION
    fused = fuse_roots(graph, keys=list(arr.__dask_keys__()))
    assert isinstance(fused.layers[arr.name], Blockwise)
    assert not fused.layers[arr.name].is_materialized()


@hlg_only
def test_the_launch_key_annotation_changes_no_task_of_the_optimized_graph():
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from daskgpu._cli.bench import scale

    arr = _large_saxpy()
    graph, key = arr.__dask_graph__(), f"{arr.name}-launch"
    layers = dict(graph.layers)
    layers[key] = MaterializedLayer(dict(graph.layers[key]))  # unmarked: fuse_roots fuses
    unmarked = HighLevelGraph(layers, graph.dependencies)

    def summary(dsk):
        tasks = arr.__dask_optimize__(dsk, arr.__dask_keys__())
        return {k: (type(t).__name__, sorted(map(str, t.dependencies)),
                    len(scale.pickled(t))) for k, t in dict(tasks).items()}

    assert summary(graph) == summary(unmarked)


def test_a_place_reaches_dask_as_a_data_node_it_need_not_search_for_keys():
    from dask._task_spec import DataNode

    places = mapping.chunk_places(((4, 4, 2),), ((4, 4, 2),), (0,), (False,))
    node = places.get((2,), None)  # as dask asks
    assert isinstance(node, DataNode) and node.value == places[2,] == ((2,), (2,), (8,), None)
