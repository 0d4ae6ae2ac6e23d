"""map_kernel inside xr.apply_ufunc(..., dask="allowed") on dask-backed DataArrays (simulated)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from layers import hlg_only
from numba import cuda

import daskgpu as dg

xr = pytest.importorskip("xarray")


@dg.jit
def axpy(out, a, x, y):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a * x[i, j] + y[i, j]


@dg.jit
def column_sums(sums, x):
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        cuda.atomic.add(sums, j, x[i, j])


def _field(seed, chunks=(3, 4)):
    values = np.random.default_rng(seed).normal(size=(6, 8))
    return values, xr.DataArray(
        da.from_array(values, chunks=chunks), dims=("y", "x"),
        coords={"y": np.arange(6) * 10, "x": np.linspace(0, 1, 8)}, attrs={"units": "K"})


def test_elementwise_kernel_keeps_dims_coords_and_laziness(simulate):
    xn, x = _field(0)
    yn, y = _field(1)
    z = xr.apply_ufunc(
        lambda a, b: dg.map_kernel(axpy, dg.Out(np.float64, like=a), 2.0, a, b),
        x, y, dask="allowed", keep_attrs=True)
    assert isinstance(z.data, da.Array) and z.data.chunks == x.data.chunks
    assert z.dims == ("y", "x") and z.attrs == {"units": "K"}
    xr.testing.assert_equal(z.coords.to_dataset(), x.coords.to_dataset())
    np.testing.assert_array_equal(z.compute().values, 2.0 * xn + yn)


@hlg_only  # xarray's transpose calls an array method Dask's expressions lack yet
def test_transposed_input_is_mapped_in_its_own_order(simulate):
    xn, x = _field(0)
    yn, y = _field(1)
    # apply_ufunc aligns dims; a transposed DataArray arrives transposed back.
    z = xr.apply_ufunc(
        lambda a, b: dg.map_kernel(axpy, dg.Out(np.float64, like=a), 1.0, a, b),
        x, y.transpose("x", "y"), dask="allowed")
    np.testing.assert_array_equal(z.compute().values, xn + yn)


def test_combined_per_chunk_output_as_a_new_core_dim(simulate):
    xn, x = _field(2)
    sums = xr.apply_ufunc(
        lambda a: dg.map_kernel(column_sums, dg.Out(np.float64, per_chunk=4, combine="sum"), a),
        x.isel(x=slice(0, 4)), dask="allowed",
        input_core_dims=[["y", "x"]], output_core_dims=[["col"]])
    assert sums.dims == ("col",) and isinstance(sums.data, da.Array)
    np.testing.assert_allclose(sums.compute().values, xn[:, :4].sum(axis=0), rtol=1e-12)
