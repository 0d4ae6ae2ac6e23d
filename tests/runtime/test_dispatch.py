"""Which image a launch runs: Numba's dispatcher rules on the arguments, and their errors."""

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime.dispatch import select_image
from daskgpu._runtime.ptx_kernel import PTXKernel


def saxpy_py(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


saxpy = dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
                "void(float64[:], float64, float64[:], float64[:])"])(saxpy_py)


@dg.jit("void(int8[::1], int8)")
def put8(out, v):
    out[0] = v


def test_selects_the_matching_signature():
    f32 = np.zeros(8, np.float32)
    f64 = np.zeros(8)
    assert saxpy.select_image((f32, 2.0, f32, f32)) is saxpy.images[0]
    assert saxpy.select_image((f64, 2.0, f64, f64)) is saxpy.images[1]
    # "A" layout takes strided arrays; the C-contiguous signature does not.
    assert saxpy.select_image((f64[::2], 2.0, f64, f64[::2])) is saxpy.images[1]
    shipped = PTXKernel(saxpy.images)
    assert shipped.select_image((f64[::2], 2.0, f64, f64[::2])) is saxpy.images[1]


def test_no_matching_signature_lists_signatures_and_received_types():
    shipped = PTXKernel(saxpy.images)
    args = (np.zeros(8, np.int32), 2.0, np.zeros(8, np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError) as info:
        shipped.select_image(args)
    msg = str(info.value)
    assert msg.startswith("No matching definition")  # numba-cuda's words, for code that looks
    assert "no compiled signature of kernel 'saxpy_py' matches the arguments " \
           "(int32[::1] (host), float, float32[::1] (host), float32[:, ::1] (host))" in msg
    # Each signature is listed with the first argument that does not fit it, and why.
    assert "  (float32[::1], float32, float32[::1], float32[::1]): argument 0 expects " \
           "dtype float32, got int32; convert with .astype('float32')\n" in msg
    assert "  (float64[:], float64, float64[:], float64[:]): argument 0 expects dtype " \
           "float64, got int32" in msg
    assert "kernel.specialize(*args)" in msg


def test_on_the_client_the_argument_no_signature_takes_is_named_by_its_parameter():
    args = (np.zeros(8, np.float32), 2.0, np.zeros(8, np.int32), np.zeros(8, np.float32))
    with pytest.raises(TypeError) as info:
        saxpy.select_image(args)  # the client's kernel knows its Python function
    names = saxpy.parameter_names
    assert names is not None and len(names) == 4
    assert f"argument 2 ({names[2]!r}) expects dtype float32, got int32" in str(info.value)
    with pytest.raises(TypeError) as info:
        PTXKernel(saxpy.images).select_image(args)  # a worker's has no names: positions
    assert "argument 2 expects dtype float32, got int32" in str(info.value)


@pytest.mark.parametrize("args, reason", [
    ((np.zeros((2, 2), np.float32, order="F"), 1),
     "argument 0 expects a C-contiguous array, got a F-layout one; pass np.ascontiguousarray(a)"),
    ((np.zeros((2, 2), np.float32), 3j), "argument 1 expects int8, got complex 3j"),
    ((np.zeros(3, np.float32), 1), "argument 0 expects a 2-D array, got 1-D of shape (3,)"),
    ((np.zeros((2, 2), np.float32), 1.5), "argument 1 expects int8, got float 1.5"),
    ((np.zeros((2, 2), np.float32),), "takes 2 arguments, got 1"),
])
def test_no_match_says_which_argument_and_why(args, reason):
    k = dg.jit("void(float32[:, ::1], int8)")(_store_first)
    with pytest.raises(TypeError) as info:
        k.ptx_kernel().select_image(args)
    assert f"(float32[:, ::1], int8): {reason}" in str(info.value)


def _store_first(a, b):
    a[0, 0] = b


def test_strided_array_does_not_match_a_contiguous_signature():
    x = np.zeros(16, np.float32)
    with pytest.raises(TypeError, match=r"float32\[:\] \(host\)"):
        PTXKernel(saxpy.images[:1]).select_image((x[::2], 1.0, x[:8], x[:8]))


def test_wrong_argument_count():
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError,
                       match=r"matches the arguments \(float32\[::1\] \(host\), float\)"):
        saxpy.select_image((x, 1.0))
    with pytest.raises(TypeError, match="no compiled signature"):
        saxpy.select_image((x, 1.0, x, x, x))


# An eager kernel takes any integer for an int8 parameter, wrapping as a C cast
# does (Numba's unsafe conversion, allowed when it cannot compile), never a float.
@pytest.mark.parametrize("value, ok", [
    (127, True), (-128, True), (128, True), (-129, True), (300, True),
    (np.int8(5), True), (np.int64(100), True), (np.int64(1000), True),
    (1.0, False), (True, True), (np.float32(1), False),
])
def test_an_int8_parameter_takes_integers_and_no_floats(value, ok):
    out = np.zeros(1, np.int8)
    if ok:
        assert put8.select_image((out, value)) is put8.images[0]
    else:
        with pytest.raises(TypeError, match=r"Compiled signatures:\n  \(int8\[::1\], int8\)"):
            put8.select_image((out, value))


def test_kernel_with_no_images_reports_none():
    with pytest.raises(TypeError, match=r"Compiled signatures:\n  \(none\)"):
        select_image("k", (), (1,))
