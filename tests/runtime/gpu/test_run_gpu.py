"""Real launches on a GPU: every argument kind, host and device arrays, sticky errors."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._cli.bench.kernels import saxpy

pytestmark = pytest.mark.gpu


SCALARS = [
    ("int8", -7), ("int16", -300), ("int32", -70000), ("int64", -(2**40)),
    ("uint8", 200), ("uint16", 60000), ("uint32", 4_000_000_000), ("uint64", 2**63 + 5),
    ("float16", 1.5), ("float32", 2.25), ("float64", 3.125),
    ("complex64", 1 + 2j), ("complex128", 3 - 4j), ("bool", True),
]


@pytest.mark.parametrize("dtype,value", SCALARS)
def test_scalar_kinds_round_trip(dtype, value):
    nbtype = "boolean" if dtype == "bool" else dtype

    def store(out, v):
        out[0] = v

    k = dg.jit(f"void({nbtype}[::1], {nbtype})")(store)
    out = np.zeros(1, dtype=dtype)
    res = k[1, 1](out, value)
    assert res is out
    assert out[0] == np.array(value, dtype=dtype)


def _sum_kernel(ndim):
    src = {
        1: "i = cuda.grid(1)\n    if i < x.shape[0]:\n        out[i] = x[i] * 2 + 1",
        2: "i, j = cuda.grid(2)\n    if i < x.shape[0] and j < x.shape[1]:\n"
           "        out[i, j] = x[i, j] * 2 + 1",
        3: "i, j, k = cuda.grid(3)\n"
           "    if i < x.shape[0] and j < x.shape[1] and k < x.shape[2]:\n"
           "        out[i, j, k] = x[i, j, k] * 2 + 1",
    }[ndim]
    ns = {"cuda": cuda}
    exec(f"def affine(out, x):\n    {src}", ns)
    return dg.jit(ns["affine"])


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_array_ranks_and_layouts(ndim, order):
    shape = (37, 5, 3)[:ndim]
    base = np.arange(np.prod(shape) * 2, dtype=np.float64)
    if order == "strided":
        x = base[::2].reshape(shape)
        x = np.swapaxes(x, 0, -1) if ndim > 1 else x
    else:
        x = np.asarray(base[: np.prod(shape)].reshape(shape), order=order)
    out = np.zeros_like(x)
    k = _sum_kernel(ndim)
    res = k.forall(x.shape)(out, x)
    assert res is out
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_host_launch_updates_in_place_and_returns_written():
    x = np.arange(1000, dtype=np.float32)
    y = np.ones_like(x)
    out = np.zeros_like(x)
    res = saxpy[4, 256](out, 2.0, x, y)
    assert res is out
    np.testing.assert_allclose(out, 2 * x + 1)


def test_cupy_arrays_are_used_in_place():
    cp = pytest.importorskip("cupy")
    x = cp.arange(1000, dtype=cp.float32)
    y = cp.ones_like(x)
    out = cp.zeros_like(x)
    res = saxpy.forall(1000)(out, 2.0, x, y)
    assert res is out
    cp.testing.assert_allclose(out, 2 * x + 1)


def test_numba_device_arrays_are_used_in_place():
    x = cuda.to_device(np.arange(100, dtype=np.float32))
    out = cuda.device_array(100, dtype=np.float32)
    res = saxpy.forall(100)(out, 3.0, x, x)
    assert res is out
    np.testing.assert_allclose(out.copy_to_host(), 4 * np.arange(100))


def test_launch_refuses_oversized_block():
    x = np.ones(8, np.float32)
    with pytest.raises(dg.LaunchConfigError, match="1024"):
        saxpy[1, 2048](x, 1.0, x, x)


@dg.jit("void(float32[::1])")
def wild_store(a):
    i = cuda.grid(1)
    if i == 0:
        a[i + (1 << 40)] = 1.0  # far past the array: an illegal address


@pytest.mark.slow
def test_a_sticky_error_raises_context_lost_and_the_runtime_does_nothing_else(tmp_path):
    # In a fresh process: the context is unusable afterwards. The runtime only
    # raises; replacing a Dask worker is its plugin's business (tests/dask/test_faults.py).
    blob = tmp_path / "launch.pkl"
    blob.write_bytes(pickle.dumps(wild_store[1, 1]))
    script = textwrap.dedent(f"""
        import pickle, sys, numpy as np
        sys.modules["numba"] = None
        from daskgpu._errors import ContextLostError
        launch = pickle.load(open({str(blob)!r}, "rb"))
        try:
            launch(np.zeros(64, np.float32))
        except ContextLostError as exc:
            print("LOST", "ILLEGAL_ADDRESS" in str(exc))
        print("DASK", sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "LOST True" in done.stdout
    assert "DASK []" in done.stdout
