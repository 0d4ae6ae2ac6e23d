"""What map_kernel does once per call and once per task: kept small, and bounded."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._bounded import BoundedCache
from daskgpu._dask import chunk_task, mapping


@dg.jit
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


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
    assert isinstance(mapping.gpu_clusters, BoundedCache)
    seen = BoundedCache(2, "scheduler addresses with GPU workers")
    for address in ("tcp://a:1", "tcp://b:1"):
        seen.put(address, True)
    assert "tcp://a:1" in seen and "tcp://c:1" not in seen
    seen.put("tcp://c:1", True)
    assert "tcp://c:1" in seen and "tcp://a:1" not in seen


def test_a_gpu_cluster_is_asked_for_its_workers_once():
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    with dask.config.set({"daskgpu.simulate": True}), LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
            resources={"GPU": 1}) as cluster, Client(cluster) as client:
        x = da.arange(8, chunks=4, dtype=np.float32)
        mapping.gpu_clusters.clear()
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
        assert client.scheduler.address in mapping.gpu_clusters
        asked = []
        client.scheduler_info = lambda *a, **k: asked.append(1)  # must not be needed now
        w = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(3), x, x)
        assert not asked
        for r in (z, w):
            assert r.__dask_graph__().layers[r.name].annotations == {"resources": {"GPU": 1}}
        np.testing.assert_array_equal(w.compute(), 4 * np.arange(8, dtype=np.float32))
    mapping.gpu_clusters.clear()


def test_the_out_placeholder_has_the_chunks_and_no_tasks():
    x = da.ones((6, 4), chunks=(4, 3))
    p = mapping.placeholder(dg.Out(np.float32, like=x))
    assert p.chunks == x.chunks and len(dict(p.__dask_graph__())) == 0
