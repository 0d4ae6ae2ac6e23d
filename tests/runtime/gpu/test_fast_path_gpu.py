"""On a GPU: repeated launches on device arrays take the generated fast path."""

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._cli.bench.kernels import saxpy

pytestmark = pytest.mark.gpu


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
    from daskgpu._runtime.gpu.linked_kernel import module_cache

    launch = saxpy[4, 256]
    x = cp.arange(1000, dtype=cp.float32)
    launch(cp.empty_like(x), 1.0, x, x)
    module_cache.clear()
    out = launch(cp.empty_like(x), 1.0, x, x)
    cp.testing.assert_array_equal(out, 2 * x)


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
