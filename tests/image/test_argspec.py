"""ArgSpec: plain-data parameter specs, checked against Numba's own typing."""

import types as pytypes

import numpy as np
import pytest
from numba import typeof
from numba.cuda import types
from numba.cuda.core import sigutils

from daskgpu._compiler.signatures import to_argspec, typeof_args
from daskgpu._image.argspec import (
    SCALAR_DTYPES,
    ArgSpec,
    describe,
    signature_str,
)
from daskgpu._image.array_info import array_info, c_strides, layout_of

NUMBA_NAME = {"bool": "boolean"}


def _arrays():
    """Arrays of every rank 0..3 and layout, including empty and size-1 dimensions."""
    out = []
    for shape in [(), (7,), (1,), (0,), (4, 5), (1, 5), (5, 1), (0, 3), (3, 0),
                  (4, 5, 6), (1, 1, 1), (2, 1, 3), (2, 0, 3)]:
        n = int(np.prod(shape))
        a = np.arange(max(n, 1) * 2, dtype=np.float32)[:n].reshape(shape)
        out += [a, np.asfortranarray(a), a.T]
        if a.ndim:
            out += [a[..., ::2], np.swapaxes(a, 0, -1)[::-1]]
    return out


ARRAYS = _arrays()


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.shape}-{a.strides}")
def test_layout_matches_numba_typeof(a):
    nb = typeof(a)
    assert layout_of(a.shape, a.strides, a.itemsize) == nb.layout
    # What daskgpu types an argument as is what Numba types it as.
    assert typeof_args((a,)) == (types.Array(types.float32, a.ndim, nb.layout),)


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.shape}-{a.strides}")
def test_accepts_follows_numpy_contiguity(a):
    for layout, ok in (("C", a.flags.c_contiguous), ("F", a.flags.f_contiguous), ("A", True)):
        assert ArgSpec("array", "float32", a.ndim, layout).accepts(a) == ok
    assert not ArgSpec("array", "float64", a.ndim, "A").accepts(a)
    assert not ArgSpec("array", "float32", a.ndim + 1, "A").accepts(a)


@pytest.mark.parametrize("shape", [(), (3,), (4, 5), (2, 3, 4)])
def test_c_strides_match_numpy(shape):
    for dtype in ("int8", "float64", "complex128"):
        assert c_strides(shape, np.dtype(dtype).itemsize) == np.zeros(shape, dtype).strides


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("layout", ["C", "F", "A"])
@pytest.mark.parametrize("dtype", sorted(SCALAR_DTYPES))
def test_str_parses_back_in_numba_to_the_same_type(dtype, ndim, layout):
    spec = ArgSpec("array", dtype, ndim, layout)
    (typ,), _ = sigutils.normalize_signature(f"void({spec})")
    expected_layout = "C" if ndim == 1 and layout == "F" else layout  # numba: 1-D [::1] is C
    assert typ == types.Array(getattr(types, NUMBA_NAME.get(dtype, dtype)), ndim, expected_layout)
    # ... and back to the spec through daskgpu's own conversion.
    assert to_argspec(typ, 0, "f") == ArgSpec("array", dtype, ndim, expected_layout)


@pytest.mark.parametrize("dtype", sorted(SCALAR_DTYPES))
def test_scalar_str_parses_back(dtype):
    spec = ArgSpec("scalar", dtype)
    (typ,), _ = sigutils.normalize_signature(f"void({spec})")
    assert typ == getattr(types, NUMBA_NAME.get(dtype, dtype))
    assert to_argspec(typ, 0, "f") == spec
    assert spec.np_dtype == np.dtype(dtype)


def test_str_forms():
    assert str(ArgSpec("array", "float32", 2, "C")) == "float32[:, ::1]"
    assert str(ArgSpec("array", "float32", 2, "F")) == "float32[::1, :]"
    assert str(ArgSpec("array", "int64", 3, "A")) == "int64[:, :, :]"
    assert str(ArgSpec("scalar", "bool")) == "boolean"
    assert signature_str([ArgSpec("array", "uint8", 1, "C"), ArgSpec("scalar", "complex64")]) == \
        "(uint8[::1], complex64)"
    assert signature_str([]) == "()"


def test_value_semantics():
    a, b = ArgSpec("array", "float32", 2, "C"), ArgSpec("array", "float32", 2, "C")
    assert a == b and hash(a) == hash(b)
    assert a != ArgSpec("array", "float32", 2, "F")
    assert ArgSpec("scalar", "int8") == ArgSpec("scalar", "int8", 0, "A")
    assert a.is_array and not ArgSpec("scalar", "int8").is_array


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="struct", dtype="float32"), r"kind must be one of .*got 'struct'"),
    (dict(kind="record", dtype="float32"), r"kind 'record' cannot have dtype 'float32'"),
    (dict(kind="scalar", dtype="object"), r"supports parameters of dtypes .*cannot read dtype 'object'"),
    (dict(kind="scalar", dtype="float"), r"cannot read dtype 'float'"),
    (dict(kind="array", dtype="float32", ndim=1, layout="K"), r"layout must be 'C', 'F' or 'A', got 'K'"),
])
def test_invalid_specs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArgSpec(**kwargs)


# -- scalars ---------------------------------------------------------------------------------


def _fits_losslessly(value, dtype: np.dtype) -> bool:
    """Independent reference: an int fits when it has a two's complement encoding."""
    try:
        value.to_bytes(dtype.itemsize, "little", signed=dtype.kind == "i")
        return True
    except OverflowError:
        return False


INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("dtype", INTS)
def test_python_ints_match_integer_params_when_they_fit(dtype):
    spec = ArgSpec("scalar", dtype)
    bits = 8 * np.dtype(dtype).itemsize
    for v in (0, 1, -1, 2**(bits - 1) - 1, 2**(bits - 1), -(2**(bits - 1)),
              -(2**(bits - 1)) - 1, 2**bits - 1, 2**bits, 300, -300):
        assert spec.accepts(v) == _fits_losslessly(v, np.dtype(dtype)), v


@pytest.mark.parametrize("dtype", INTS)
def test_numpy_ints_match_when_the_value_fits(dtype):
    spec = ArgSpec("scalar", dtype)
    for src in INTS:
        info = np.iinfo(src)
        for v in (info.min, info.max, 0, 5):
            value = np.dtype(src).type(v)
            assert spec.accepts(value) == _fits_losslessly(int(value), np.dtype(dtype)), (src, v)


def test_scalar_kinds():
    f32, c64, b, i32 = (ArgSpec("scalar", d) for d in ("float32", "complex64", "bool", "int32"))
    assert f32.accepts(1.5) and f32.accepts(3) and f32.accepts(np.float64(2.0))
    assert not f32.accepts(1j) and not f32.accepts(True) and not f32.accepts("1.0")
    assert c64.accepts(1j) and c64.accepts(1.0) and c64.accepts(2)
    assert b.accepts(True) and b.accepts(np.bool_(False))
    assert not b.accepts(1) and not b.accepts(np.int8(1)) and not b.accepts(1.0)
    assert not i32.accepts(1.0) and not i32.accepts(np.float32(1)) and not i32.accepts(True)
    assert not i32.accepts(None)
    # An array is never a scalar, nor a scalar an array.
    assert not f32.accepts(np.zeros(1, np.float32))
    assert not ArgSpec("array", "float32", 1, "A").accepts(1.0)


# -- device arrays and descriptions ---------------------------------------------------------


def _cai(shape, typestr, strides=None, ptr=4096):
    return {"shape": shape, "typestr": typestr, "strides": strides, "data": (ptr, False),
            "version": 3}


class DeviceArray:
    """A minimal __cuda_array_interface__ exporter (a class property)."""

    def __init__(self, shape, typestr, strides=None):
        self._cai = _cai(shape, typestr, strides)

    @property
    def __cuda_array_interface__(self):
        return self._cai


def test_device_arrays_via_the_interface():
    c = DeviceArray((4, 5), "<f4")  # strides None: C-contiguous
    f = DeviceArray((4, 5), "<f4", (4, 16))
    s = DeviceArray((4, 5), "<f4", (40, 8))
    assert array_info(c)[:3] == (np.dtype("float32"), (4, 5), (20, 4))
    assert ArgSpec("array", "float32", 2, "C").accepts(c)
    assert ArgSpec("array", "float32", 2, "F").accepts(f)
    assert not ArgSpec("array", "float32", 2, "C").accepts(s)
    assert ArgSpec("array", "float32", 2, "A").accepts(s)
    assert not ArgSpec("array", "float64", 2, "A").accepts(c)
    assert not ArgSpec("scalar", "float32").accepts(c)
    assert describe(c) == "float32[:, ::1] (device)"
    assert describe(s) == "float32[:, :] (device)"


def test_interface_as_an_instance_attribute():
    x = pytypes.SimpleNamespace(__cuda_array_interface__=_cai((8,), "<i8"))
    assert array_info(x)[:3] == (np.dtype("int64"), (8,), (8,))
    assert ArgSpec("array", "int64", 1, "C").accepts(x)
    assert array_info(pytypes.SimpleNamespace(a=1)) is None


def test_non_arrays_have_no_array_info():
    for v in (1, 1.0, 1j, True, np.float32(1), None, "x", [1, 2]):
        assert array_info(v) is None


def test_describe():
    assert describe(np.zeros((3, 4), order="F")) == "float64[::1, :] (host)"
    assert describe(np.zeros(6, np.int16)[::2]) == "int16[:] (host)"
    assert describe(np.zeros(3, bool)) == "boolean[::1] (host)"
    assert describe(np.float32(1)) == "float32"
    assert describe(1) == "int" and describe(1.0) == "float" and describe(None) == "NoneType"
