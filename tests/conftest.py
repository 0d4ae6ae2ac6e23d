import functools

import pytest


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
