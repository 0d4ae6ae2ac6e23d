"""Rank-1 kernels over N-D chunks see them flat, as the chunk's elements (simulated)."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import numpy as np
import pytest
from kit.kernels import scale, scale64
from numba import cuda

import daskgpu as dg


def _lazy_scale():
    """A lazy ``scale`` of its own, that has compiled nothing yet."""
    return dg.jit(scale.py_func)


@dg.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@dg.jit
def by_thread_index(out, x):  # no cuda.grid call: the rank is not in its own code
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < out.size:
        out[i] = x[i] + 1


@dg.jit
def increment(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@pytest.mark.parametrize("shape, chunks", [((6, 8), (4, 3)), ((4, 5, 6), (3, 2, 4))])
def test_grid1_kernel_maps_over_the_elements_of_nd_chunks(simulate, shape, chunks):
    xn = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    x = da.from_array(xn, chunks=chunks)
    scale = _lazy_scale()
    z = dg.map_kernel(scale, dg.Out(np.float64, like=x), 3.0, x)
    assert z.shape == shape and z.chunks == x.chunks
    np.testing.assert_array_equal(z.compute(), 3.0 * xn)
    # Compiled once, flat, for the chunks' dtype; a second map reuses it.
    assert scale.signatures == ["(float64[::1], float64, float64[::1])"]
    dg.map_kernel(scale, dg.Out(np.float64, like=x), 2.0, x)
    assert len(scale.signatures) == 1


def test_grid_ndim_1_promises_flat_chunks(simulate):
    xn = np.arange(30.0).reshape(5, 6)
    x = da.from_array(xn, chunks=(2, 4))
    z = dg.map_kernel(_lazy_scale(), dg.Out(np.float64, like=x), 2.0, x, grid_ndim=1)
    np.testing.assert_array_equal(z.compute(), 2.0 * xn)


def test_a_kernel_without_grid_calls_falls_back_to_flat_chunks(simulate):
    xn = np.arange(12.0).reshape(3, 4)
    x = da.from_array(xn, chunks=2)
    for grid_ndim in (None, 1):
        z = dg.map_kernel(by_thread_index, dg.Out(np.float64, like=x), x, grid_ndim=grid_ndim)
        np.testing.assert_array_equal(z.compute(), xn + 1)


def test_declared_1d_signature_takes_nd_chunks_flat(simulate):
    xn = np.arange(24.0).reshape(2, 3, 4)
    x = da.from_array(xn, chunks=(1, 2, 3))
    z = dg.map_kernel(scale64, dg.Out(np.float64, like=x), 0.5, x)
    np.testing.assert_array_equal(z.compute(), 0.5 * xn)
    ptx = pickle.loads(pickle.dumps(scale64))  # what dg.load gives: no Python function
    assert isinstance(ptx, dg.PTXKernel)
    z = dg.map_kernel(ptx, dg.Out(np.float64, like=x), 0.5, x)
    np.testing.assert_array_equal(z.compute(), 0.5 * xn)


def test_flat_chunks_pair_elements_as_numpy_broadcasts(simulate):
    xn = np.arange(24.0).reshape(4, 6)
    rown = np.arange(6.0) * 100          # 1-D: broadcast against the rows
    coln = np.arange(4.0).reshape(4, 1)  # a column: broadcast along the rows
    x = da.from_array(xn, chunks=(2, 3))
    row, col = da.from_array(rown, chunks=3), da.from_array(coln, chunks=(2, 1))
    z = dg.map_kernel(axpy, dg.Out(np.float64, like=x), 2.0, x, row)
    np.testing.assert_array_equal(z.compute(), 2.0 * xn + rown)
    z = dg.map_kernel(axpy, dg.Out(np.float64, like=x), 1.0, col, x)
    np.testing.assert_array_equal(z.compute(), coln + xn)


def test_non_contiguous_chunks_are_flattened_in_their_own_order(simulate):
    xn = np.arange(24.0).reshape(4, 6)
    x = da.from_array(xn, chunks=(2, 3)).T  # F-ordered chunks
    z = dg.map_kernel(axpy, dg.Out(np.float64, like=x), 1.0, x, x[:, ::-1])
    np.testing.assert_array_equal(z.compute(), xn.T + xn.T[:, ::-1])


def test_written_input_comes_back_in_its_shape(simulate):
    xn = np.arange(12.0).reshape(3, 4)
    x = da.from_array(xn, chunks=2)
    z = dg.map_kernel(increment, x)
    assert z.chunks == x.chunks
    np.testing.assert_array_equal(z.compute(), xn + 1)
    np.testing.assert_array_equal(x.compute(), xn)  # the user's array is untouched


def test_what_cannot_be_flat_fails_at_graph_build_in_one_line(simulate):
    x = da.ones((4, 6), chunks=(2, 3))
    with pytest.raises(ValueError, match=r"indexes its 2-D chunks flat.*depth=1") as err:
        dg.map_kernel(_lazy_scale(), dg.Out(np.float64, like=x), 1.0, x, depth=1)
    assert "\n" not in str(err.value)

    @dg.jit
    def bump(x, y):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += y[i]

    row = da.ones(6, chunks=3)
    with pytest.raises(ValueError, match=r"writes a dask array of shape \(6,\).*broadcast") as err:
        dg.map_kernel(bump, row, x)
    assert "\n" not in str(err.value)


def test_a_row_kernel_of_rank_1_still_gets_nd_chunks(simulate):
    @dg.jit
    def row_sums(out, x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            s = 0.0
            for j in range(x.shape[1]):
                s += x[i, j]
            for j in range(x.shape[1]):
                out[i, j] = s

    xn = np.arange(24.0).reshape(4, 6)
    x = da.from_array(xn, chunks=(2, 6))
    z = dg.map_kernel(row_sums, dg.Out(np.float64, like=x), x)
    np.testing.assert_array_equal(z.compute(), np.repeat(xn.sum(1, keepdims=True), 6, 1))


def test_flat_maps_chain_and_fuse(simulate):
    xn = np.arange(24.0).reshape(4, 6)
    x = da.from_array(xn, chunks=(2, 3))
    scale = _lazy_scale()
    y = dg.map_kernel(scale, dg.Out(np.float64, like=x), 2.0, x)
    z = dg.map_kernel(scale, dg.Out(np.float64, like=x), 3.0, y)
    assert not any(k[0] == y.name for k in z.__dask_graph__())  # fused: y's tasks are gone
    np.testing.assert_array_equal(z.compute(), 6.0 * xn)
    with dask.config.set({"daskgpu.fuse-chains": False}):
        apart = dg.map_kernel(scale, dg.Out(np.float64, like=x), 3.0, y)
    assert any(k[0] == y.name for k in apart.__dask_graph__())
    np.testing.assert_array_equal(apart.compute(), 6.0 * xn)


def test_flat_chunks_inside_xarray_apply_ufunc(simulate):
    xr = pytest.importorskip("xarray")
    values = np.arange(48.0).reshape(6, 8)
    field = xr.DataArray(da.from_array(values, chunks=(3, 4)), dims=("y", "x"))
    line = xr.DataArray(da.from_array(np.arange(8.0), chunks=4), dims=("x",))
    z = xr.apply_ufunc(
        lambda a, b: dg.map_kernel(axpy, dg.Out(np.float64), 2.0, a, b),
        field, line, dask="allowed")
    assert isinstance(z.data, da.Array) and z.dims == ("y", "x")
    np.testing.assert_array_equal(z.compute().values, 2.0 * values + np.arange(8.0))


def test_a_flat_map_survives_pickling_as_a_worker_gets_it(simulate):
    xn = np.arange(24.0).reshape(4, 6)
    x = da.from_array(xn, chunks=(2, 3))
    z = dg.map_kernel(increment, x)
    again = pickle.loads(pickle.dumps(z))  # the launch and its flat parameters, by value
    np.testing.assert_array_equal(again.compute(), xn + 1)


@pytest.mark.gpu
def test_gpu_flat_chain_keeps_its_intermediate_on_the_device():
    xn = np.arange(4 * 6 * 5, dtype=np.float64).reshape(4, 6, 5)
    x = da.from_array(xn, chunks=(2, 3, 5))
    with dask.config.set({"scheduler": "sync"}):
        scale = _lazy_scale()
        y = dg.map_kernel(scale, dg.Out(np.float64, like=x), 2.0, x)
        z = dg.map_kernel(axpy, dg.Out(np.float64, like=x), 3.0, y, x)  # fused with y
        assert not any(k[0] == y.name for k in z.__dask_graph__())
        np.testing.assert_array_equal(z.compute(), 7.0 * xn)
