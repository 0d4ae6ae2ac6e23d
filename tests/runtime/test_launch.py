"""Launch configurations, launches, argument matching, and what a pickled launch carries."""

import inspect
import marshal
import pickle
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime.launch import (
    Launch,
    LaunchConfig,
    PTXKernel,
    select_image,
    written_result,
)

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


def saxpy_py(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]  # a-distinctive-source-line


saxpy = dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
                "void(float64[:], float64, float64[:], float64[:])"])(saxpy_py)


@dg.jit("void(int8[::1], int8)")
def put8(out, v):
    out[0] = v


# -- LaunchConfig ------------------------------------------------------------------------


def test_config_dims_are_padded_to_three():
    c = LaunchConfig(4, (128, 2))
    assert c.griddim == (4, 1, 1) and c.blockdim == (128, 2, 1)
    assert LaunchConfig([2, 3, 4], 1).griddim == (2, 3, 4)
    assert LaunchConfig(np.int64(3), np.int32(32)).griddim == (3, 1, 1)


def test_config_value_semantics():
    a, b = LaunchConfig(4, 128), LaunchConfig((4,), (128, 1, 1))
    assert a == b and hash(a) == hash(b)
    assert a != LaunchConfig(4, 64)
    assert a != LaunchConfig(4, 128, 0, 1024)
    assert LaunchConfig(4, 128, None) == a  # None and 0 are both the default stream
    assert LaunchConfig(ntasks=10) == LaunchConfig(ntasks=10)
    assert LaunchConfig(ntasks=10) != LaunchConfig(ntasks=10, tpb=64)
    assert LaunchConfig(ntasks=(10, 5)) == LaunchConfig(ntasks=[10, 5])
    assert a != (4, 128) and a != LaunchConfig(ntasks=512)
    assert len({a, b, LaunchConfig(4, 64)}) == 2


def test_config_with_an_int_stream_compares_by_value():
    handle = 2**40 + 12345
    a = LaunchConfig(1, 32, int(str(handle)))
    b = LaunchConfig(1, 32, int(str(handle)))
    assert a.stream is not b.stream
    assert a == b and hash(a) == hash(b)
    assert a != LaunchConfig(1, 32, handle + 1)


def test_config_with_a_stream_object_compares_by_identity():
    s1, s2 = object(), object()
    assert LaunchConfig(1, 32, s1) == LaunchConfig(1, 32, s1)
    assert LaunchConfig(1, 32, s1) != LaunchConfig(1, 32, s2)
    assert LaunchConfig(1, 32, s1) != LaunchConfig(1, 32)


def test_config_repr():
    assert repr(LaunchConfig(4, 128)) == "LaunchConfig(griddim=(4, 1, 1), blockdim=(128, 1, 1))"
    assert repr(LaunchConfig(2, (8, 8), 0, 256)) == (
        "LaunchConfig(griddim=(2, 1, 1), blockdim=(8, 8, 1), sharedmem=256)")
    assert repr(LaunchConfig(ntasks=1000)) == "LaunchConfig(ntasks=1000)"
    assert repr(LaunchConfig(ntasks=(10, 20), tpb=64)) == "LaunchConfig(ntasks=(10, 20), tpb=64)"
    assert repr(LaunchConfig(1, 1, 7)) == "LaunchConfig(griddim=(1, 1, 1), blockdim=(1, 1, 1), stream=7)"


@pytest.mark.parametrize("kwargs, match", [
    (dict(griddim=0, blockdim=1), r"griddim 0 has a dimension below 1"),
    (dict(griddim=(4, 0), blockdim=1), r"griddim \(4, 0\) has a dimension below 1"),
    (dict(griddim=1, blockdim=-32), r"blockdim -32 has a dimension below 1"),
    (dict(griddim=(1, 1, 1, 1), blockdim=1), r"griddim must have 1 to 3 dimensions, got \(1, 1, 1, 1\)"),
    (dict(griddim=1, blockdim=(2, 2, 2, 2)), r"blockdim must have 1 to 3 dimensions"),
    (dict(griddim=(), blockdim=1), r"griddim must have 1 to 3 dimensions, got \(\)"),
    (dict(griddim=1.5, blockdim=1), r"griddim must be integers, got 1\.5"),
    (dict(griddim=1, blockdim="32"), r"blockdim must be integers, got '32'"),
    (dict(griddim=1), r"a launch needs both griddim and blockdim"),
    (dict(blockdim=1), r"a launch needs both griddim and blockdim"),
    (dict(griddim=1, blockdim=1, sharedmem=-1), r"sharedmem must be non-negative, got -1"),
    (dict(ntasks=-1), r"forall ntasks must be 1 to 3 non-negative integers, got -1"),
    (dict(ntasks=(1, 2, 3, 4)), r"forall ntasks must be 1 to 3"),
    (dict(ntasks=()), r"forall ntasks must be 1 to 3"),
    (dict(ntasks=10, tpb=-1), r"tpb must be 0 \(automatic\) or positive, got -1"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(dg.LaunchConfigError, match=match) as info:
        LaunchConfig(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, dg.DaskGPUError)


def test_config_pickles_without_a_stream_only():
    for c in (LaunchConfig(4, (8, 8), 0, 64), LaunchConfig(ntasks=(3, 4), tpb=16)):
        back = pickle.loads(pickle.dumps(c))
        assert back == c and repr(back) == repr(c)
    with pytest.raises(dg.PicklingError, match=r"bound to a CUDA stream.*configure it without a stream"):
        pickle.dumps(LaunchConfig(1, 1, 5))


# -- launch syntax -----------------------------------------------------------------------


def test_launch_syntax_makes_launches():
    assert saxpy[4, 128].config == LaunchConfig(4, 128)
    assert saxpy[4, 128, 0, 512].config == LaunchConfig(4, 128, 0, 512)
    assert saxpy.configure((2, 2), (16, 16)).config == LaunchConfig((2, 2), (16, 16))
    assert saxpy.forall(1000).config == LaunchConfig(ntasks=1000)
    assert saxpy.forall((10, 10), tpb=64).config == LaunchConfig(ntasks=(10, 10), tpb=64)
    launch = saxpy[1, 1]
    assert isinstance(launch, Launch) and launch.kernel is saxpy
    assert launch.__name__ == "saxpy_py"
    assert repr(launch) == "<Launch saxpy_py LaunchConfig(griddim=(1, 1, 1), blockdim=(1, 1, 1))>"


def test_a_kernel_reuses_its_launch_per_configuration():
    # kernel[grid, block](...) in a loop reuses one Launch, and with it the
    # runtime's fast path for repeats.
    k = dg.jit(saxpy_py)
    assert k[4, 128] is k[4, 128] is k.configure(4, 128)
    assert k.forall(1000) is k.forall(1000)
    assert k.forall(1000) is not k.forall(1001)
    assert k[4, 128] is not k[4, 128, 0, 256]
    assert k[[4], [128]] is not k[[4], [128]]  # unhashable dimensions: made afresh
    stream = object()
    assert k[4, 128, stream] is not k[4, 128, stream]  # streams are never kept alive
    first = k[1, 1]
    for n in range(2, 2 + 3 * dg._runtime.launch._LAUNCHES_KEPT):
        k[n, 1]
        assert len(k._launches) <= dg._runtime.launch._LAUNCHES_KEPT  # bounded
    assert k[1, 1] is not first  # dropped on the way


@pytest.mark.parametrize("index", [1, (1,), (1, 2, 3, 4, 5)])
def test_bad_launch_syntax(index):
    with pytest.raises(dg.LaunchConfigError, match=r"launch as kernel\[griddim, blockdim\]"):
        saxpy[index]


def test_launch_pickle_round_trip():
    launch = saxpy.forall(1000, tpb=128)
    back = pickle.loads(pickle.dumps(launch))
    assert isinstance(back, Launch)
    assert back.config == launch.config
    assert isinstance(back.kernel, PTXKernel)
    assert back.kernel.images == saxpy.images
    assert [im.hash for im in back.kernel.images] == [im.hash for im in saxpy.images]
    assert back.__name__ == "saxpy_py"
    again = pickle.loads(pickle.dumps(back))
    assert again.config == launch.config and again.kernel.images == saxpy.images


def test_ptx_kernel_needs_images():
    with pytest.raises(dg.PicklingError, match="at least one compiled image"):
        PTXKernel([])
    k = PTXKernel(saxpy.images)
    assert k.signatures == saxpy.signatures
    assert repr(k) == f"<PTXKernel saxpy_py signatures={saxpy.signatures}>"


# -- what a pickled launch carries ---------------------------------------------------------


def _source_lines(fn):
    return [line.strip() for line in inspect.getsource(fn).splitlines() if len(line.strip()) > 8]


def _local_kernel():
    # Defined in a function, so cloudpickle cannot pickle it by reference and,
    # when it travels, its code travels by value.
    def scale_py(x, a):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = x[i] * a + 1.0  # another-distinctive-line

    return scale_py, dg.jit("void(float64[::1], float64)")(scale_py)


scale_py, scale = _local_kernel()


@pytest.mark.parametrize("fn, kernel", [(saxpy_py, saxpy), (scale_py, scale)])
def test_pickled_launch_has_no_python_function(fn, kernel):
    blob = pickle.dumps(kernel[4, 128])
    code = fn.__code__
    assert len(code.co_code) > 16
    assert code.co_code not in blob
    assert marshal.dumps(code) not in blob
    assert b"py_func" not in blob
    assert b"cloudpickle" not in blob
    for line in _source_lines(fn):
        assert line.encode() not in blob, line
    assert b"distinctive" not in blob


def test_pickled_launch_carries_the_function_only_when_simulating():
    import cloudpickle

    with dask.config.set({"daskgpu.simulate": True}):
        blob = pickle.dumps(scale[4, 128])
        by_reference = pickle.dumps(saxpy[4, 128])
    assert scale_py.__code__.co_code in blob
    back = pickle.loads(blob)
    assert all(im.py_func is not None for im in back.kernel.images)
    loaded = cloudpickle.loads(back.kernel.images[0].py_func)
    assert loaded.__code__.co_code == scale_py.__code__.co_code
    # A function importable from its module travels as a reference to it.
    images = pickle.loads(by_reference).kernel.images
    assert all(cloudpickle.loads(im.py_func) is saxpy_py for im in images)
    # Simulation is a setting of the moment: off again, nothing but PTX travels.
    assert scale_py.__code__.co_code not in pickle.dumps(scale[4, 128])
    assert all(im.py_func is None for im in pickle.loads(pickle.dumps(scale)).images)


_UNPICKLE_WITHOUT_NUMBA = textwrap.dedent("""
    import pickle, sys
    sys.modules["numba"] = None
    launch = pickle.loads(sys.stdin.buffer.read())
    k = launch.kernel
    print(type(k).__name__)
    print(k.signatures)
    print([im.hash for im in k.images])
    print([im.writes for im in k.images])
    print([im.py_func is not None for im in k.images])
    print(launch.config)
    print(sorted(m for m, v in sys.modules.items() if m.startswith("numba") and v is not None))
""")


@pytest.mark.parametrize("simulate", [False, True])
def test_unpickle_launch_without_numba(simulate):
    with dask.config.set({"daskgpu.simulate": simulate}):
        blob = pickle.dumps(saxpy.forall(100))
    out = subprocess.run([sys.executable, "-c", _UNPICKLE_WITHOUT_NUMBA], input=blob,
                         capture_output=True, check=True).stdout.decode().splitlines()
    assert out == [
        "PTXKernel",
        str(saxpy.signatures),
        str([im.hash for im in saxpy.images]),
        str([im.writes for im in saxpy.images]),
        str([simulate] * len(saxpy.images)),
        "LaunchConfig(ntasks=100)",
        "[]",
    ]


# -- matching arguments to signatures -----------------------------------------------------


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
    with pytest.raises(TypeError, match=r"matches the arguments \(float32\[::1\] \(host\), float\)"):
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


# -- what a launch returns ------------------------------------------------------------------


def test_written_result():
    a, b, c = object(), object(), object()
    assert written_result((a, b, c), ()) is None
    assert written_result((a, b, c), (1,)) is b
    assert written_result((a, b, c), (0, 2)) == (a, c)
