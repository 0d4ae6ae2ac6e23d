"""Record dtypes, numba-cuda's random states and the other argument kinds numba-cuda
passes (tuples, In/Out, datetime64, bfloat16): compiled to images, pickled PTX-only,
marshalled as Numba lays them out, and run in the simulator."""

import pickle

import ml_dtypes
import numpy as np
import pytest
from numba import cuda
from numba.cuda.random import (
    init_xoroshiro128p_states_cpu,
    xoroshiro128p_dtype,
    xoroshiro128p_uniform_float32,
)

import daskgpu as dg
from daskgpu._image.argspec import ArgSpec, dtype_code, dtype_of, mismatch
from daskgpu._image.array_info import ArrayInfo
from daskgpu._runtime.gpu.marshal import ParamLayout, flatten, param_codes

dg._config.get("target-cc")  # register daskgpu's defaults before dask.config.set

ALIGNED = np.dtype([("a", np.int8), ("b", np.float64), ("c", np.complex64)], align=True)
PACKED = np.dtype([("b", np.float64), ("c", np.complex64), ("a", np.int8)])  # 17 bytes
NESTED = np.dtype([("x", np.int16), ("inner", ALIGNED), ("v", np.float32, (3,))], align=True)


@pytest.mark.parametrize("dtype", [ALIGNED, PACKED, NESTED, xoroshiro128p_dtype],
                         ids=["aligned", "packed", "nested", "xoroshiro128p"])
def test_record_dtype_code_round_trips_byte_layout(dtype):
    back = dtype_of(dtype_code(dtype))
    assert back == dtype and back.itemsize == dtype.itemsize
    assert [back.fields[n][1] for n in back.names] == [dtype.fields[n][1] for n in dtype.names]
    assert back.isalignedstruct == dtype.isalignedstruct


def test_aligned_and_packed_records_are_different_specs():
    assert dtype_code(ALIGNED) != dtype_code(PACKED)
    spec = ArgSpec("array", dtype_code(ALIGNED), 1, "C")
    assert spec.accepts(np.zeros(2, ALIGNED))
    assert not spec.accepts(np.zeros(2, PACKED))


def test_record_spec_accepts_a_device_interface_that_spells_it_void():
    # Numba's device arrays give typestr "|V16" and no descr for record dtypes.
    class Dev:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "|V16", "data": (1 << 20, False),
                                    "version": 3, "strides": None}

    spec = ArgSpec("array", dtype_code(xoroshiro128p_dtype), 1, "C")
    assert spec.accepts(Dev())
    other = ArgSpec("array", dtype_code(ALIGNED), 1, "C")  # 24 bytes: not that void
    assert not other.accepts(Dev())


def test_record_by_value_is_one_pointer_as_in_numbas_data_model():
    from numba.cuda.descriptor import cuda_target
    from numba.np import numpy_support

    ctx = cuda_target.target_context
    rec = numpy_support.from_dtype(ALIGNED)
    packer = ctx.get_arg_packer([rec])
    assert [ctx.get_abi_sizeof(t) for t in packer.argument_types] == [8]
    spec = ArgSpec("record", dtype_code(ALIGNED))
    assert param_codes(spec) == "Q" and ParamLayout([spec]).offsets == (0,)
    arr = ArgSpec("array", dtype_code(ALIGNED), 2, "C")
    assert len(ParamLayout([arr]).offsets) == len(
        ctx.get_arg_packer([numpy_support.from_dtype(ALIGNED)[:, ::1]]).argument_types)


@dg.jit
def uniform(states, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = xoroshiro128p_uniform_float32(states, i)


def reference_uniform(n, seed):
    # The same numbers from numba-cuda itself, on the host: its random
    # functions are plain numba.jit functions.
    states = np.empty(n, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, seed, 0)
    return np.array([xoroshiro128p_uniform_float32(states, i) for i in range(n)], np.float32), states


def test_random_state_kernel_compiles_and_pickles_ptx_only():
    states = np.empty(64, xoroshiro128p_dtype)
    k = uniform.specialize(states, np.zeros(64, np.float32))
    (image,) = k.images
    assert image.args[0] == ArgSpec("array", dtype_code(xoroshiro128p_dtype), 1, "C")
    assert set(image.writes) == {0, 1}  # the generator advances its state
    blob = pickle.dumps(k.configure(1, 64))
    assert b"xoroshiro128p_uniform_float32(states" not in blob and image.py_func is None
    shipped = pickle.loads(blob)
    assert shipped.kernel.images[0].hash == image.hash


def test_random_state_kernel_runs_simulated_as_numba(simulate):
    n, seed = 100, 1234
    expected, expected_states = reference_uniform(n, seed)
    states = np.empty(n, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, seed, 0)
    out = np.zeros(n, np.float32)
    k = uniform.specialize(states, out)
    launch = pickle.loads(pickle.dumps(k.forall(n)))
    got_states, got = launch(states, out)
    np.testing.assert_array_equal(got, expected)
    assert got_states.tobytes() == expected_states.tobytes()


@dg.jit
def set_record(recs, value):
    i = cuda.grid(1)
    if i < recs.size:
        recs[i].b = value.b + i
        recs[i].a = value.a


def test_record_arrays_and_record_scalars_simulated(simulate):
    for dtype in (ALIGNED, PACKED):
        recs = np.zeros(5, dtype)
        value = np.zeros(1, dtype)[0]
        value["a"], value["b"] = 7, 1.5
        result = set_record.forall(5)(recs, value)
        assert result is recs
        np.testing.assert_array_equal(recs["b"], 1.5 + np.arange(5))
        np.testing.assert_array_equal(recs["a"], 7)
    assert len(set_record.images) == 2  # one per layout, as Numba compiles


def test_record_mismatch_names_the_dtypes():
    k = set_record.specialize(np.zeros(2, ALIGNED), np.zeros(1, ALIGNED)[0])
    with pytest.raises(TypeError, match="same fields, offsets and itemsize"):
        k.ptx_kernel().select_image([np.zeros(2, PACKED), np.zeros(1, ALIGNED)[0]])


def test_cuda_in_out_inout_match_the_array_they_wrap():
    k = dg.jit("void(float32[::1])")(lambda a: None)
    a = np.zeros(4, np.float32)
    for hint in (cuda.In, cuda.Out, cuda.InOut):
        assert k.images[0].args[0].accepts(hint(a))
    assert not k.images[0].args[0].accepts(cuda.In(np.zeros(4)))


# -- tuples and namedtuples ---------------------------------------------------------------

Point = __import__("collections").namedtuple("Point", "x y z")


def sum_tuple(r, t):
    a, s, (u, v) = t
    r[0] = a[0] + s + u + v
    a[1] = 5


def test_tuples_flatten_as_numba_flattens_them():
    from numba.cuda import types
    from numba.cuda.descriptor import cuda_target

    from daskgpu._compiler.signatures import to_argspec

    ctx = cuda_target.target_context
    for t in [types.Tuple(()), types.UniTuple(types.int64, 3),
              types.Tuple((types.float32[::1], types.int8, types.UniTuple(types.int16, 2))),
              types.NamedTuple((types.int64, types.int64, types.float64), Point)]:
        packer = ctx.get_arg_packer([t])
        spec = to_argspec(t, 0, "f")
        assert [struct_size(c) for c in param_codes(spec)] == [
            ctx.get_abi_sizeof(x) for x in packer.argument_types]


def struct_size(code):
    import struct

    return struct.calcsize("=" + code)


def test_nested_tuples_with_arrays_run_simulated_and_write_back(simulate):
    k = dg.jit(sum_tuple)
    a, r = np.arange(3.0), np.zeros(1)
    k[1, 1](r, (a, 2, (3, 4)))
    assert r[0] == 9 and a[1] == 5
    (image,) = k.images
    assert image.writes == (0, 1) and str(image.args[1]) == "Tuple(float64[::1], int64, Tuple(int64, int64))"
    shipped = pickle.loads(pickle.dumps(image))
    assert shipped.args == image.args


def test_namedtuples_and_empty_tuples_compile(simulate):
    def f(r, p, e):
        r[0] = p.x + p.y + p.z + len(e)

    k = dg.jit(f)
    r = np.zeros(1)
    k[1, 1](r, Point(1, 2, 0.5), ())
    assert r[0] == 3.5
    with pytest.raises(TypeError, match="member 2"):
        k.ptx_kernel().select_image([r, (1, 2, "x"), ()])


def shift_dates(out, dates, delta):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = dates[i] + delta


def test_datetime64_and_timedelta64_arrays_and_scalars(simulate):
    dates = np.array(["2026-01-01", "2026-12-02"], dtype="datetime64[D]")
    k = dg.jit(shift_dates)
    out = k.forall(2)(np.zeros(2, "datetime64[D]"), dates, np.timedelta64(3, "D"))
    np.testing.assert_array_equal(out, dates + np.timedelta64(3, "D"))
    (image,) = k.images
    assert [str(a) for a in image.args] == ["datetime64[D][::1]", "datetime64[D][::1]", "timedelta64[D]"]
    assert param_codes(image.args[2]) == "q"  # an int64 count, as numba passes it
    assert not image.args[2].accepts(np.timedelta64(3, "h"))  # the unit is part of the type


def scale(out, x, s):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * s


def test_bfloat16_arrays_and_scalars_type_and_match_as_numba_cuda_types_them(simulate):
    from numba.cuda.typing.typeof import Purpose, typeof

    from daskgpu._compiler.signatures import typeof_args

    x = np.arange(4).astype(ml_dtypes.bfloat16)
    s = ml_dtypes.bfloat16(1.5)
    assert typeof_args((x, s)) == (typeof(x, Purpose.argument), typeof(s, Purpose.argument))
    k = dg.jit(scale)
    out = k.forall(4)(np.zeros(4, x.dtype), x, s)
    np.testing.assert_array_equal(out.astype(np.float32), np.arange(4) * 1.5)
    (image,) = pickle.loads(pickle.dumps(k)).images
    assert [str(a) for a in image.args] == ["bfloat16[::1]", "bfloat16[::1]", "bfloat16"]
    array, _, scalar = image.args
    # A device array's interface spells bfloat16 "<V2"; float16 has the same size.
    assert array.matches(ArrayInfo(np.dtype("<V2"), (4,), (2,), 1), None)
    assert not array.accepts(np.zeros(4, np.float16))
    assert not scalar.accepts(1.5)  # rounding to bfloat16 is the caller's choice
    assert "pass ml_dtypes.bfloat16(value)" in mismatch(scalar, 1.5)
    assert mismatch(array, np.zeros(4, np.float32)) == (
        "expects dtype bfloat16, got float32; convert with .astype(ml_dtypes.bfloat16)")
    assert param_codes(scalar) == "H"
    values = []
    flatten(scalar, s, values)
    assert values == [0x3FC0]  # 1.5 in bfloat16: its two bytes as they are


_HASH_SCRIPT = """
import sys
import numpy as np
from numba.cuda.typing.typeof import typeof
import daskgpu as dg
for i in range(int(sys.argv[1])):  # other record types first: numba numbers types per process
    typeof(np.zeros(1, np.dtype([(f"f{i}", np.int8)]))[0])
rec = np.dtype([("a", np.int32), ("b", np.float64)], align=True)

def by_value(out, r):
    out[0] = r["a"] + r["b"]

def in_array(arr, out):
    out[0] = arr[0]["b"]

a = dg.jit(by_value).specialize(np.zeros(1), np.zeros(1, rec)[0]).images[0]
b = dg.jit(in_array).specialize(np.zeros(3, rec), np.zeros(1)).images[0]
print(a.hash, b.hash)
"""


@pytest.mark.slow
def test_record_kernel_images_hash_the_same_in_every_process():
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", _HASH_SCRIPT, str(n)], capture_output=True,
                           text=True, timeout=300, check=True).stdout.split()
            for n in (0, 3)]
    assert len(runs[0]) == 2 and runs[0] == runs[1]


def assign_unicode(words, recs):
    i = cuda.grid(1)
    if i < words.size:
        words[i] = "XYZ"
    if i == 0:
        recs[0]["x"] = 1
        recs[0]["y"] = "ABC"


def assign_bytes(words, recs):
    i = cuda.grid(1)
    if i < words.size:
        words[i] = b"XYZ"
    if i == 0:
        recs[0]["x"] = 1
        recs[0]["y"] = b"ABC"


STRINGS = {  # numba-cuda's test_const_string cases: kernel, element dtype, record dtype
    "unicode": (assign_unicode, "<U12", np.dtype([("x", np.int32), ("y", "<U12")])),
    "bytes": (assign_bytes, "S12", np.dtype([("x", np.float32), ("y", "S12")], align=True)),
}


@pytest.mark.parametrize("case", STRINGS)
def test_fixed_width_string_arrays_and_fields_type_as_numba_types_them(case, simulate):
    from numba.cuda.typing.typeof import Purpose, typeof

    from daskgpu._compiler.signatures import typeof_args

    kernel, word, record = STRINGS[case]
    words, recs = np.zeros(3, word), np.zeros(1, record)
    assert typeof_args((words, recs)) == tuple(typeof(a, Purpose.argument) for a in (words, recs))
    k = dg.jit(kernel)
    got_words, got_recs = k.forall(3)(words, recs)
    np.testing.assert_array_equal(got_words, np.full(3, "XYZ", word))
    np.testing.assert_array_equal(got_recs, np.array([(1, "ABC")], record))
    (image,) = pickle.loads(pickle.dumps(k)).images
    assert image.args[0].np_dtype == np.dtype(word) and image.args[1].np_dtype == record
    assert "expects dtype S12" in str(mismatch(ArgSpec("array", "S12", 1, "C"), np.zeros(1, "S4")))


@pytest.mark.gpu
@pytest.mark.parametrize("case", STRINGS)
@pytest.mark.parametrize("where", ["host", "device"])
def test_fixed_width_strings_match_numba(case, where):
    kernel, word, record = STRINGS[case]
    put = cuda.to_device if where == "device" else np.copy
    words, recs = put(np.zeros(5, word)), put(np.zeros(2, record))
    k = pickle.loads(pickle.dumps(dg.jit(kernel).specialize(words, recs)))
    k.forall(5)(words, recs)
    want_words, want_recs = np.zeros(5, word), np.zeros(2, record)
    cuda.jit(kernel).forall(5)(want_words, want_recs)
    if where == "device":
        words, recs = words.copy_to_host(), recs.copy_to_host()
    np.testing.assert_array_equal(words, want_words)
    np.testing.assert_array_equal(recs, want_recs)
    assert want_words[0] and want_recs[0]["y"]  # numba wrote them: not zeros on both sides
