"""Launches: the launch syntax, what a pickled launch carries, and what a launch returns."""

import inspect
import marshal
import pickle
import subprocess
import sys
import textwrap

import dask
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._image.launch_config import LaunchConfig
from daskgpu._runtime.launch import Launch, written_result
from daskgpu._runtime.ptx_kernel import PTXKernel

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


def saxpy_py(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]  # a-distinctive-source-line


saxpy = dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
                "void(float64[:], float64, float64[:], float64[:])"])(saxpy_py)


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
    for n in range(2, 2 + 3 * dg._runtime.launch.LAUNCHES_KEPT):
        k[n, 1]
        assert len(k._launches) <= dg._runtime.launch.LAUNCHES_KEPT  # bounded
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
        by_value = pickle.dumps(saxpy[4, 128])
    assert scale_py.__code__.co_code in blob
    back = pickle.loads(blob)
    assert all(im.py_func is not None for im in back.kernel.images)
    loaded = cloudpickle.loads(back.kernel.images[0].py_func)
    assert loaded.__code__.co_code == scale_py.__code__.co_code
    # A function importable from its module travels by value all the same: a worker's
    # own import of the module may predate an edit of it.
    assert saxpy_py.__code__.co_code in by_value
    images = pickle.loads(by_value).kernel.images
    assert all(cloudpickle.loads(im.py_func) is not saxpy_py for im in images)
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


@pytest.mark.slow
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


# -- what a launch returns ------------------------------------------------------------------


def test_written_result():
    a, b, c = object(), object(), object()
    assert written_result((a, b, c), ()) is None
    assert written_result((a, b, c), (1,)) is b
    assert written_result((a, b, c), (0, 2)) == (a, c)


@dg.jit("void(float32[::1])")
def _halve(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] /= 2


def test_a_time_limit_takes_numpys_numbers_and_refuses_what_cannot_be_waited():
    import numpy as np

    for seconds, limit in ((np.float32(2), 2.0), (np.int64(5), 5.0), (np.float64(0.5), 0.5),
                           (3, 3.0)):
        launch = _halve.configure(1, 8, timeout=seconds)
        assert launch.timeout == limit and type(launch.timeout) is float
        assert _halve.forall(8, timeout=seconds).timeout == limit
    for refused in (True, np.bool_(True), float("nan"), np.float32("nan"), 0, -1.0,
                    float("inf"), np.inf, "5", [5]):
        with pytest.raises(dg.LaunchConfigError, match=r"timeout=.*: give the most seconds "
                           r"a task running the launch may take, a finite number above 0"):
            _halve.configure(1, 8, timeout=refused)
