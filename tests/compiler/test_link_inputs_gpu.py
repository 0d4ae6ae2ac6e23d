"""Link inputs, cooperative launches and launch shapes on a GPU, through pickled launches."""

import pickle

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg

pytestmark = pytest.mark.gpu


def shipped(kernel):
    return pickle.loads(pickle.dumps(kernel))


def fp16_mul(out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = cuda.fp16.hmul(a[i], b[i]) + a[i] * b[i]


@pytest.mark.parametrize("lto", [False, True])
def test_fp16_kernel_links_its_shims_on_the_worker(lto):
    a = np.linspace(0, 2, 256).astype(np.float16)
    b = np.linspace(1, 3, 256).astype(np.float16)
    k = shipped(dg.jit("void(float16[::1], float16[::1], float16[::1])", lto=lto)(fp16_mul))
    out = k.forall(256)(np.zeros(256, np.float16), a, b)
    want = np.zeros(256, np.float16)
    cuda.jit(fp16_mul).forall(256)(want, a, b)
    np.testing.assert_array_equal(out, want)


def grid_sum(a, out):
    g = cuda.cg.this_grid()
    i = cuda.grid(1)
    a[i] = i
    g.sync()  # every block's writes visible to every other block
    if i == 0:
        s = 0
        for j in range(a.size):
            s += a[j]
        out[0] = s


def test_cooperative_kernel_links_cudadevrt_and_syncs_the_grid():
    k = shipped(dg.jit("void(int64[::1], int64[::1])")(grid_sum))
    a, out = k[64, 128](np.zeros(64 * 128, np.int64), np.zeros(1, np.int64))
    assert out[0] == (64 * 128) * (64 * 128 - 1) // 2


def test_cooperative_grid_too_large_is_refused_with_the_limit():
    k = shipped(dg.jit("void(int64[::1], int64[::1])")(grid_sum))
    with pytest.raises(dg.LaunchConfigError, match="resident at once: this device holds at most"):
        k[1_000_000, 1024](np.zeros(1_000_000 * 1024 // 1024, np.int64), np.zeros(1, np.int64))


def fill3(out):
    i, j, k = cuda.grid(3)
    if i < out.shape[0] and j < out.shape[1] and k < out.shape[2]:
        out[i, j, k] = 1


def test_forall_zero_launches_nothing_and_3d_grids_fit_the_y_limit():
    k = shipped(dg.jit("void(int8[:, :, ::1])")(fill3))
    empty = np.zeros((0, 4, 4), np.int8)
    assert k.forall((0, 4, 4))(empty) is empty
    out = np.zeros((2, 100_000, 64), np.int8)
    assert k.forall(out.shape)(out).all()


def fill(out, v):
    out.fill(v)


def copy_then_read(x, out):
    y = x.copy()  # an allocation on the device: NRT
    out[0] = y[1]


@pytest.mark.parametrize("lto", [False, True])
def test_an_nrt_kernel_links_and_runs_on_the_worker(monkeypatch, lto):
    from numba.cuda import config

    monkeypatch.setattr(config, "CUDA_ENABLE_NRT", True)
    k = shipped(dg.jit("void(float32[::1], float32[::1])", lto=lto)(copy_then_read))
    out = k[1, 1](np.arange(4, dtype=np.float32), np.zeros(1, np.float32))
    assert out[0] == 1.0


def hinted_copy(r, x):
    for i in range(len(r)):
        cuda.stcs(r, i, cuda.ldcg(x, i))


def test_cache_hinted_stores_come_back_from_the_gpu():
    x = np.arange(5, dtype=np.float64)
    r = shipped(dg.jit("void(float64[::1], float64[::1])")(hinted_copy))[1, 1](np.zeros(5), x)
    np.testing.assert_array_equal(r, x)


def test_fill_writes_come_back_from_the_gpu():
    out = shipped(dg.jit("void(float32[::1], float32)")(fill))[4, 32](np.zeros(100, np.float32), 2.5)
    np.testing.assert_array_equal(out, 2.5)


class _Foreign:
    """A device array as another library hands it over: only the interface."""

    def __init__(self, array, stream):
        cai = dict(array.__cuda_array_interface__)
        cai["stream"] = stream
        self.__cuda_array_interface__ = cai
        self._keep = array


def test_the_producer_stream_of_the_array_interface_is_honoured():
    from daskgpu._runtime.gpu.driver import DEFAULT_STREAM as _DEFAULT_STREAM
    from daskgpu._runtime.gpu.run import sync_producer_stream

    s = cuda.stream()
    a = cuda.device_array(10, stream=s)
    assert sync_producer_stream(_Foreign(a, int(s.handle)), _DEFAULT_STREAM)
    assert not sync_producer_stream(_Foreign(a, None), _DEFAULT_STREAM)
    assert not sync_producer_stream(_Foreign(a, 1), _DEFAULT_STREAM)  # legacy orders itself
    out = shipped(dg.jit("void(float32[::1], float32)")(fill))[1, 32](
        _Foreign(cuda.to_device(np.zeros(10, np.float32), stream=s), int(s.handle)), 3.0)
    np.testing.assert_array_equal(out._keep.copy_to_host(), 3.0)


@cuda.jit
def _slow_fill(x):
    # ~50 ms before the writes: a consumer that does not wait reads the zeros.
    for _ in range(50):
        cuda.nanosleep(1000000)
    i = cuda.grid(1)
    if i < x.size:
        x[i] = i + 1


def _plus_one(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + 1


class _Exported:
    """A device array exported as libraries do: the interface as a class property."""

    def __init__(self, array, stream):
        self._cai = dict(array.__cuda_array_interface__, stream=stream)
        self._keep = array

    @property
    def __cuda_array_interface__(self):
        return self._cai


@pytest.mark.parametrize("wrap", [_Foreign, _Exported])
@pytest.mark.parametrize("repeats", [1, 3])
def test_an_array_from_a_non_blocking_producer_stream_is_waited_for(repeats, wrap):
    from cuda.bindings import driver

    err, handle = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert err == driver.CUresult.CUDA_SUCCESS
    try:
        producer = cuda.external_stream(int(handle))
        k = shipped(dg.jit("void(float32[::1], float32[::1])")(_plus_one))
        launch = k.forall(4096)  # the same launch again takes the fast path
        want = np.arange(1, 4097, dtype=np.float32) + 1
        for _ in range(repeats):
            x = cuda.device_array(4096, np.float32)
            x[:] = 0
            cuda.synchronize()
            _slow_fill[16, 256, producer](x)
            out = cuda.device_array(4096, np.float32)
            # The default stream does not order itself after a non-blocking one:
            # only the interface's "stream" says that x is still being written.
            launch(out, wrap(x, int(handle)))
            cuda.synchronize()
            np.testing.assert_array_equal(out.copy_to_host(), want)
    finally:
        cuda.synchronize()
        driver.cuStreamDestroy(handle)
