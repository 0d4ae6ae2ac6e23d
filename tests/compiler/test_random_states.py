"""The states kernel and dg.random_states: simulated against the host reference, and on a GPU."""

from __future__ import annotations

import pickle

import dask
import numpy as np
import pytest
from numba import cuda
from numba.cuda.random import (
    init_xoroshiro128p_states_cpu,
    xoroshiro128p_dtype,
    xoroshiro128p_uniform_float32,
)

import daskgpu as dg
from daskgpu._compiler.random_states import SIGNATURE, build_states, builder
from daskgpu._image.random_states import JUMP_TABLE, host_states, splitmix64


def test_builder_is_ptx_only_and_compiles_without_a_gpu():
    kernel = builder()
    assert isinstance(kernel, dg.PTXKernel) and kernel is builder()
    (image,) = kernel.images
    assert image.py_func is None
    assert image.signature == SIGNATURE[4:]
    assert isinstance(pickle.loads(pickle.dumps(kernel)), dg.PTXKernel)


def test_states_kernel_simulated_at_offset_2_40_for_a_2d_chunk():
    # Rows 3..4, columns 5..8 of a (100, 2**36) array: g = (3 + i) * 2**36 + 5 + j.
    # Few threads: each simulated jump is a Python loop of 128 steps.
    kernel = dg.jit(SIGNATURE)(build_states)
    words = np.zeros((8, 2), np.uint64)
    u = np.uint64
    with dask.config.set({"daskgpu.simulate": True}):
        kernel.forall(8)(words, JUMP_TABLE.copy(), u(splitmix64(5)), u(3 * 2**36 + 5),
                         u(4), u(1), u(2**36), u(1), u(0))
    g = (3 + np.arange(2, dtype=np.uint64)[:, None]) * u(2**36) + u(5) + np.arange(4, dtype=u)
    want = host_states(5, g)
    np.testing.assert_array_equal(words[:, 0], want["s0"])
    np.testing.assert_array_equal(words[:, 1], want["s1"])


def test_random_states_needs_n_outside_map_kernel():
    with pytest.raises(TypeError, match="needs n"):
        dg.random_states(1, start=5)
    states = dg.random_states(1)
    assert states.n is None and states.builder is None


@dg.jit
def uniforms(out, states):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = xoroshiro128p_uniform_float32(states, i)


def _numba_uniforms(seed, n, start=0):
    states = np.empty(n, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, np.uint64(seed), start)
    return np.array([xoroshiro128p_uniform_float32(states, i) for i in range(n)], np.float32)


def test_local_launch_with_placeholder_states_simulated():
    out = np.zeros(50, np.float32)
    with dask.config.set({"daskgpu.simulate": True}):
        result = uniforms.forall(50)(out, dg.random_states(3, 50, start=1000))
    assert result is out  # the states are scratch, not a result
    np.testing.assert_array_equal(out, _numba_uniforms(3, 50, 1000))


@pytest.mark.gpu
def test_gpu_states_kernel_at_offset_2_40_against_the_cpu_reference():
    from daskgpu._runtime.random_states import build

    start = 2**40 + 12345
    states = build(77, start, (4096,), (1,), builder())
    got = states.copy_to_host()
    np.testing.assert_array_equal(got, host_states(77, np.arange(start, start + 4096, dtype=np.uint64)))
    # 2-D: a (64, 32) chunk at row 2**30 of an array 2**10 wide.
    states = build(77, 2**40, (64, 32), (2**10, 1), builder())
    g = np.uint64(2**40) + np.arange(64, dtype=np.uint64)[:, None] * np.uint64(2**10) + \
        np.arange(32, dtype=np.uint64)
    np.testing.assert_array_equal(states.copy_to_host(), host_states(77, g))
    # Near the start, where Numba's own host loop is cheap, against Numba itself.
    states = build(5, 1000, (3000,), (1,), builder())
    want = np.empty(3000, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(want, np.uint64(5), 1000)
    np.testing.assert_array_equal(states.copy_to_host(), want)


@pytest.mark.gpu
def test_gpu_local_launch_with_placeholder_states():
    out = np.zeros(5000, np.float32)
    with dask.config.set({"daskgpu.simulate": False}):
        uniforms.forall(5000)(out, dg.random_states(3, 5000, start=1000))
    np.testing.assert_array_equal(out, _numba_uniforms(3, 5000, 1000))
