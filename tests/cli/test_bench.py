"""``daskgpu bench`` pieces that run without a GPU: sections, the kernels it makes, what travels."""

import pickle
import sys

import dask
import numpy as np
from distributed.protocol import pickle as dask_pickle
from numba import cuda

import daskgpu as dg
from daskgpu._cli import bench as _bench

ADD_SIG = "void(float32[::1], float32[::1], float32[::1])"


def test_sections_run_first_task_after_cold_and_keep_the_rest():
    names = list(_bench.SECTIONS)
    assert names[:2] == ["cold", "first-task"]
    assert {"launch", "submit", "map-host", "map-device", "chain", "compute",
            "scaling"} <= set(names)


def test_each_first_task_kernel_is_new_code():
    # A distinct constant per kernel: distinct PTX, so no cache of linked images can serve it.
    a, b = (dg.jit(ADD_SIG)(_bench._add_constant(c)) for c in (7.0, 8.0))
    assert a.images[0].hash != b.images[0].hash
    assert a.images[0].ptx[0][1] != b.images[0].ptx[0][1]


def test_numba_baseline_travels_by_value_without_compiled_code():
    dispatcher = cuda.jit(_bench._add_constant(9.0))
    back = dask_pickle.loads(dask_pickle.dumps(dispatcher))
    assert back is not dispatcher and back.py_func.__globals__["C"] == 9.0
    assert not back.overloads  # compiles on the worker


def test_first_task_run_launches_on_the_worker_arrays(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", np)  # the task allocates with CuPy
    with dask.config.set({"daskgpu.simulate": True}):
        kernel = dg.jit(ADD_SIG)(_bench._add_constant(5.0))
        shipped = pickle.loads(pickle.dumps(kernel))
        assert _bench._first_task_run(shipped, 64) == 7.0


def test_noop_chunk_travels_by_reference_and_returns_its_first_chunk():
    assert pickle.loads(pickle.dumps(_bench._noop_chunk)) is _bench._noop_chunk
    x = np.arange(3)
    assert _bench._noop_chunk(x, np.ones(3)) is x


def test_the_bench_cluster_page_locks_what_the_chain_section_holds(monkeypatch):
    # Two persisted 1 GiB outputs and a third map's: with the 2 GiB default the third
    # map's outputs would go through the copy threads, and the page-locked-input row
    # would measure them instead of the inputs.
    monkeypatch.setattr(_bench._Cluster, "client", None)
    monkeypatch.setattr(_bench._Cluster, "array_bytes", 1 << 30)
    with dask.config.set({"daskgpu.simulate": True}):
        client = _bench._Cluster.get()
        try:
            seen = client.run(lambda: dg._config.get("pinned-output-bytes"))
        finally:
            client.cluster.close()
            client.close()
    assert set(seen.values()) == {4 << 30}
