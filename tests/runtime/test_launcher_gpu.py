"""Real launches on a GPU: every argument kind, host and device arrays, caching."""

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._cli.bench_kernels import saxpy

pytestmark = pytest.mark.gpu


SCALARS = [
    ("int8", -7), ("int16", -300), ("int32", -70000), ("int64", -(2**40)),
    ("uint8", 200), ("uint16", 60000), ("uint32", 4_000_000_000), ("uint64", 2**63 + 5),
    ("float16", 1.5), ("float32", 2.25), ("float64", 3.125),
    ("complex64", 1 + 2j), ("complex128", 3 - 4j), ("bool", True),
]


@pytest.mark.parametrize("dtype,value", SCALARS)
def test_scalar_kinds_round_trip(dtype, value):
    nbtype = "boolean" if dtype == "bool" else dtype

    def store(out, v):
        out[0] = v

    k = dg.jit(f"void({nbtype}[::1], {nbtype})")(store)
    out = np.zeros(1, dtype=dtype)
    res = k[1, 1](out, value)
    assert res is out
    assert out[0] == np.array(value, dtype=dtype)


def _sum_kernel(ndim):
    src = {
        1: "i = cuda.grid(1)\n    if i < x.shape[0]:\n        out[i] = x[i] * 2 + 1",
        2: "i, j = cuda.grid(2)\n    if i < x.shape[0] and j < x.shape[1]:\n        out[i, j] = x[i, j] * 2 + 1",
        3: "i, j, k = cuda.grid(3)\n    if i < x.shape[0] and j < x.shape[1] and k < x.shape[2]:\n        out[i, j, k] = x[i, j, k] * 2 + 1",
    }[ndim]
    ns = {"cuda": cuda}
    exec(f"def affine(out, x):\n    {src}", ns)
    return dg.jit(ns["affine"])


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_array_ranks_and_layouts(ndim, order):
    shape = (37, 5, 3)[:ndim]
    base = np.arange(np.prod(shape) * 2, dtype=np.float64)
    if order == "strided":
        x = base[::2].reshape(shape)
        x = np.swapaxes(x, 0, -1) if ndim > 1 else x
    else:
        x = np.asarray(base[: np.prod(shape)].reshape(shape), order=order)
    out = np.zeros_like(x)
    k = _sum_kernel(ndim)
    res = k.forall(x.shape)(out, x)
    assert res is out
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_host_launch_updates_in_place_and_returns_written():
    x = np.arange(1000, dtype=np.float32)
    y = np.ones_like(x)
    out = np.zeros_like(x)
    res = saxpy[4, 256](out, 2.0, x, y)
    assert res is out
    np.testing.assert_allclose(out, 2 * x + 1)


def test_cupy_arrays_are_used_in_place():
    cp = pytest.importorskip("cupy")
    x = cp.arange(1000, dtype=cp.float32)
    y = cp.ones_like(x)
    out = cp.zeros_like(x)
    res = saxpy.forall(1000)(out, 2.0, x, y)
    assert res is out
    cp.testing.assert_allclose(out, 2 * x + 1)


def test_numba_device_arrays_are_used_in_place():
    x = cuda.to_device(np.arange(100, dtype=np.float32))
    out = cuda.device_array(100, dtype=np.float32)
    res = saxpy.forall(100)(out, 3.0, x, x)
    assert res is out
    np.testing.assert_allclose(out.copy_to_host(), 4 * np.arange(100))


def test_pickled_launch_links_once_per_device():
    from daskgpu._runtime.launcher import module_cache

    launch = pickle.loads(pickle.dumps(saxpy.forall(64)))
    x = np.ones(64, np.float32)
    launch(np.zeros_like(x), 1.0, x, x)
    links = module_cache.links
    for _ in range(3):
        out = launch(np.zeros_like(x), 1.0, x, x)
    assert module_cache.links == links
    np.testing.assert_allclose(out, 2.0)


def test_launch_refuses_oversized_block():
    x = np.ones(8, np.float32)
    with pytest.raises(dg.LaunchConfigError, match="1024"):
        saxpy[1, 2048](x, 1.0, x, x)


def test_forall_uses_occupancy_block_size():
    from daskgpu._runtime import device
    from daskgpu._runtime.launcher import launch_dims, linked

    image = saxpy.images[0]
    lk = linked(image, device.current())
    grid, block = launch_dims(dg.LaunchConfig(ntasks=10_000), lk)
    assert block[0] == lk.block_size(0) and block[0] % 32 == 0
    assert grid[0] * block[0] >= 10_000


def test_disk_cache_hits_in_a_fresh_process(tmp_path):
    blob = tmp_path / "launch.pkl"
    blob.write_bytes(pickle.dumps(saxpy.forall(16)))
    script = textwrap.dedent(f"""
        import pickle, sys, numpy as np, dask
        sys.modules["numba"] = None
        with dask.config.set({{"daskgpu.cache-dir": {str(tmp_path / 'cubins')!r}}}):
            import daskgpu._runtime.linking as linking
            calls = []
            orig = linking.link_cubin
            import daskgpu._runtime.launcher as launcher
            launcher.link_cubin = lambda *a: calls.append(1) or orig(*a)
            launch = pickle.load(open({str(blob)!r}, "rb"))
            x = np.ones(16, np.float32)
            out = launch(np.zeros_like(x), 1.0, x, x)
            assert (out == 2).all()
            print("LINKED", len(calls))
    """)
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "LINKED 1" in first.stdout
    assert "LINKED 0" in second.stdout
    assert os.listdir(tmp_path / "cubins")


# -- the fast path for repeated launches on device arrays ------------------

@dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
         "void(float64[::1], float64, float64[::1], float64[::1])"])
def saxpy2(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def test_repeated_launch_takes_the_fast_path_with_fresh_arguments():
    cp = pytest.importorskip("cupy")
    launch = saxpy[4, 256]
    x, y = cp.arange(1000, dtype=cp.float32), cp.ones(1000, cp.float32)
    out = cp.empty_like(x)
    launch(out, np.float32(2), x, y)
    assert launch._fast is not None
    for a in (3, 4):
        x2 = cp.arange(700, dtype=cp.float32) * a  # other buffers, another size
        out2 = cp.zeros(700, cp.float32)
        assert launch(out2, a, x2, x2[::1]) is out2
        cp.testing.assert_array_equal(out2, a * x2 + x2)


def test_fast_path_leaves_other_arguments_to_the_general_path():
    cp = pytest.importorskip("cupy")
    launch = saxpy2[4, 256]
    x = cp.arange(1000, dtype=cp.float32)
    launch(cp.empty_like(x), 2.0, x, x)
    assert launch._fast is not None
    # The second signature, host arrays, a strided view and a bad dtype all miss it.
    x64 = cp.arange(1000, dtype=cp.float64)
    out64 = launch(cp.empty_like(x64), 2.0, x64, x64)
    cp.testing.assert_array_equal(out64, 3 * x64)
    xh = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(launch(np.empty_like(xh), 2.0, xh, xh), 3 * xh)
    with pytest.raises(TypeError, match="C-contiguous"):
        launch(cp.empty(500, cp.float32), 2.0, x[::2], x[::2])
    with pytest.raises(TypeError, match="int16"):
        launch(cp.empty(10, cp.int16), 2.0, x, x)
    out = launch(cp.empty_like(x), 2.0, x, x)  # and the fast path still works after
    cp.testing.assert_array_equal(out, 3 * x)


def test_fast_path_keeps_its_module_loaded_when_the_cache_drops_it():
    cp = pytest.importorskip("cupy")
    from daskgpu._runtime.launcher import module_cache

    launch = saxpy[4, 256]
    x = cp.arange(1000, dtype=cp.float32)
    launch(cp.empty_like(x), 1.0, x, x)
    module_cache.clear()
    out = launch(cp.empty_like(x), 1.0, x, x)
    cp.testing.assert_array_equal(out, 2 * x)


def test_host_array_larger_than_free_device_memory_is_refused_with_the_sizes():
    from cuda.bindings import driver

    from daskgpu._runtime import device

    device.current()
    pool = driver.cuDeviceGetDefaultMemPool(0)[1]
    driver.cuCtxSynchronize()
    driver.cuMemPoolTrimTo(pool, 0)  # memory the pool kept would serve the copy
    free = driver.cuMemGetInfo()[1]
    err, hog = driver.cuMemAlloc(free - (1 << 30))  # leave 1 GiB free
    assert err == driver.CUresult.CUDA_SUCCESS
    try:
        n = (2 << 30) // 4  # 2 GiB of host float32
        x = np.ones(n, np.float32)
        out = np.full(16, -1, np.float32)
        with pytest.raises(dg.DeviceError, match=r"host array of 2\.00 GiB does not fit on the GPU"):
            saxpy.forall(16)(out, np.float32(2), x, x[:16])
        assert (out == -1).all()  # nothing launched, arrays unchanged
    finally:
        driver.cuMemFree(hog)
    assert saxpy.forall(16)(out, np.float32(2), x[:16], x[:16]) is out  # the worker goes on
    np.testing.assert_array_equal(out, 3)


def test_repeated_launches_on_numba_device_arrays_take_the_fast_path():
    launch = saxpy[4, 256]
    x = cuda.to_device(np.arange(1000, dtype=np.float32))
    out = cuda.device_array(1000, np.float32)
    assert launch(out, np.float32(2), x, x) is out
    assert launch._fast is not None
    stream = cuda.stream()
    for a in (3, 4):
        # A fresh array each time, one of them bound to a stream that wrote it.
        y = cuda.to_device(np.full(1000, a, np.float32), stream=stream)
        out2 = cuda.device_array(1000, np.float32)
        assert launch(out2, np.float32(a), x, y) is out2
        np.testing.assert_array_equal(out2.copy_to_host(), a * np.arange(1000) + a)
    assert launch._fast is not None


def test_fast_path_of_several_signatures_launches_the_one_select_image_picks():
    cp = pytest.importorskip("cupy")
    launch = saxpy2[4, 256]
    x = cp.arange(1000, dtype=cp.float32)
    for a in (np.float32(2), 2.0, 3, np.float32(4)):  # exact, then a float and an int cast
        out = launch(cp.empty_like(x), a, x, x)
        cp.testing.assert_array_equal(out, np.float32(a) * x + x)
