"""dg.random_states in map_kernel: the numbers of one Numba process, whatever the chunking."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from numba import cuda
from numba.cuda.random import (
    init_xoroshiro128p_states_cpu,
    xoroshiro128p_dtype,
    xoroshiro128p_uniform_float32,
    xoroshiro128p_uniform_float64,
)

import daskgpu as dg


@dg.jit
def uniform_pairs(first, second, states):
    i = cuda.grid(1)
    if i < first.size:
        first[i] = xoroshiro128p_uniform_float32(states, i)
        second[i] = xoroshiro128p_uniform_float32(states, i)


@dg.jit
def uniforms_2d(out, states):
    i = cuda.grid(1)  # 1-D over the chunk: state i is element i in row-major order
    if i < out.size:
        r = i // out.shape[1]
        c = i % out.shape[1]
        out[r, c] = xoroshiro128p_uniform_float64(states, i)


def numba_draws(seed, n, draw, per_state=1):
    states = np.empty(n, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, np.uint64(seed), 0)
    return np.array([[draw(states, i) for _ in range(per_state)] for i in range(n)])


@pytest.mark.parametrize("chunks", [(60,), (1, 59), (7, 13, 40), (20, 20, 20)])
def test_1d_draws_do_not_depend_on_the_chunking(simulate, chunks):
    out = _pairs(60, chunks, 2024)
    want = numba_draws(2024, 60, xoroshiro128p_uniform_float32, per_state=2)
    np.testing.assert_array_equal(out, want.astype(np.float32))


def _pairs(n, chunks, seed):
    out = dg.Out(np.float32, shape=n, chunks=(chunks,))
    first, second = dg.map_kernel(uniform_pairs, out, out, dg.random_states(seed))
    return np.stack(dask.compute(first, second), axis=1)


@pytest.mark.parametrize("chunks", [(6, 7), (2, 3), ((1, 5), (4, 3))])
def test_2d_state_is_the_row_major_flat_index(simulate, chunks):
    out = dg.map_kernel(uniforms_2d, dg.Out(np.float64, shape=(6, 7), chunks=chunks),
                        dg.random_states(9))
    want = numba_draws(9, 42, xoroshiro128p_uniform_float64).reshape(6, 7)
    np.testing.assert_array_equal(out.compute(), want)


def test_depth_and_n_are_refused(simulate):
    x = da.ones(10, chunks=5)
    with pytest.raises(ValueError, match="random_states: a halo element"):
        dg.map_kernel(uniforms_2d, dg.Out(np.float64, like=x), dg.random_states(1), depth=1)
    with pytest.raises(TypeError, match=r"without n or start"):
        dg.map_kernel(uniforms_2d, dg.Out(np.float64, like=x), dg.random_states(1, 10))


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", [(1 << 16,), (1000, 30000, 34536)])
def test_gpu_draws_equal_numbas_and_do_not_depend_on_the_chunking(chunks):
    n = 1 << 16
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "threads"}):
        out = _pairs(n, chunks, 2024)
        one = _pairs(n, (n,), 2024)
    want = numba_draws(2024, 2000, xoroshiro128p_uniform_float32, per_state=2)
    np.testing.assert_array_equal(out[:2000], want.astype(np.float32))
    np.testing.assert_array_equal(out, one)  # every number, whatever the chunking


@pytest.mark.gpu
def test_gpu_states_with_cupy_chunks():
    cupy = pytest.importorskip("cupy")
    x = da.from_array(cupy.zeros(300, cupy.float32), chunks=70)
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "threads"}):
        first, second = dg.map_kernel(uniform_pairs, dg.Out(np.float32, like=x),
                                      dg.Out(np.float32, like=x), dg.random_states(5))
        first, second = dask.compute(first, second)
    assert isinstance(first, cupy.ndarray)
    want = numba_draws(5, 300, xoroshiro128p_uniform_float32, per_state=2)
    np.testing.assert_array_equal(np.stack([first.get(), second.get()], 1), want.astype(np.float32))
