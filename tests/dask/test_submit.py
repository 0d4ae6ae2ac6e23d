"""Kernels submitted to a LocalGPUCluster: results, several outputs, errors, what travels."""

import io
import pickle

import dask
import numpy as np
import pytest
from distributed import Client
from kit.kernels import saxpy
from numba import cuda

import daskgpu as dg

N = 100


@dg.jit("void(float32[::1], float32[::1], float32[::1])")
def split(plus_one, doubled, x):
    i = cuda.grid(1)
    if i < x.size:
        plus_one[i] = x[i] + 1
        doubled[i] = x[i] * 2


@dg.jit
def unsigned(x):  # lazy: no signature compiled, nothing to ship
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 1


@pytest.fixture(scope="module", params=["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def client(request):
    simulate = request.param == "simulated"
    with dg.LocalGPUCluster(simulate=simulate, dashboard_address=":0") as cluster:
        with Client(cluster) as c:
            yield c


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (np.zeros(N, np.float32), rng.random(N, dtype=np.float32),
            rng.random(N, dtype=np.float32))


def test_submit_returns_the_written_array(client):
    out, x, y = inputs()
    result = client.submit(saxpy.configure(4, 32), out, 2.0, x, y).result()
    assert isinstance(result, np.ndarray)
    np.testing.assert_allclose(result, 2.0 * x + y, rtol=1e-6)
    assert not out.any()  # the worker wrote its own copy


def test_forall_launch(client):
    out, x, y = inputs(1)
    result = client.submit(saxpy.forall(N), out, 3.0, x, y).result()
    np.testing.assert_allclose(result, 3.0 * x + y, rtol=1e-6)


def test_map_over_several_inputs(client):
    cases = [inputs(seed) for seed in range(4)]
    futures = client.map(saxpy[4, 32], [c[0] for c in cases], [0.5] * 4,
                         [c[1] for c in cases], [c[2] for c in cases])
    for (_, x, y), result in zip(cases, client.gather(futures)):
        np.testing.assert_allclose(result, 0.5 * x + y, rtol=1e-6)


def test_several_written_arrays_come_back_as_a_tuple(client):
    _, x, _ = inputs(2)
    result = client.submit(split.forall(N), np.zeros(N, np.float32),
                           np.zeros(N, np.float32), x).result()
    assert isinstance(result, tuple) and len(result) == 2
    np.testing.assert_allclose(result[0], x + 1, rtol=1e-6)
    np.testing.assert_allclose(result[1], x * 2, rtol=1e-6)


def test_kernel_without_signatures_fails_with_one_error_naming_specialize(client):
    # The Numba way, client.submit(kernel[g, b], *args), with a lazy kernel: workers cannot
    # compile, so the task fails with daskgpu's error, not Dask's serialization errors.
    future = client.submit(unsigned.configure(1, 32), np.zeros(8, np.float32))
    with pytest.raises(dg.PicklingError, match=r"unsigned\.specialize\(\*args\)"):
        future.result()
    # What the message advises works.
    x = np.zeros(8, np.float32)
    result = client.submit(unsigned.specialize(x).configure(1, 32), x).result()
    np.testing.assert_array_equal(result, np.ones(8, np.float32))


def test_failing_task_leaves_other_futures_alone(client):
    out, x, y = inputs(3)
    good = client.submit(saxpy.configure(4, 32), out, 2.0, x, y)
    bad = client.submit(saxpy.configure(4, 32), out, 2.0, x.astype(np.float64), y)
    with pytest.raises(TypeError, match="no compiled signature of kernel 'saxpy'") as info:
        bad.result()
    assert "(float32[::1], float32, float32[::1], float32[::1])" in str(info.value)
    np.testing.assert_allclose(good.result(), 2.0 * x + y, rtol=1e-6)
    again = client.submit(saxpy.configure(4, 32), out, 1.0, x, y).result()
    np.testing.assert_allclose(again, x + y, rtol=1e-6)


class _RecordingUnpickler(pickle.Unpickler):
    """Records the module of every global a pickle loads."""

    def __init__(self, data):
        super().__init__(io.BytesIO(data))
        self.modules = set()

    def find_class(self, module, name):
        self.modules.add(module)
        return super().find_class(module, name)


def test_launch_travels_ptx_only_when_not_simulating():
    launch = saxpy.configure(4, 32)
    with dask.config.set({"daskgpu.simulate": False}):
        data = pickle.dumps(launch)
    assert b"py_func" not in data
    assert saxpy.py_func.__code__.co_code not in data
    unpickler = _RecordingUnpickler(data)
    shipped = unpickler.load()
    assert {m.partition(".")[0] for m in unpickler.modules} == {"daskgpu"}, unpickler.modules
    assert isinstance(shipped.kernel, dg.PTXKernel)
    assert all(im.py_func is None for im in shipped.kernel.images)
    assert b".entry" in shipped.kernel.images[0].ptx[0][1].encode()


def test_launch_carries_the_function_while_simulating():
    with dask.config.set({"daskgpu.simulate": True}):
        data = pickle.dumps(saxpy.configure(4, 32))
    assert b"py_func" in data
    shipped = pickle.loads(data)
    assert all(im.py_func is not None for im in shipped.kernel.images)


def test_gpu_workers_never_import_numba(client):
    if client.run(dask.config.get, "daskgpu.simulate") != dict.fromkeys(
        client.scheduler_info()["workers"], False
    ):
        pytest.skip("simulated workers run kernels with numba's simulator")
    out, x, y = inputs(4)
    client.submit(saxpy.configure(4, 32), out, 2.0, x, y).result()
    loaded = client.run(eval, "'numba' in __import__('sys').modules")
    assert not any(loaded.values()), loaded
