"""Kernel errors say where, in the first line a user catches: simulated launches.

The kernel, its grid and block (``<<<grid, block>>>``), the ``map_kernel``
chunk when the launch runs in one, the thread and block that raised and the
source line; the exception keeps the kernel's class. The GPU path's tests are
in tests/runtime/gpu/test_kernel_errors_gpu.py.
"""

import inspect

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime import faults

pytestmark = pytest.mark.usefixtures("simulate")  # every test here runs simulated


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _too_large(a):
    i = cuda.grid(1)
    if i == 103:
        raise ValueError("value too large")
    if i < a.size:
        a[i] = i


TOO_LARGE = dg.jit("void(float32[::1])", debug=True, opt=False)(_too_large)
RAISE_LINE = _line_of(_too_large, "raise ValueError")


def test_a_raise_names_the_kernel_launch_thread_block_and_line():
    with pytest.raises(ValueError) as info:
        TOO_LARGE[2, 64](np.zeros(128, np.float32))
    assert type(info.value) is ValueError
    assert str(info.value) == (
        "kernel '_too_large'<<<(2, 1, 1), (64, 1, 1)>>>, thread (39, 0, 0) of block (1, 0, 0), "
        f"at {__file__}:{RAISE_LINE}: tid=[39, 0, 0] ctaid=[1, 0, 0]: value too large")


def test_a_forall_launch_names_the_grid_it_ran():
    with pytest.raises(ValueError, match=r"^kernel '_too_large'<<<\(2, 1, 1\), \(64, 1, 1\)>>>, "
                                         r"thread \(39, 0, 0\) of block \(1, 0, 0\)"):
        TOO_LARGE.forall(128, tpb=64)(np.zeros(128, np.float32))


def test_in_a_chunk_the_message_names_the_chunk_and_adds_no_note():
    with pytest.raises(ValueError) as info:
        with faults.in_chunk("_too_large", (3,), (128,), (384,)):
            TOO_LARGE[2, 64](np.zeros(128, np.float32))
    assert str(info.value).startswith(
        "kernel '_too_large'<<<(2, 1, 1), (64, 1, 1)>>> on chunk (3,) at offset (384,), "
        "thread (39, 0, 0) of block (1, 0, 0), at ")
    assert getattr(info.value, "__notes__", []) == []
    # Outside the chunk, launches name none.
    with pytest.raises(ValueError) as info:
        TOO_LARGE[2, 64](np.zeros(128, np.float32))
    assert "chunk" not in str(info.value)


def test_other_errors_in_a_chunk_get_the_chunk_as_a_note():
    with pytest.raises(TypeError) as info:
        with faults.in_chunk("_too_large", (3,), (128,), (384,)):
            TOO_LARGE[2, 64]("not an array")
    assert "daskgpu.map_kernel: launching _too_large on chunk (3,) of shape (128,), offset " \
           "(384,)" in info.value.__notes__


def _index_2d(a):
    x, y = cuda.grid(2)
    if x == 3 and y == 5:
        a[x, y + 100] = 1.0  # past the array: an illegal address on a GPU


def test_a_fault_in_a_2d_kernel_names_thread_and_block_as_x_y_z():
    kernel = dg.jit("void(float32[:, ::1])")(_index_2d)
    with pytest.raises(IndexError) as info:
        kernel[(2, 3), (4, 4)](np.zeros((8, 12), np.float32))
    line = _line_of(_index_2d, "y + 100")
    assert str(info.value).startswith(
        "kernel '_index_2d'<<<(2, 3, 1), (4, 4, 1)>>>, thread (3, 1, 0) of block (0, 1, 0), "
        f"at {__file__}:{line}: ")
    assert "out of bounds" in str(info.value)


class CodedError(Exception):
    """A user class whose constructor takes more than a message."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


def _coded(a):
    if cuda.grid(1) == 5:
        raise CodedError(42, "bad input")


def test_a_user_class_keeps_its_class_and_attributes():
    # Numba's simulator rebuilds an exception from its class and text, which
    # this class's constructor refuses: the failure used to vanish.
    kernel = dg.jit("void(float32[::1])")(_coded)
    with pytest.raises(CodedError) as info:
        kernel[1, 8](np.zeros(8, np.float32))
    assert info.value.code == 42
    assert str(info.value).startswith("kernel '_coded'<<<(1, 1, 1), (8, 1, 1)>>>, thread (5, 0, 0)")
    assert str(info.value).endswith(": bad input")


def _helper_raises(n):
    if n == 2:
        raise ValueError("from the helper")
    return n


helper = cuda.jit(device=True)(_helper_raises)


def _calls_helper(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = helper(i)


def test_the_line_is_the_device_function_s_when_it_raised_there():
    kernel = dg.jit("void(float32[::1])")(_calls_helper)
    with pytest.raises(ValueError) as info:
        kernel[1, 4](np.zeros(4, np.float32))
    line = _line_of(_helper_raises, "raise ValueError")
    assert f"thread (2, 0, 0) of block (0, 0, 0), at {__file__}:{line}: tid=[2, 0, 0] " \
           "ctaid=[0, 0, 0]: from the helper" in str(info.value)


def test_a_shipped_image_names_its_kernel_too():
    import pickle

    launch = pickle.loads(pickle.dumps(TOO_LARGE[2, 64]))  # carries its function: simulated
    with pytest.raises(ValueError, match=r"^kernel '_too_large'<<<\(2, 1, 1\), \(64, 1, 1\)>>>, "
                                         r"thread \(39, 0, 0\) of block \(1, 0, 0\)"):
        launch(np.zeros(128, np.float32))


def _past_the_end(a):
    i = cuda.grid(1)
    a[i + 4] = 1.0


def test_a_shipped_image_s_error_names_the_user_s_file_and_line():
    # The shipped function is pickled by value, and cloudpickle names its code's file
    # "<dynamic-code>": the error named <dynamic-code>:N rather than this file.
    import pickle

    kernel = dg.jit("void(float32[::1])")(_past_the_end)
    launch = pickle.loads(pickle.dumps(kernel[1, 4]))
    with pytest.raises(IndexError) as info:
        launch(np.zeros(4, np.float32))
    line = _line_of(_past_the_end, "a[i + 4]")
    assert f"of block (0, 0, 0), at {__file__}:{line}: tid=[0, 0, 0]" in str(info.value)


def test_a_launch_after_a_failed_one_runs():
    with pytest.raises(ValueError):
        TOO_LARGE[2, 64](np.zeros(128, np.float32))
    out = TOO_LARGE[1, 64](np.zeros(64, np.float32))
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float32))


def _huge_shared(a):
    buf = cuda.shared.array(100_000, np.float32)
    buf[0] = 1.0


def test_a_launch_the_device_refuses_keeps_its_own_message():
    # Not a thread's fault: the simulator's shared-memory check speaks for the launch.
    kernel = dg.jit("void(float32[::1])")(_huge_shared)
    with pytest.raises(dg.LaunchConfigError, match=r"^kernel '_huge_shared' asks for 400000 "
                                                   r"bytes of shared memory per block"):
        kernel[1, 1](np.zeros(4, np.float32))
