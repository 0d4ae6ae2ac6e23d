"""The client's one door: every form of a kernel a user has becomes one daskgpu launches."""

import pytest
from kit.kernels import SAXPY_SIG, saxpy
from numba import cuda

import daskgpu as dg
from daskgpu._compiler.as_kernel import as_kernel


def test_a_kernel_and_a_loaded_bundle_pass_as_they_are(tmp_path):
    assert as_kernel(saxpy) is saxpy
    dg.save(saxpy, tmp_path / "k.dgk")
    loaded = dg.load(tmp_path / "k.dgk")
    assert as_kernel(loaded) is loaded
    assert as_kernel(tmp_path / "k.dgk").signatures == saxpy.signatures


def test_a_dispatcher_and_a_function_compile_as_asked():
    dispatcher = cuda.jit(saxpy.py_func)
    assert as_kernel(dispatcher, [SAXPY_SIG]).signatures == saxpy.signatures
    lazy = as_kernel(saxpy.py_func)
    assert isinstance(lazy, dg.Kernel) and lazy.signatures == []
    assert as_kernel(saxpy, fastmath=True).options.fastmath


def test_a_ptx_only_kernel_compiles_nothing_new(tmp_path):
    dg.save(saxpy, tmp_path / "k.dgk")
    with pytest.raises(TypeError, match=r"a PTX-only kernel, compiled already \(a loaded "
                                        r"bundle\): it cannot compile new signatures"):
        as_kernel(dg.load(tmp_path / "k.dgk"), [SAXPY_SIG])


@pytest.mark.parametrize("thing", [42, len, saxpy.forall(4)], ids=["int", "builtin", "launch"])
def test_what_is_no_kernel_is_refused(thing):
    with pytest.raises(TypeError, match=f": a {type(thing).__name__}$"):
        as_kernel(thing)
