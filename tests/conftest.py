import functools
import os
import sys

import pytest
from numba import cuda

# Test helper modules in this folder (restart_helpers) import by name, also in the
# worker processes the tests spawn: the suite imports in importlib mode, which puts
# no test folder on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def gpu_available() -> bool:
    from daskgpu._runtime.gpu.driver import device_count

    return device_count()[0] > 0


def pytest_collection_modifyitems(config, items):
    # `gpu` tests need a device; `nogpu` tests check what happens without one.
    unwanted, reason = ("nogpu", "checks the no-GPU case") if gpu_available() else (
        "gpu", "needs a CUDA GPU")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        # The marker itself: item.keywords also holds folder names (tests/runtime/gpu/).
        if item.get_closest_marker(unwanted) is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def plus_one_ptx(tmp_path_factory):
    """A PTX file defining device function ``plus_one`` with Numba's ABI (no GPU needed)."""
    from numba import cuda

    def plus_one(x):
        return x + 1

    ptx, _ = cuda.compile_ptx(plus_one, "int32(int32)", device=True, cc=(7, 5),
                              abi_info={"abi_name": "plus_one"})
    path = tmp_path_factory.mktemp("link") / "plus_one.ptx"
    path.write_text(ptx)
    return path


# -- the kernels the bundle tests save and load (tests/image, tests/runtime) ------

def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a * x[i] + y[i]


def fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


@pytest.fixture(scope="session")
def bundle_kernels():
    """A two-signature saxpy with options and targets, and a one-signature fill."""
    import types

    import daskgpu as dg

    dg._config.register()
    return types.SimpleNamespace(
        saxpy=dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
                      "void(float64[:], float64, float64[:], float64[:])"],
                     targets=["7.5", "9.0"], fastmath=True, max_registers=64)(saxpy),
        fill=dg.jit("void(float32[::1])")(fill),
    )


@pytest.fixture
def bundle(tmp_path, bundle_kernels):
    """The saxpy of :func:`bundle_kernels`, saved to a bundle file."""
    import daskgpu as dg

    path = tmp_path / "saxpy.dgk"
    dg.save(bundle_kernels.saxpy, path)
    return path
