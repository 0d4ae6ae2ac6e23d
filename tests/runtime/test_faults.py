"""Device exceptions of debug kernels, rebuilt from the image's plain-data table."""

import sys

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime.faults import device_exception


def _raising(a, n):
    i = cuda.grid(1)
    if i == 3 and n > 1:
        raise ValueError("n too big")
    if i < a.size:
        a[i] = n


RAISING = dg.jit("void(float32[::1], int32)", debug=True, opt=False)(_raising)
#: Where device_exception says an exception of a table without lines was raised.
SITE = "kernel '_raising', thread (0, 0, 0) of block (0, 0, 0): tid=[0, 0, 0] ctaid=[0, 0, 0]"


def test_debug_image_carries_its_exception_table_as_plain_data():
    (code, cls, args, loc), = RAISING.images[0].exceptions
    assert (cls, args) == ("ValueError", ("n too big",))
    assert loc[0] == "_raising" and loc[1].endswith("test_faults.py") and loc[2] > 0
    assert isinstance(code, int)
    # The globals the worker reads after a debug launch, by these exact names.
    image = RAISING.images[0]
    for suffix in ("__errcode__", "__tidx__", "__tidz__", "__ctaidx__", "__ctaidz__"):
        assert image.entry + suffix in image.ptx[0][1]


def test_images_without_debug_carry_no_table():
    assert dg.jit("void(float32[::1], int32)")(_raising).images[0].exceptions == ()


def test_exception_is_rebuilt_as_numba_raises_it():
    image = RAISING.images[0]
    code = image.exceptions[0][0]
    exc = device_exception(image, code, [0, 0, 3], [0, 0, 0])  # (z, y, x), as Numba's globals
    assert type(exc) is ValueError
    line = image.exceptions[0][3][2]
    # daskgpu's words (thread and block as x, y, z), then Numba's (z, y, x).
    assert str(exc) == ("kernel '_raising', thread (3, 0, 0) of block (0, 0, 0): In function "
                        f"'_raising', file {__file__}, line {line}, tid=[0, 0, 3] ctaid=[0, 0, 0]: "
                        "n too big")


def test_the_message_still_matches_what_numba_cudas_tests_match():
    # numba-cuda's test_userexc, which the conformance suite runs through daskgpu.
    import re

    def test_exc(x):
        if x == 1:
            raise KernelError
        elif x == 2:
            raise KernelError("foo")

    image = dg.jit("void(int32)", debug=True, opt=False)(test_exc).images[0]
    pattern = r'In function [\'"]test_exc[\'"], file [\:\.\/\\\-a-zA-Z_0-9]+, line \d+'
    assert sorted(args for _, _, args, _ in image.exceptions) == [(), ("foo",)]
    for code, _, args, _ in image.exceptions:
        exc = device_exception(image, code, [0, 0, 0], [0, 0, 0], ((1, 1, 1), (1, 1, 1)))
        assert type(exc) is KernelError and re.search(pattern, str(exc))
        assert "tid=[0, 0, 0] ctaid=[0, 0, 0]" + (": foo" if args else "") in str(exc)
        assert str(exc).startswith("kernel 'test_exc'<<<(1, 1, 1), (1, 1, 1)>>>, thread (0, 0, 0)")


def test_unknown_code_and_unknown_class():
    image = RAISING.images[0]
    exc = device_exception(image, 999, [0, 0, 0], [0, 0, 1])
    assert type(exc) is SystemError and "unknown error 999" in str(exc)
    odd = image.__class__(**{**{f: getattr(image, f) for f in (
        "name", "entry", "ptx", "args", "writes", "grid_ndim", "links", "options", "versions")},
        "exceptions": ((1, "MyKernelError", ("boom",), None),)})
    exc = device_exception(odd, 1, [0, 0, 0], [0, 0, 0])
    assert isinstance(exc, dg.DeviceError)
    assert str(exc) == f"{SITE}: MyKernelError: boom"


def test_exception_table_survives_pickle_and_bundle(tmp_path):
    import pickle

    shipped = pickle.loads(pickle.dumps(RAISING.configure(1, 8)))
    assert shipped.kernel.images[0].exceptions == RAISING.images[0].exceptions
    dg.save(RAISING, tmp_path / "r.dgk")
    assert dg.load(tmp_path / "r.dgk").images[0] == RAISING.images[0]


@pytest.mark.gpu
def test_debug_kernel_raises_on_the_gpu():
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError) as info:
        RAISING[1, 8](a, 5)
    line = RAISING.images[0].exceptions[0][3][2]
    assert str(info.value) == ("kernel '_raising'<<<(1, 1, 1), (8, 1, 1)>>>, thread (3, 0, 0) of "
                               f"block (0, 0, 0): In function '_raising', file {__file__}, line "
                               f"{line}, tid=[0, 0, 3] ctaid=[0, 0, 0]: n too big")
    assert (RAISING[1, 8](a, 1) == 1).all()  # the context is fine afterwards


class KernelError(Exception):
    pass


def _raises_user_class(a):
    if cuda.grid(1) == 0:
        raise KernelError("mine")


def test_a_user_exception_class_is_named_by_module_and_qualname():
    image = dg.jit("void(float32[::1])", debug=True, opt=False)(_raises_user_class).images[0]
    (code, name, args, _), = image.exceptions
    assert name == f"{__name__}:KernelError" and args == ("mine",)
    exc = device_exception(image, code, [0, 0, 0], [0, 0, 0])
    line = image.exceptions[0][3][2]
    assert type(exc) is KernelError
    assert str(exc) == ("kernel '_raises_user_class', thread (0, 0, 0) of block (0, 0, 0): In "
                        f"function '_raises_user_class', file {__file__}, line {line}, "
                        "tid=[0, 0, 0] ctaid=[0, 0, 0]: mine")


def test_a_local_user_class_resolves_in_the_compiling_process():
    class LocalError(Exception):
        pass

    def k(a):
        if cuda.grid(1) == 0:
            raise LocalError

    image = dg.jit("void(float32[::1])", debug=True, opt=False)(k).images[0]
    assert "<locals>" in image.exceptions[0][1]
    exc = device_exception(image, image.exceptions[0][0], [0, 0, 0], [0, 0, 0])
    assert type(exc) is LocalError and str(exc).startswith("kernel 'k', thread (0, 0, 0) of ")


@pytest.mark.parametrize("name", ["builtins:SystemExit", "builtins:KeyboardInterrupt",
                                  "os:system", "not_imported_module_xyz:Error",
                                  f"{__name__}:_raising"])
def test_names_that_are_not_exception_classes_here_become_device_errors(name):
    image = RAISING.images[0]
    odd = image.__class__(**{**{f: getattr(image, f) for f in (
        "name", "entry", "ptx", "args", "writes", "grid_ndim", "links", "options", "versions")},
        "exceptions": ((1, name, ("boom",), None),)})
    exc = device_exception(odd, 1, [0, 0, 0], [0, 0, 0])
    assert type(exc) is dg.DeviceError
    assert str(exc) == f"{SITE}: {name.replace(':', '.')}: boom"


def test_a_user_class_survives_a_bundle(tmp_path):
    k = dg.jit("void(float32[::1])", debug=True, opt=False)(_raises_user_class)
    dg.save(k, tmp_path / "u.dgk")
    image = dg.load(tmp_path / "u.dgk").images[0]
    assert type(device_exception(image, image.exceptions[0][0], [0] * 3, [0] * 3)) is KernelError


# -- only classes a kernel may raise: not what the worker's own stack acts on -------
from distributed import Reschedule  # noqa: E402


class RescheduleLike(Reschedule):
    """A user class that distributed would still reschedule: its base counts."""


def _raises_reschedule(a):
    if cuda.grid(1) == 0:
        raise Reschedule("again")


def _with_table(name):
    image = RAISING.images[0]
    return image.__class__(**{**{f: getattr(image, f) for f in (
        "name", "entry", "ptx", "args", "writes", "grid_ndim", "links", "options", "versions")},
        "exceptions": ((1, name, ("boom",), None),)})


@pytest.mark.parametrize("name", ["distributed:Reschedule", "distributed.exceptions:Reschedule",
                                  "daskgpu._errors:ContextLostError",
                                  f"{__name__}:RescheduleLike", f"{__name__}:Reschedule"])
def test_classes_the_worker_acts_on_become_device_errors(name):
    # Reschedule would have a failing debug kernel rescheduled forever; a subclass or a
    # re-export of it (this module imports it) is the same class to distributed.
    exc = device_exception(_with_table(name), 1, [0, 0, 0], [0, 0, 0])
    assert type(exc) is dg.DeviceError
    assert str(exc) == f"{SITE}: {name.replace(':', '.')}: boom"


def test_a_compiled_reschedule_is_a_device_error_and_cannot_be_saved(tmp_path):
    k = dg.jit("void(float32[::1])", debug=True, opt=False)(_raises_reschedule)
    image = k.images[0]
    assert image.exceptions[0][1] == "distributed.exceptions:Reschedule"
    exc = device_exception(image, image.exceptions[0][0], [0, 0, 0], [0, 0, 0])
    assert type(exc) is dg.DeviceError and "distributed.exceptions.Reschedule: again" in str(exc)
    with pytest.raises(dg.BundleError, match="may not raise the classes of 'distributed'"):
        dg.save(k, tmp_path / "r.dgk")


@pytest.mark.parametrize("name", ["StopIteration", "MemoryError", "SystemExit"])
def test_builtins_beyond_the_allow_list_become_device_errors(name):
    # StopIteration raised by a launch inside map() or a generator would end it silently.
    assert type(device_exception(_with_table(name), 1, [0, 0, 0], [0, 0, 0])) is dg.DeviceError


def test_a_user_class_in_the_cuda_namespace_comes_back_as_itself(monkeypatch):
    # numba-cuda's own test modules live in the `cuda` namespace (its conformance
    # test_userexc raises cuda.tests.cudapy.test_userexc.MyError); only cuda-python's
    # packages in it are reserved.
    import types

    module = types.ModuleType("cuda.user_kernels_xyz")

    class MyError(Exception):
        pass

    MyError.__module__ = module.__name__
    module.MyError = MyError
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exc = device_exception(_with_table("cuda.user_kernels_xyz:MyError"), 1, [0, 0, 0],
                           [0, 0, 0])
    assert type(exc) is MyError and str(exc) == f"{SITE}: boom"
    refused = device_exception(_with_table("cuda.core.experimental:CUDAError"), 1,
                               [0, 0, 0], [0, 0, 0])
    assert type(refused) is dg.DeviceError
