"""map_kernel takes da.map_blocks' keywords with their Dask meaning (simulated)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg


@dg.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@dg.jit
def histogram4(counts, x):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(counts, x[i] % 4, 1)


@dg.jit
def increment(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@pytest.fixture
def x():
    return da.from_array(np.arange(24.0).reshape(4, 6), chunks=(2, 3))


# -- dtype= and meta= ------------------------------------------------------------

def test_dtype_is_the_dtype_of_outputs_that_give_none(simulate, x):
    z = dg.map_kernel(axpy, dg.Out(like=x), 2.0, x, x, dtype=np.float32)
    assert z.dtype == np.float32 and z._meta.dtype == np.float32
    np.testing.assert_array_equal(z.compute(), (3 * np.arange(24.0).reshape(4, 6)).astype("f4"))


def test_meta_gives_the_output_type_and_its_dtype(simulate, x):
    z = dg.map_kernel(axpy, dg.Out(), 1.0, x, x, meta=np.empty((0, 0), np.float32))
    assert z.dtype == np.float32 and type(z._meta) is np.ndarray
    assert z.compute().dtype == np.float32
    # dtype= wins over meta's dtype, as in da.map_blocks.
    z = dg.map_kernel(axpy, dg.Out(), 1.0, x, x, meta=np.empty(0, np.float32), dtype="f8")
    assert z.dtype == np.float64
    with pytest.raises(TypeError, match=r"meta=.*takes a NumPy or CuPy array.*got list"):
        dg.map_kernel(axpy, dg.Out(), 1.0, x, x, meta=[])


def test_dtype_that_a_result_cannot_have_is_refused(simulate, x):
    with pytest.raises(ValueError, match=r"dtype=int32, but kernel 'axpy' also returns float64"):
        dg.map_kernel(axpy, dg.Out(np.float64, like=x), 1.0, x, x, dtype=np.int32)
    with pytest.raises(ValueError, match=r"dtype=float32.*'increment' also returns float64"):
        dg.map_kernel(increment, x, dtype=np.float32)
    assert dg.map_kernel(increment, x, dtype=x.dtype).dtype == x.dtype


def test_per_chunk_output_takes_dtype_too(simulate):
    x = da.arange(10, chunks=3)
    counts = dg.map_kernel(histogram4, dg.Out(per_chunk=4, combine="sum"), x, dtype=np.int32)
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts.compute(), [3, 3, 2, 2])


# -- dg.Out without like= -----------------------------------------------------

def test_out_without_like_takes_the_mapped_arrays_shape_and_chunks(simulate, x):
    z = dg.map_kernel(axpy, dg.Out(np.float64), 1.0, x, x)
    assert z.shape == x.shape and z.chunks == x.chunks
    np.testing.assert_array_equal(z.compute(), 2 * np.arange(24.0).reshape(4, 6))
    # Arrays of different shapes: the output has their broadcast shape, as map_blocks'.
    row = da.from_array(np.arange(6.0), chunks=3)
    z = dg.map_kernel(axpy, dg.Out(np.float64), 1.0, x, row)
    assert z.shape == (4, 6) and z.chunks == x.chunks
    np.testing.assert_array_equal(z.compute(), x.compute() + np.arange(6.0))


def test_out_without_like_repr():
    assert repr(dg.Out(np.float64)) == "Out(float64, shape from map_kernel)"
    assert repr(dg.Out(per_chunk=2)) == "Out(dtype from map_kernel, per_chunk=2)"


# -- chunks=, drop_axis=, new_axis= ---------------------------------------------

def test_chunks_are_checked_against_the_mapped_chunks(simulate, x):
    z = dg.map_kernel(axpy, dg.Out(np.float64), 1.0, x, x, chunks=x.chunks)
    assert z.chunks == x.chunks
    assert dg.map_kernel(axpy, dg.Out(np.float64), 1.0, x, x, chunks=(2, 3)).chunks == x.chunks
    with pytest.raises(ValueError, match=r"chunks=\(4, 3\), but each launch fills one mapped "
                                         r"chunk, so its output has chunks \(\(2, 2\), \(3, 3\)\)"):
        dg.map_kernel(axpy, dg.Out(np.float64), 1.0, x, x, chunks=(4, 3))
    with pytest.raises(ValueError, match=r"chunks=, but returns only per-chunk outputs"):
        dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4), x, chunks=(1, 4))


@pytest.mark.parametrize("keyword, match", [
    ("drop_axis", r"takes no drop_axis=1.*per_chunk=shape, combine='sum', axis="),
    ("new_axis", r"takes no new_axis=1.*dg.Out\(dtype, per_chunk=shape\)"),
])
def test_axis_changes_say_what_to_use_instead(simulate, x, keyword, match):
    with pytest.raises(ValueError, match=match):
        dg.map_kernel(axpy, dg.Out(np.float64), 1.0, x, x, **{keyword: 1})


# -- a reduction along some axes -----------------------------------------------

def _block_histograms(values, chunks):
    """Per block, the counts of value % 4, as an array numblocks + (4,)."""
    from dask.array.core import normalize_chunks, slices_from_chunks

    chunks = normalize_chunks(chunks, values.shape)
    counts = [np.bincount(values[s].ravel() % 4, minlength=4)
              for s in slices_from_chunks(chunks)]
    return np.array(counts).reshape(tuple(map(len, chunks)) + (4,))


@pytest.mark.parametrize("axis", [0, 1, -1, (0, 1), None])
@pytest.mark.parametrize("split_every", [None, 2])
def test_per_chunk_combine_along_an_axis(simulate, axis, split_every):
    values = np.random.default_rng(0).integers(0, 100, size=(6, 8))
    x = da.from_array(values, chunks=(2, 3))  # 3 x 3 blocks
    out = dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="sum", axis=axis), x,
                        split_every=split_every)
    per_block = _block_histograms(values, (2, 3))
    # Negative axes count from the last mapped axis, not the per-chunk ones.
    mapped = (0, 1) if axis is None else tuple(int(a) % 2 for a in np.atleast_1d(axis))
    expected = per_block.sum(axis=mapped)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out.compute(), expected)


def test_per_chunk_combine_along_axes_of_a_3d_map_with_max(simulate):
    @dg.jit
    def chunk_max(top, x):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.max(top, 0, x[i])

    values = np.random.default_rng(1).integers(0, 1000, size=(4, 6, 4))
    x = da.from_array(values, chunks=(2, 3, 2))  # 2 x 2 x 2 blocks
    out = dg.map_kernel(chunk_max, dg.Out(np.int64, per_chunk=1, combine="max", axis=(0, 2)), x)
    assert out.shape == (2, 1) and out.chunks == ((1, 1), (1,))
    expected = [[values[:, :3].max()], [values[:, 3:].max()]]
    np.testing.assert_array_equal(out.compute(), expected)


def test_axis_needs_a_combine_and_an_axis_of_the_map(simulate, x):
    with pytest.raises(TypeError, match=r"axis=1\) needs combine="):
        dg.Out(np.int64, per_chunk=4, axis=1)
    with pytest.raises(TypeError, match=r"takes an int or a tuple of ints, got 'x'"):
        dg.Out(np.int64, per_chunk=4, combine="sum", axis="x")
    with pytest.raises(TypeError, match=r"applies to per-chunk outputs"):
        dg.Out(np.int64, like=x, axis=0)
    for axis in (2, (0, 0), (1, -1)):
        with pytest.raises(ValueError, match=r"names mapped axes of this 2-D map: give distinct"):
            dg.map_kernel(histogram4, dg.Out(np.int64, per_chunk=4, combine="sum", axis=axis),
                          x.astype(np.int64))
