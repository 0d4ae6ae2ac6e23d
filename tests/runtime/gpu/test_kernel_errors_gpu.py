"""On a GPU: kernel errors say where, in the first line a user catches.

A ``raise`` in a ``debug=True`` kernel (Numba's exception globals, read back
by the runtime) and an illegal address the driver reports. The simulated
path's tests are in tests/runtime/test_kernel_errors.py.
"""

import inspect
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime import faults

pytestmark = pytest.mark.gpu


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _too_large_2d(a):
    x, y = cuda.grid(2)
    if x == 3 and y == 5:
        raise ValueError("value too large")
    if x < a.shape[0] and y < a.shape[1]:
        a[x, y] = 1.0


TOO_LARGE_2D = dg.jit("void(float32[:, ::1])", debug=True, opt=False)(_too_large_2d)


def test_a_raise_names_the_kernel_launch_thread_block_and_line():
    with pytest.raises(ValueError) as info:
        TOO_LARGE_2D[(2, 3), (4, 4)](np.zeros((8, 12), np.float32))
    assert type(info.value) is ValueError
    line = _line_of(_too_large_2d, "raise ValueError")
    # daskgpu's words, x, y, z as CUDA's threadIdx and blockIdx; then Numba's, z, y, x.
    assert str(info.value) == (
        "kernel '_too_large_2d'<<<(2, 3, 1), (4, 4, 1)>>>, thread (3, 1, 0) of block (0, 1, 0): "
        f"In function '_too_large_2d', file {__file__}, line {line}, tid=[0, 1, 3] "
        "ctaid=[0, 1, 0]: value too large")


def test_in_a_chunk_the_raise_names_the_chunk():
    with pytest.raises(ValueError) as info:
        with faults.in_chunk("_too_large_2d", (1, 2), (8, 12), (8, 24)):
            TOO_LARGE_2D[(2, 3), (4, 4)](np.zeros((8, 12), np.float32))
    assert str(info.value).startswith(
        "kernel '_too_large_2d'<<<(2, 3, 1), (4, 4, 1)>>> on chunk (1, 2) at offset (8, 24), "
        "thread (3, 1, 0) of block (0, 1, 0): In function '_too_large_2d', file ")
    assert getattr(info.value, "__notes__", []) == []
    out = TOO_LARGE_2D[(1, 1), (4, 4)](np.zeros((4, 4), np.float32))  # the context is fine
    assert (out == 1).all()


class KernelError(Exception):
    pass


def _raises_user_class(a):
    if cuda.grid(1) == 9:
        raise KernelError("mine")


def test_a_user_class_stays_its_class_on_the_gpu():
    kernel = dg.jit("void(float32[::1])", debug=True, opt=False)(_raises_user_class)
    with pytest.raises(KernelError, match=r"^kernel '_raises_user_class'<<<\(2, 1, 1\), "
                                          r"\(8, 1, 1\)>>>, thread \(1, 0, 0\) of block "
                                          r"\(1, 0, 0\): In function '_raises_user_class', "
                                          r"file .*, tid=\[0, 0, 1\] ctaid=\[0, 0, 1\]: mine$"):
        kernel[2, 8](np.zeros(16, np.float32))


@dg.jit("void(float32[::1])")
def wild_store(a):
    i = cuda.grid(1)
    if i == 0:
        a[i + (1 << 40)] = 1.0  # far past the array: an illegal address


@pytest.mark.slow
@pytest.mark.parametrize("in_chunk", [False, True])
def test_an_illegal_address_names_the_kernel_and_launch(tmp_path, in_chunk):
    # In a fresh process: the context is unusable afterwards.
    blob = tmp_path / "launch.pkl"
    blob.write_bytes(pickle.dumps(wild_store[1, 32]))
    chunk = ("faults.in_chunk('wild_store', (2,), (64,), (128,))" if in_chunk
             else "contextlib.nullcontext()")
    script = textwrap.dedent(f"""
        import contextlib, pickle, sys, numpy as np
        sys.modules["numba"] = None
        from daskgpu._errors import ContextLostError
        from daskgpu._runtime import faults
        launch = pickle.load(open({str(blob)!r}, "rb"))
        try:
            with {chunk}:
                launch(np.zeros(64, np.float32))
        except ContextLostError as exc:
            print("LOST", str(exc).splitlines()[0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    site = "kernel 'wild_store'<<<(1, 1, 1), (32, 1, 1)>>>"
    if in_chunk:
        site += " on chunk (2,) at offset (128,)"
    assert f"LOST {site} failed: " in done.stdout
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in done.stdout
    assert "compute-sanitizer" in done.stdout
