"""Per-chunk outputs of map_kernel and their combine across chunks (simulated, and on a GPU)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from layers import EXPRESSIONS
from numba import cuda

import daskgpu as dg


@dg.jit
def histogram4(counts, x):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(counts, int(x[i]) % 4, 1)


@dg.jit
def chunk_stats(total, low, high, x):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(total, 0, x[i])
        cuda.atomic.min(low, 0, x[i])
        cuda.atomic.max(high, 0, x[i])


@dg.jit
def first_and_size(out, x):
    # One thread writes the chunk's first element and its size: exact, any dtype.
    if cuda.grid(1) == 0:
        out[0] = x[0]
        out[1] = x.size


@dg.jit
def doubled_and_count(out, count, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]
        cuda.atomic.add(count, 0, 1)


@dg.jit
def tile_sums(sums, x):
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        cuda.atomic.add(sums, (i % 2, j % 3), x[i, j])


def _values(n=103, chunks=(10, 40, 3, 50)):
    xn = (np.arange(n) * 7 % 23).astype(np.int64)
    return xn, da.from_array(xn, chunks=(chunks,))


# -- per-chunk outputs --------------------------------------------------------

def test_per_chunk_shape_and_chunk_order(simulate):
    xn, x = _values()
    out = dg.map_kernel(first_and_size, dg.Out(np.int64, per_chunk=2), x)
    assert out.shape == (4, 2) and out.chunks == ((1, 1, 1, 1), (2,))
    starts = np.cumsum((0,) + x.chunks[0][:-1])
    np.testing.assert_array_equal(out.compute(), np.stack([xn[starts], x.chunks[0]], axis=1))


def test_per_chunk_of_2d_map_has_numblocks_leading_axes(simulate):
    xn = np.arange(6 * 9, dtype=np.float64).reshape(6, 9)
    x = da.from_array(xn, chunks=(4, 3))
    out = dg.map_kernel(tile_sums, dg.Out(np.float64, per_chunk=(2, 3)), x)
    assert out.shape == (2, 3, 2, 3)
    got = out.compute()
    for bi in range(2):
        for bj in range(3):
            block = xn[4 * bi:4 * bi + 4, 3 * bj:3 * bj + 3]
            want = np.zeros((2, 3))
            for i in range(block.shape[0]):
                for j in range(block.shape[1]):
                    want[i % 2, j % 3] += block[i, j]
            np.testing.assert_array_equal(got[bi, bj], want)


def test_per_chunk_fill_is_where_each_launch_starts(simulate):
    xn, x = _values()
    out = dg.map_kernel(histogram4, dg.Out(np.int32, per_chunk=4, fill=100), x).compute()
    want = [np.bincount(xn[s:s + c] % 4, minlength=4) + 100
            for s, c in zip(np.cumsum((0,) + x.chunks[0][:-1]), x.chunks[0])]
    np.testing.assert_array_equal(out, np.stack(want))


def test_mixed_aligned_and_per_chunk_outputs(simulate):
    xn, x = _values()
    doubled, count = dg.map_kernel(
        doubled_and_count, dg.Out(np.int64, like=x),
        dg.Out(np.int64, per_chunk=1, combine="sum"), x)
    assert doubled.chunks == x.chunks and count.shape == (1,)
    d, c = dask.compute(doubled, count)
    np.testing.assert_array_equal(d, 2 * xn)
    np.testing.assert_array_equal(c, [xn.size])
    per = dg.map_kernel(doubled_and_count, dg.Out(np.int64, like=x),
                        dg.Out(np.int64, per_chunk=1), x)[1]
    np.testing.assert_array_equal(per.compute()[:, 0], x.chunks[0])


# -- combine ------------------------------------------------------------------

@pytest.mark.parametrize("combine", ["sum", np.add, lambda a, b: a + b])
def test_histogram_combines_to_bincount(simulate, combine):
    xn, x = _values()
    counts = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine=combine), x)
    assert counts.shape == (4,) and counts.dtype == np.int64
    np.testing.assert_array_equal(counts.compute(), np.bincount(xn % 4, minlength=4))


@pytest.mark.parametrize("combine, reduce", [
    ("sum", np.sum), ("prod", np.prod), ("min", np.min), ("max", np.max),
    (np.add, np.sum), (np.multiply, np.prod), (np.minimum, np.min), (np.maximum, np.max),
    (np.fmin, np.min), (np.fmax, np.max),
])
def test_every_combine_of_chunk_values(simulate, combine, reduce):
    # Each chunk puts its first element; combining those must equal reducing them.
    xn = np.array([3., -2., 5., 0.5, 7., -1., 2., 4.])
    x = da.from_array(xn, chunks=1)
    out = dg.map_kernel(first_and_size, dg.Out(np.float64, per_chunk=2, combine=combine), x)
    got = out.compute()
    assert got[0] == reduce(xn)
    assert got[1] == reduce(np.ones(8))


def test_min_and_max_start_from_the_dtype_identity(simulate):
    xn = np.array([5, 9, -3, 12, 7, 4], dtype=np.int32)
    x = da.from_array(xn, chunks=2)
    total, low, high = dg.map_kernel(
        chunk_stats, dg.Out(np.int32, per_chunk=1, combine="sum"),
        dg.Out(np.int32, per_chunk=1, combine="min"),
        dg.Out(np.int32, per_chunk=1, combine="max"), x)
    assert dask.compute(total, low, high) == ([xn.sum()], [-3], [12])
    low = dg.Out(np.float32, per_chunk=1, combine="min")
    assert low.fill == np.inf
    assert dg.Out(np.uint8, per_chunk=1, combine="max").fill == 0
    assert dg.Out(np.int16, per_chunk=1, combine=np.minimum).fill == 32767
    assert dg.Out(np.float64, per_chunk=1, combine="prod").fill == 1


def test_explicit_fill_with_combine(simulate):
    xn = np.array([5., 9., 3., 12.])
    x = da.from_array(xn, chunks=1)
    _, low, _ = dg.map_kernel(
        chunk_stats, dg.Out(np.float64, per_chunk=1, combine="sum"),
        dg.Out(np.float64, per_chunk=1, combine="min", fill=4.0),
        dg.Out(np.float64, per_chunk=1, combine="max"), x)
    assert low.compute()[0] == 3.0
    _, low, _ = dg.map_kernel(
        chunk_stats, dg.Out(np.float64, per_chunk=1, combine="sum"),
        dg.Out(np.float64, per_chunk=1, combine="min", fill=1.0),
        dg.Out(np.float64, per_chunk=1, combine="max"), x)
    assert low.compute()[0] == 1.0  # the fill is every launch's start


@pytest.mark.parametrize("split_every", [2, 3, 16, None])
def test_split_every_shapes_the_tree_not_the_result(simulate, split_every):
    xn = (np.arange(500) % 13).astype(np.int64)
    x = da.from_array(xn, chunks=20)  # 25 chunks
    counts = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="sum"), x,
                           split_every=split_every)
    np.testing.assert_array_equal(counts.compute(), np.bincount(xn % 4, minlength=4))
    if split_every is not None and not EXPRESSIONS:  # counts the HighLevelGraph's layers
        layers = [k for k in counts.dask.layers if "combine" in k]
        # Folding k partials a step: ceil(log_k(25)) steps in all.
        assert len(layers) == max(1, int(np.ceil(np.log(25) / np.log(split_every)))) + 1


def test_2d_map_combines_over_every_block(simulate):
    xn = np.arange(8 * 9, dtype=np.float64).reshape(8, 9)
    x = da.from_array(xn, chunks=(3, 4))
    sums = dg.map_kernel(tile_sums, dg.Out(np.float64, per_chunk=(2, 3), combine="sum"), x,
                         split_every=2)
    want = np.zeros((2, 3))
    for i in range(8):  # the kernel indexes the chunk: local row i % 3, column j % 4
        for j in range(9):
            want[(i % 3) % 2, (j % 4) % 3] += xn[i, j]
    np.testing.assert_array_equal(sums.compute(), want)


def test_combine_keeps_the_dtype(simulate):
    xn = np.full(40, 100, dtype=np.int8)
    x = da.from_array(xn, chunks=10)
    # int8 partials: numpy's sum would widen to int64; the combine keeps int8 (and wraps).
    out = dg.map_kernel(first_and_size, dg.Out(np.int8, per_chunk=2, combine="sum"), x)
    got = out.compute()
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, np.array([400 - 512, 40], dtype=np.int8))


def test_equal_calls_give_equal_keys(simulate):
    _, x = _values()
    a = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="sum"), x)
    b = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="sum"), x)
    c = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="max"), x)
    assert a.name == b.name != c.name


# -- errors -------------------------------------------------------------------

def test_per_chunk_with_depth_is_refused(simulate):
    _, x = _values()
    with pytest.raises(ValueError, match=r"depth=1 with a per-chunk output.*map without depth"):
        dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4), x, depth=1)


@pytest.mark.parametrize("combine, error, match", [
    ("mean", ValueError, r"combine='mean'.*'max', 'min', 'prod', 'sum'"),
    (np.sqrt, TypeError, r"np.sqrt.*takes 1 inputs.*two partial results"),
    (3, TypeError, r"takes 'sum'.*got int 3"),
])
def test_bad_combine(combine, error, match):
    with pytest.raises(error, match=match):
        dg.Out(np.float32, per_chunk=4, combine=combine)


@pytest.mark.parametrize("dtype, fill", [
    (np.uint8, -1), (np.int8, 300), (np.int32, 0.5), (np.int64, np.inf), (np.float32, 1e300),
    (np.bool_, 2), (np.float64, 1j),
])
def test_fill_that_does_not_fit_the_dtype(dtype, fill):
    with pytest.raises(ValueError, match=r"fill=.* does not fit dtype " + np.dtype(dtype).name):
        dg.Out(dtype, per_chunk=1, fill=fill)


def test_other_per_chunk_misuse():
    x = da.ones(4, chunks=2)
    with pytest.raises(TypeError, match="takes no like=, shape= or chunks="):
        dg.Out(np.float32, per_chunk=4, like=x)
    with pytest.raises(TypeError, match="applies to per-chunk outputs"):
        dg.Out(np.float32, like=x, combine="sum")
    with pytest.raises(ValueError, match="non-negative int or tuple"):
        dg.Out(np.float32, per_chunk=(-1,))


def test_per_chunk_alone_has_no_chunks_to_map(simulate):
    with pytest.raises(ValueError, match="a per-chunk output has no chunks"):
        dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4), np.arange(4))


def test_callable_combine_must_keep_the_shape(simulate):
    _, x = _values()
    out = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine=lambda a, b: a[:2]), x)
    with pytest.raises(ValueError, match=r"returned ndarray of shape \(2,\).*same shape"):
        out.compute()


# -- on a GPU -----------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_histogram_of_host_chunks():
    xn = (np.arange(1 << 20) * 2654435761 % 1009).astype(np.int64)
    x = da.from_array(xn, chunks=1 << 17)
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "threads"}):
        counts = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="sum"), x)
        np.testing.assert_array_equal(counts.compute(), np.bincount(xn % 4, minlength=4))
        total, low, high = dg.map_kernel(
            chunk_stats, dg.Out(np.int64, per_chunk=1, combine="sum"),
            dg.Out(np.int64, per_chunk=1, combine="min"),
            dg.Out(np.int64, per_chunk=1, combine="max"), x)
        assert dask.compute(total, low, high) == ([xn.sum()], [xn.min()], [xn.max()])


@pytest.mark.gpu
@pytest.mark.parametrize("combine", ["sum", np.add, lambda a, b: a + b])
def test_gpu_cupy_partials_stay_on_the_device(combine):
    cupy = pytest.importorskip("cupy")
    xn = (np.arange(1 << 18) % 97).astype(np.int64)
    x = da.from_array(cupy.asarray(xn), chunks=1 << 15)
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "threads"}):
        per = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4), x)
        assert isinstance(per._meta, cupy.ndarray)
        assert isinstance(per.compute(), cupy.ndarray)
        counts = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine=combine), x,
                               split_every=2)
        assert isinstance(counts._meta, cupy.ndarray)
        got = counts.compute()
        assert isinstance(got, cupy.ndarray)
        np.testing.assert_array_equal(got.get(), np.bincount(xn % 4, minlength=4))
