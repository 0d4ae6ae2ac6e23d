"""Kernel parameters, byte for byte, against Numba's own data model and the PTX it emits.

Three independent references: numba-cuda's target context (how many parameters an
argument flattens to, and their sizes), the ``.param`` declarations in the PTX of a
compiled kernel, and the ctypes values numba-cuda's dispatcher itself passes to
``cuLaunchKernel`` for scalars.
"""

import ctypes
import pickle
import re
import struct
import types as pytypes

import numpy as np
import pytest
from numba.cuda import types
from numba.cuda.descriptor import cuda_target
from numba.cuda.dispatcher import _Kernel

import daskgpu as dg
from daskgpu._compiler.signatures import to_argspec
from daskgpu._image.argspec import SCALAR_DTYPES, ArgSpec
from daskgpu._runtime.gpu.marshal import ParamLayout, flatten, param_codes

CTX = cuda_target.target_context
NUMBA_NAME = {"bool": "boolean"}
SCALARS = sorted(SCALAR_DTYPES)


def numba_type(spec: ArgSpec):
    dtype = getattr(types, NUMBA_NAME.get(spec.dtype, spec.dtype))
    return types.Array(dtype, spec.ndim, spec.layout) if spec.is_array else dtype


ARRAY_SPECS = [ArgSpec("array", d, n, lay)
               for d in ("float32", "int8", "complex128")
               for n in (1, 2, 3) for lay in "CFA"]
SCALAR_SPECS = [ArgSpec("scalar", d) for d in SCALARS]
ALL_SPECS = ARRAY_SPECS + SCALAR_SPECS


def layout_sizes(layout: ParamLayout):
    return [struct.calcsize("=" + c) for spec in layout.specs for c in param_codes(spec)]


def numba_sizes(specs):
    packer = CTX.get_arg_packer([numba_type(s) for s in specs])
    return [CTX.get_abi_sizeof(t) for t in packer.argument_types]


# -- the layout against Numba's data model ---------------------------------------------------------


@pytest.mark.parametrize("spec", ALL_SPECS, ids=str)
def test_one_argument_flattens_as_numba_does(spec):
    layout = ParamLayout([spec])
    assert len(layout.offsets) == len(numba_sizes([spec]))
    assert layout_sizes(layout) == numba_sizes([spec])


def test_array_members_are_numbas_in_numbas_order():
    for spec in ARRAY_SPECS:
        model = CTX.data_model_manager[numba_type(spec)]
        assert model._fields == ("meminfo", "parent", "nitems", "itemsize", "data", "shape",
                                 "strides")
        # shape and strides are tuples of ndim int64s: 5 + 2*ndim parameters.
        assert len(CTX.get_arg_packer([numba_type(spec)]).argument_types) == 5 + 2 * spec.ndim


def test_all_arguments_together():
    layout = ParamLayout(ALL_SPECS)
    sizes = numba_sizes(ALL_SPECS)
    assert layout_sizes(layout) == sizes
    # Every parameter at its natural alignment, none overlapping.
    ends = 0
    for offset, size in zip(layout.offsets, sizes):
        assert offset % size == 0 and offset >= ends
        ends = offset + size
    assert layout.size >= ends


def test_no_arguments():
    layout = ParamLayout([])
    assert layout.offsets == ()
    assert isinstance(layout.pack([]), int)


# -- the layout against the PTX of a compiled kernel ----------------------------------------------


_PTX_SIZE = {"8": 1, "16": 2, "32": 4, "64": 8}


def ptx_param_sizes(image):
    ptx = image.ptx[0][1]
    m = re.search(r"\.entry\s+" + re.escape(image.entry) + r"\s*\((.*?)\)", ptx, re.S)
    decls = re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\s", m.group(1))
    return [_PTX_SIZE[bits] for _, bits in decls]


def _sig(specs):
    return "void(" + ", ".join(str(s) for s in specs) + ")"


def _noop(*args):
    pass


@pytest.fixture(scope="module")
def everything_image():
    specs = SCALAR_SPECS + [ArgSpec("array", "float32", 1, "C"),
                            ArgSpec("array", "float64", 2, "F"),
                            ArgSpec("array", "int8", 3, "A")]
    names = [f"a{i}" for i in range(len(specs))]
    ns = {}
    exec(f"def everything({', '.join(names)}):\n    pass", ns)
    return dg.jit(_sig(specs))(ns["everything"]).images[0]


def test_ptx_params_match_the_layout(everything_image):
    image = everything_image
    layout = ParamLayout(image.args)
    assert ptx_param_sizes(image) == layout_sizes(layout)
    assert len(layout.offsets) == len(ptx_param_sizes(image))


@pytest.mark.parametrize("specs", [
    [ArgSpec("array", "float32", 1, "C"), ArgSpec("scalar", "float32"),
     ArgSpec("array", "float32", 1, "C"), ArgSpec("array", "float32", 1, "C")],
    [ArgSpec("scalar", "bool"), ArgSpec("array", "complex64", 2, "C"), ArgSpec("scalar", "int8"),
     ArgSpec("scalar", "complex128"), ArgSpec("scalar", "float16")],
], ids=["saxpy", "mixed"])
def test_ptx_params_of_kernels_that_use_them(specs):
    names = [f"a{i}" for i in range(len(specs))]
    uses = "\n    ".join(f"x = {n}" for n in names)
    ns = {}
    exec(f"def k({', '.join(names)}):\n    {uses}", ns)
    image = dg.jit(_sig(specs))(ns["k"]).images[0]
    assert ptx_param_sizes(image) == layout_sizes(ParamLayout(image.args))
    assert image.args == tuple(to_argspec(numba_type(s), 0, "k") for s in specs)


# -- concrete values -------------------------------------------------------------------------------


def packed_params(layout: ParamLayout, values, sizes):
    """Pack, then read each parameter back through the pointer array, as the driver would."""
    address = layout.pack(values)
    pointers = (ctypes.c_uint64 * len(sizes)).from_address(address)
    return [ctypes.string_at(p, s) for p, s in zip(pointers, sizes)]


def numba_scalar_bytes(typ, value):
    """The bytes numba-cuda's dispatcher passes for a scalar (_Kernel._prepare_args)."""
    out = []
    _Kernel._prepare_args(pytypes.SimpleNamespace(extensions=[]), typ, value, 0, [], out)
    # numba passes bools as Python bools, which cuda.core sends as one byte.
    return [struct.pack("?", v) if isinstance(v, bool) else bytes(v) for v in out]


SCALAR_VALUES = {
    "bool": [True, False], "int8": [-128, 127, -7], "int16": [-32768, 300],
    "int32": [-(2**31), 2**31 - 1], "int64": [-(2**63), 2**40 + 3],
    "uint8": [0, 255], "uint16": [65535], "uint32": [2**32 - 1], "uint64": [2**64 - 1, 2**63 + 5],
    "float16": [1.5, -65504.0, 0.1], "float32": [2.25, 1e-30, -0.0], "float64": [3.125, 1e300],
    "complex64": [1 + 2j, -0.5j], "complex128": [3 - 4j, complex(1e300, -1e-300)],
}


@pytest.mark.parametrize("dtype", SCALARS)
def test_scalar_bytes_match_numbas(dtype):
    spec = ArgSpec("scalar", dtype)
    layout = ParamLayout([spec])
    sizes = layout_sizes(layout)
    for value in SCALAR_VALUES[dtype]:
        for given in (value, np.dtype(dtype).type(value)):
            values = []
            flatten(spec, given, values)
            assert (packed_params(layout, values, sizes)
                    == numba_scalar_bytes(numba_type(spec), value))


def numba_array_params(typ, a: np.ndarray):
    """An array's parameters from its data model: member names give the values."""
    model = CTX.data_model_manager[typ]
    member = {"meminfo": 0, "parent": 0, "nitems": a.size, "itemsize": a.itemsize,
              "data": a.ctypes.data, "shape": a.shape, "strides": a.strides}
    flat = []
    for name in model._fields:
        v = member[name]
        flat += list(v) if isinstance(v, tuple) else [v]
    llvm_types = CTX.get_arg_packer([typ]).argument_types
    assert len(flat) == len(llvm_types)
    return [v.to_bytes(CTX.get_abi_sizeof(t), "little", signed=v < 0)
            for v, t in zip(flat, llvm_types)]


def _arrays():
    base = np.arange(2 * 3 * 4 * 2, dtype=np.float32)
    return [
        base[:5], base[::3], base[:24].reshape(4, 6), np.asfortranarray(base[:24].reshape(4, 6)),
        base[:24].reshape(4, 6)[:, ::2], base[:24].reshape(2, 3, 4), base[:24].reshape(2, 3, 4).T,
        base[::2].reshape(2, 3, 4)[:, ::-1], np.zeros((0, 3), np.float32),
    ]


@pytest.mark.parametrize("a", _arrays(), ids=lambda a: f"{a.shape}-{a.strides}")
def test_array_bytes_match_numbas_data_model(a):
    spec = ArgSpec("array", "float32", a.ndim, "A")
    layout = ParamLayout([spec])
    values = []
    flatten(spec, (a.ctypes.data, a.shape, a.strides, a.itemsize), values)
    sizes = layout_sizes(layout)
    assert packed_params(layout, values, sizes) == numba_array_params(numba_type(spec), a)


def test_mixed_arguments_pack_in_order():
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    specs = [ArgSpec("scalar", "int8"), ArgSpec("array", "float64", 2, "C"),
             ArgSpec("scalar", "complex64"), ArgSpec("scalar", "bool"),
             ArgSpec("scalar", "float64")]
    args = [-3, (x.ctypes.data, x.shape, x.strides, x.itemsize), 1.5 - 2j, True, 0.25]
    layout = ParamLayout(specs)
    values = []
    for spec, arg in zip(specs, args):
        flatten(spec, arg, values)
    got = packed_params(layout, values, layout_sizes(layout))
    expected = (numba_scalar_bytes(types.int8, -3) + numba_array_params(numba_type(specs[1]), x)
                + numba_scalar_bytes(types.complex64, 1.5 - 2j)
                + numba_scalar_bytes(types.boolean, True) + numba_scalar_bytes(types.float64, 0.25))
    assert got == expected
    # The buffer is reused: packing new values overwrites the old ones.
    values2 = []
    for spec, arg in zip(specs, [7, args[1], 0j, False, -1.0]):
        flatten(spec, arg, values2)
    got2 = packed_params(layout, values2, layout_sizes(layout))
    assert got2[0] == numba_scalar_bytes(types.int8, 7)[0]
    assert got2[-1] == numba_scalar_bytes(types.float64, -1.0)[0]


@pytest.mark.parametrize("dtype,value", [("int32", 0xFFFFFFFF), ("int32", 0x80000000),
                                         ("uint8", -1), ("int16", 2**20 + 5), ("int64", 2**64 - 3),
                                         ("uint32", -(2**31))])
def test_an_integer_out_of_range_wraps_as_numbas_ctypes_cast(dtype, value):
    spec = ArgSpec("scalar", dtype)
    layout = ParamLayout([spec, ArgSpec("scalar", "float32")])
    values = []
    flatten(spec, value, values)
    flatten(ArgSpec("scalar", "float32"), 0.5, values)
    got = packed_params(layout, values, layout_sizes(layout))
    assert got == (numba_scalar_bytes(numba_type(spec), value)
                   + numba_scalar_bytes(types.float32, 0.5))


class _Colour(__import__("enum").Enum):
    RED = 1
    BLUE = -7


class _Level(__import__("enum").IntEnum):
    HIGH = 300


class _Ratio(__import__("enum").Enum):
    HALF = 0.5


class _Planet(__import__("enum").Enum):  # numba-cuda's test_enums kind: tuple values
    MERCURY = (3.303e23, 2.4397e6)
    VENUS = (4.869e24, 6.0518e6)


@pytest.mark.parametrize("member", [_Colour.RED, _Colour.BLUE, _Level.HIGH, _Ratio.HALF])
def test_enum_members_pass_as_their_values_as_numba_passes_them(member):
    from numba.cuda.typing.typeof import Purpose, typeof

    from daskgpu._compiler.signatures import to_argspec, typeof_args

    typ = typeof(member, Purpose.argument)
    assert typeof_args((member,)) == (typ,)
    spec = to_argspec(typ, 0, "k")
    assert spec.accepts(member)
    layout = ParamLayout([spec])
    values = []
    flatten(spec, member, values)
    # numba-cuda's own dispatcher code for the member, which recurses on its value.
    this = pytypes.SimpleNamespace(extensions=[])
    this._prepare_args = lambda *a: _Kernel._prepare_args(this, *a)
    out = []
    _Kernel._prepare_args(this, typ, member, 0, [], out)
    assert packed_params(layout, values, layout_sizes(layout)) == [bytes(v) for v in out]


def test_an_enum_kernel_compiles_and_selects_its_image():
    def k(out, c):
        if c == _Colour.BLUE:
            out[0] = 1

    kernel = dg.jit(k).specialize(np.zeros(1, np.int32), _Colour.RED)
    (image,) = kernel.images
    assert str(image.args[1]) == "Enum<int64>(_Colour)"  # as Numba prints the type
    assert kernel.select_image((np.zeros(1, np.int32), _Colour.BLUE)) is image


def test_an_enum_with_tuple_values_is_matched_as_its_tuple():
    def k(out, a, b):
        out[0] = a == b

    kernel = dg.jit(k).specialize(np.zeros(1, np.bool_), _Planet.MERCURY, _Planet.VENUS)
    (image,) = kernel.images
    assert [str(s) for s in image.args[1:]] == ["Enum<Tuple(float64, float64)>(_Planet)"] * 2
    assert kernel.select_image((np.zeros(1, np.bool_), _Planet.VENUS, _Planet.VENUS)) is image
    assert image.args[1].accepts(_Planet.VENUS) and not image.args[1].accepts(_Colour.RED)


def is_same(out, a, b):
    out[0] = a is b


def test_a_member_of_another_enum_class_with_an_equal_value_is_not_taken(tmp_path):
    # numba-cuda's test_enums: `Shape.circle is IntEnumWithNegatives.two` is False
    # although both are the int 2; an image typed for one class must not take the other.
    out = np.zeros(1, np.bool_)
    kernel = dg.jit(is_same).specialize(out, _Colour.RED, _Colour.RED)
    dg.save(kernel, tmp_path / "k.dgk")
    for shipped in (pickle.loads(pickle.dumps(kernel.ptx_kernel())), dg.load(tmp_path / "k.dgk")):
        (image,) = shipped.images
        assert image.args[1].enum == f"{__name__}._Colour"
        assert shipped.select_image((out, _Colour.BLUE, _Colour.RED)) is image
        with pytest.raises(TypeError, match=r"expects a member of enum .*\._Colour, got"):
            shipped.select_image((out, _Colour.RED, _Level.HIGH))
        with pytest.raises(TypeError, match="expects a member of enum"):
            shipped.select_image((out, _Colour.RED, 1))
    from daskgpu._compiler.signatures import typeof_args

    both = dg.jit(is_same)
    for args in ((out, _Colour.RED, _Colour.RED), (out, _Colour.RED, _Level.HIGH)):
        both.compile(typeof_args(args))
    assert [str(i.args[2]) for i in both.images] == ["Enum<int64>(_Colour)", "Enum<int64>(_Level)"]


@pytest.mark.gpu
def test_an_enum_with_tuple_values_reaches_the_gpu_as_its_members():
    def k(out, a, b):
        out[0] = a == b
        out[1] = a is not b
        out[2] = a.value[1] < b.value[1]

    kernel = pickle.loads(pickle.dumps(dg.jit(k).specialize(
        np.zeros(3, np.bool_), _Planet.MERCURY, _Planet.VENUS)))
    got = kernel[1, 1](np.zeros(3, np.bool_), _Planet.MERCURY, _Planet.VENUS)
    assert got.tolist() == [False, True, True]
    got = kernel[1, 1](np.zeros(3, np.bool_), _Planet.VENUS, _Planet.VENUS)
    assert got.tolist() == [True, False, False]


@pytest.mark.gpu
def test_an_enum_member_reaches_the_gpu_as_its_value():
    def k(out, c, r):
        out[0] = c.value * r.value

    kernel = dg.jit(k).specialize(np.zeros(1, np.float64), _Colour.RED, _Ratio.HALF)
    shipped = pickle.loads(pickle.dumps(kernel))
    out = shipped[1, 1](np.zeros(1, np.float64), _Colour.BLUE, _Ratio.HALF)
    assert out[0] == -3.5


def test_enum_members_in_a_tuple_keep_their_class():
    def k(out, t):
        out[0] = t[0] is t[1]

    out = np.zeros(1, np.bool_)
    kernel = dg.jit(k).specialize(out, (_Colour.RED, _Colour.BLUE))
    shipped = pickle.loads(pickle.dumps(kernel.ptx_kernel()))
    (image,) = shipped.images
    assert [m.enum for m in image.args[1].members] == [f"{__name__}._Colour"] * 2
    assert shipped.select_image((out, (_Colour.BLUE, _Colour.BLUE))) is image
    with pytest.raises(TypeError, match="member 1 expects a member of enum"):
        shipped.select_image((out, (_Colour.BLUE, _Level.HIGH)))
