"""Kernels run in Numba's CUDA simulator when ``daskgpu.simulate`` is on; results vs numpy."""

import pickle
import subprocess
import sys
import textwrap
import types as pytypes

import dask
import numpy as np
import pytest
from kit.kernels import saxpy
from numba import cuda
from numba.cuda.dispatcher import CUDADispatcher

import daskgpu as dg

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


@cuda.jit(device=True)
def square(x):
    return x * x


@cuda.jit(device=True)
def poly(x):
    return square(x) + 2 * x  # a device function calling another


@dg.jit("void(float64[:, :], float64[:, :])")
def affine2d(out, x):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = 3 * x[i, j] + i - j


@dg.jit("void(float64[::1], float64[::1])")
def apply_poly(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = poly(x[i])


@dg.jit("void(int64[::1], int64[::1])")
def block_sums(out, x):
    tile = cuda.shared.array(32, dtype=np.int64)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    tile[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    if t == 0:
        s = 0
        for k in range(cuda.blockDim.x):
            s += tile[k]
        cuda.atomic.add(out, 0, s)


def test_1d(simulate):
    rng = np.random.default_rng(0)
    x, y = rng.random(100, dtype=np.float32), rng.random(100, dtype=np.float32)
    out = np.zeros_like(x)
    result = saxpy[4, 32](out, np.float32(2.5), x, y)
    assert result is out
    np.testing.assert_allclose(out, np.float32(2.5) * x + y, rtol=1e-6)


def test_1d_forall_covers_every_element(simulate):
    x = np.arange(130, dtype=np.float32)
    out = np.full_like(x, -1)
    saxpy.forall(x.size)(out, 1.0, x, np.ones_like(x))
    np.testing.assert_array_equal(out, x + 1)


@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_2d(simulate, order):
    base = np.arange(2 * 7 * 9, dtype=np.float64).reshape(14, 9)
    x = base[::2] if order == "strided" else np.asarray(base[:7], order=order)
    out = np.zeros((7, 9))
    result = affine2d.forall(x.shape)(out, x)
    assert result is out
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(out, 3 * x + i - j)
    out2 = np.zeros((7, 9))
    affine2d[(2, 3), (4, 4)](out2, x)
    np.testing.assert_array_equal(out2, out)


def test_strided_output_is_written_through_the_view(simulate):
    x = np.arange(63, dtype=np.float64).reshape(7, 9)
    base = np.zeros((14, 9))
    out = base[::2]
    assert affine2d.forall(x.shape)(out, x) is out
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(base[::2], 3 * x + i - j)
    np.testing.assert_array_equal(base[1::2], 0)


def test_device_functions(simulate):
    x = np.linspace(-2, 2, 50)
    out = np.zeros_like(x)
    apply_poly.forall(x.size)(out, x)
    np.testing.assert_allclose(out, x * x + 2 * x)
    # The kernel's own globals still hold the real device functions.
    assert isinstance(apply_poly.py_func.__globals__["poly"], CUDADispatcher)
    assert isinstance(poly.py_func.__globals__["square"], CUDADispatcher)


def test_shared_memory_syncthreads_and_atomics(simulate):
    x = np.arange(100, dtype=np.int64)
    out = np.zeros(1, np.int64)
    assert block_sums[4, 32](out, x) is out
    assert out[0] == x.sum()


def test_pickled_kernel_simulates_after_unpickling():
    x = np.linspace(0, 1, 40)
    with dask.config.set({"daskgpu.simulate": True}):
        blob = pickle.dumps(apply_poly.forall(x.size))
    launch = pickle.loads(blob)
    assert isinstance(launch.kernel, dg.PTXKernel)
    out = np.zeros_like(x)
    # The images carry the function: they simulate even with the setting off here.
    assert launch(out, x) is out
    np.testing.assert_allclose(out, x * x + 2 * x)


@pytest.mark.slow
def test_pickled_kernel_simulates_in_a_fresh_process():
    def local_kernel():
        def halve(out, x):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = poly(x[i]) / 2
        return dg.jit("void(float64[::1], float64[::1])")(halve)

    with dask.config.set({"daskgpu.simulate": True}):
        blob = pickle.dumps(local_kernel().forall(16))
    code = textwrap.dedent("""
        import pickle, sys
        import numpy as np
        launch = pickle.loads(sys.stdin.buffer.read())
        x = np.arange(16, dtype=np.float64)
        out = launch(np.zeros(16), x)
        print(list(out))
    """)
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                         check=True, cwd="/").stdout.decode().strip().splitlines()[-1]
    x = np.arange(16, dtype=np.float64)
    np.testing.assert_allclose(eval(out), (x * x + 2 * x) / 2)


def test_simulation_off_leaves_ptx_only_images():
    assert all(im.py_func is None for im in pickle.loads(pickle.dumps(saxpy)).images)


def test_simulator_refuses_device_only_arrays(simulate):
    class DeviceOnly:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1, False),
                                    "version": 3, "strides": None}

    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match=r"simulator runs on host arrays only.*daskgpu\.simulate"):
        saxpy[1, 4](DeviceOnly(), 1.0, x, x)


def test_lazy_kernel_simulates_after_compiling_the_signature(simulate):
    @dg.jit
    def inc(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1

    a = np.arange(10, dtype=np.int32)
    assert inc.forall(10)(a) is a
    np.testing.assert_array_equal(a, np.arange(1, 11))
    assert inc.signatures == ["(int32[::1])"]


def test_simulated_closure_sees_its_free_variables(simulate):
    def make(k):
        @dg.jit("void(float64[::1])")
        def add_k(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] += k
        return add_k

    a = np.zeros(5)
    make(3.0).forall(5)(a)
    np.testing.assert_array_equal(a, 3.0)


def test_simulate_module_helpers_copy_functions():
    from daskgpu._runtime.simulator import _simulable

    copy = _simulable(apply_poly.py_func, {})
    assert copy is not apply_poly.py_func
    assert copy.__code__ is apply_poly.py_func.__code__
    assert not isinstance(copy.__globals__["poly"], CUDADispatcher)
    assert isinstance(copy, pytypes.FunctionType)


@dg.jit("void(uint64[::1], uint64[::1])")
def _add_wrapping(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + x[i]


def test_integer_arithmetic_wraps_silently_as_on_a_gpu(simulate):
    import warnings

    x = np.array([2**63 + 5, 7], np.uint64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered" would raise here
        out = _add_wrapping.forall(2)(np.zeros(2, np.uint64), x)
    np.testing.assert_array_equal(out, np.array([10, 14], np.uint64))


# -- what Numba's simulator runs, this one runs ------------------------------------------

@cuda.jit(device=True)
def _triple(x):
    return 3 * x


# A module whose device function a kernel reaches as an attribute, as stumpy's core.
sim_helpers = pytypes.ModuleType("sim_helpers")
sim_helpers.triple = _triple


@dg.jit("void(float64[::1])")
def _triple_by_attribute(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = sim_helpers.triple(a[i])


def test_a_device_function_reached_as_a_module_attribute(simulate):
    a = _triple_by_attribute.forall(5)(np.arange(5.0))
    np.testing.assert_array_equal(a, 3 * np.arange(5.0))


def test_a_device_function_and_cuda_from_a_closure(simulate):
    def make(offset):
        from numba import cuda as local_cuda  # imported inside the factory

        @local_cuda.jit(device=True)
        def shift(x):
            return x + offset

        @dg.jit("void(float64[::1])")
        def apply_shift(a):
            i = local_cuda.grid(1)
            if i < a.size:
                a[i] = shift(a[i])
        return apply_shift

    a = make(2.0).forall(4)(np.zeros(4))
    np.testing.assert_array_equal(a, 2.0)


def _module_numba_cuda(a):
    import numba  # noqa: F401  (numba.cuda.grid, as some kernels write it)

    i = numba.cuda.grid(1)
    if i < a.size:
        a[i] = i


def test_numba_cuda_reached_through_the_numba_module(simulate):
    from daskgpu._image.launch_config import LaunchConfig
    from daskgpu._runtime.simulator import run_function

    a = np.zeros(6)
    run_function(_module_numba_cuda, LaunchConfig(ntasks=6), [a])
    np.testing.assert_array_equal(a, np.arange(6.0))


@dg.jit("void(float64[::1])")
def _off_by_one(a):
    i = cuda.grid(1)
    if i <= a.size:  # the bug: thread a.size writes past the end
        a[i] = 1.0


def test_a_forall_launches_whole_blocks_so_a_missing_bound_fails(simulate):
    # On a GPU forall(3) runs a whole block; thread 3 writes out of bounds. One thread
    # per element would hide it.
    with pytest.raises(IndexError):
        _off_by_one.forall(3)(np.zeros(3))
