"""The simulator is as strict as a GPU: it refuses the launches a real device refuses."""

import dask
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu import LaunchConfigError
from daskgpu._runtime.simulator import device_limits

dg._config.get("target-cc")  # registers the defaults before dask.config.set


pytestmark = pytest.mark.usefixtures("simulate")  # every test here runs simulated


@dg.jit("void(float32[::1])")
def fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


@dg.jit("void(float32[::1])")
def huge_shared(out):
    buf = cuda.shared.array(1 << 28, np.float32)  # 1 GiB of shared memory
    i = cuda.grid(1)
    if i < out.size:
        buf[0] = 1.0
        out[i] = buf[0]


@dg.jit("void(float32[::1])")
def fair_shared(out):
    buf = cuda.shared.array(1024, np.float32)  # 4 KiB
    i = cuda.grid(1)
    buf[cuda.threadIdx.x] = i
    cuda.syncthreads()
    if i < out.size:
        out[i] = buf[cuda.threadIdx.x]


@pytest.mark.parametrize("grid,block,shared,message", [
    (1, 2048, 0, "2048 threads"),
    (1, (32, 32, 2), 0, "2048 threads"),
    (1, (1, 1, 128), 0, "block limits"),
    (2**31, 32, 0, "grid limits"),
    ((1, 65536), 32, 0, "grid limits"),
    (1, 32, 1 << 30, "shared memory"),
])
def test_launches_a_gpu_refuses_are_refused(grid, block, shared, message):
    out = np.zeros(4, np.float32)
    with pytest.raises(LaunchConfigError, match=message) as err:
        fill[grid, block, 0, shared](out)
    assert "compute capability 7.5" in str(err.value)
    assert not out.any()  # nothing ran


def test_shared_memory_limit_follows_the_target_cc():
    out = np.zeros(4, np.float32)
    with dask.config.set({"daskgpu.target-cc": "7.5"}):
        with pytest.raises(LaunchConfigError, match="65536"):
            fill[1, 4, 0, 100_000](out)
    with dask.config.set({"daskgpu.target-cc": "9.0"}):
        fill[1, 4, 0, 100_000](out)  # an H100 allows 227 KiB per block
    np.testing.assert_array_equal(out, np.arange(4))
    assert device_limits((8, 6)).max_shared_memory_per_block == 101376


def test_static_shared_arrays_count_against_the_limit():
    out = np.zeros(64, np.float32)
    with pytest.raises(LaunchConfigError, match="shared memory per block"):
        huge_shared[1, 32](out)
    fair_shared[2, 32](out)
    np.testing.assert_array_equal(out, np.arange(64))


def test_forall_with_too_many_threads_per_block_is_refused():
    out = np.zeros(4, np.float32)
    with pytest.raises(LaunchConfigError, match="threads"):
        fill.forall(4, tpb=4096)(out)
    fill.forall(4)(out)
    np.testing.assert_array_equal(out, np.arange(4))


@pytest.mark.parametrize("make", [
    lambda k: k.forall(8.0),
    lambda k: k.forall(8, tpb=32.0),
    lambda k: k[1.0, 32],
    lambda k: k[1, 32.5],
    lambda k: k[(2, 2.0), 32],
    lambda k: k.configure(1, 32, 0, 10.5),
])
def test_float_sizes_are_launch_config_errors(make):
    with pytest.raises(LaunchConfigError, match="whole number|integers"):
        make(fill)
