"""daskgpu kernels inside ``xr.apply_ufunc``: labelled, dask-backed DataArrays.

    python examples/xarray_apply.py            # on the GPUs of this machine
    python examples/xarray_apply.py --simulate # without a GPU (slow, small)

``xr.apply_ufunc(f, ..., dask="allowed")`` hands ``f`` the dask arrays under
the DataArrays; ``f`` calls :func:`daskgpu.map_kernel`, so every chunk runs on a
GPU and the result comes back with its dimensions and coordinates. Here: a
temperature field converted to Fahrenheit elementwise, and its 64-bin
histogram over time, latitude and longitude from per-chunk counts.
"""

from __future__ import annotations

import argparse
import math
from contextlib import ExitStack

import dask.array as da
import numpy as np
import xarray as xr
from distributed import Client
from numba import cuda

import daskgpu as dg

BINS = 64
LOW, HIGH = -40.0, 40.0


@dg.jit
def fahrenheit(out, celsius):
    i, j, k = cuda.grid(3)
    if i < out.shape[0] and j < out.shape[1] and k < out.shape[2]:
        out[i, j, k] = celsius[i, j, k] * 1.8 + 32.0


@dg.jit
def histogram(counts, x, low, high):
    i = cuda.grid(1)  # 1-D over the chunk's elements
    if i < x.size:
        c = i % x.shape[2]
        rest = i // x.shape[2]
        v = x[rest // x.shape[1], rest % x.shape[1], c]
        b = math.floor((v - low) / (high - low) * counts.size)
        if 0 <= b < counts.size:
            cuda.atomic.add(counts, b, 1)


def to_fahrenheit(celsius):
    return dg.map_kernel(fahrenheit, dg.Out(np.float64, like=celsius), celsius)


def histogram_of(x):
    return dg.map_kernel(histogram, dg.Out(np.int64, per_chunk=BINS, combine="sum"), x,
                         LOW, HIGH)


def main(shape=None, simulate=None, cluster=None):
    """Return ``(fahrenheit DataArray, histogram DataArray)``, both computed."""
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        shape = shape or ((4, 6, 8) if simulated else (96, 360, 720))
        data = da.random.default_rng(3).normal(10.0, 12.0, shape,
                                               chunks=(max(1, shape[0] // 4), -1, -1))
        celsius = xr.DataArray(
            data, dims=("time", "lat", "lon"), name="t2m",
            coords={"time": np.arange(shape[0]), "lat": np.linspace(-90, 90, shape[1]),
                    "lon": np.linspace(0, 360, shape[2], endpoint=False)})

        hot = xr.apply_ufunc(to_fahrenheit, celsius, dask="allowed")
        counts = xr.apply_ufunc(histogram_of, celsius, dask="allowed",
                                input_core_dims=[["time", "lat", "lon"]],
                                output_core_dims=[["bin"]])
        counts = counts.assign_coords(bin=np.linspace(LOW, HIGH, BINS, endpoint=False))
        hot, counts, values = client.compute([hot, counts, celsius], sync=True)

        np.testing.assert_allclose(hot.values, values.values * 1.8 + 32.0)
        b = np.floor((values.values - LOW) / (HIGH - LOW) * BINS)
        np.testing.assert_array_equal(counts.values, np.bincount(
            b[(b >= 0) & (b < BINS)].astype(np.int64), minlength=BINS))
        print(f"{celsius.name} {dict(celsius.sizes)} in {celsius.data.npartitions} chunks"
              f"{' (simulated)' if simulated else ''}: Fahrenheit and a {BINS}-bin "
              "histogram through xr.apply_ufunc, matching NumPy")
        return hot, counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(simulate=args.simulate)
