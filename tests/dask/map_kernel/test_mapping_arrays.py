"""The arrays Dask users have: each mapped, or refused when the graph is built naming the fix."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from kit.kernels import double as kit_double
from kit.kernels import saxpy
from layers import hlg_only
from numba import cuda

import daskgpu as dg


@dg.jit
def copy(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i]


@dg.jit
def keep_unmasked(out, x, mask):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 0 if mask[i] else x[i]


@pytest.fixture
def x():
    return da.arange(10, chunks=5, dtype=np.float32)


# -- unknown chunk sizes -------------------------------------------------------------

@hlg_only  # Dask's expressions have no da.ma and no boolean-mask indexing yet
def test_unknown_chunk_sizes_are_refused_naming_compute_chunk_sizes(simulate, x):
    picked = x[x > 3]
    for out in (dg.Out(np.float32, like=x), dg.Out(np.float32)):
        with pytest.raises(ValueError, match=r"argument 1 has unknown chunk sizes.*"
                           r"x = x\.compute_chunk_sizes\(\) first"):
            dg.map_kernel(copy, out, picked)


@hlg_only  # Dask's expressions have no da.ma and no boolean-mask indexing yet
def test_what_the_unknown_chunks_message_advises_works(simulate, x):
    picked = x[x > 3].compute_chunk_sizes()
    z = dg.map_kernel(copy, dg.Out(np.float32), picked)
    np.testing.assert_array_equal(z.compute(), np.arange(4, 10, dtype=np.float32))


# -- masked arrays ---------------------------------------------------------------------

@hlg_only  # Dask's expressions have no da.ma and no boolean-mask indexing yet
def test_a_masked_dask_array_is_refused_not_its_mask_dropped(simulate, x):
    masked = da.ma.masked_greater(x, 5)
    with pytest.raises(TypeError, match=r"argument 1 is a masked array \(da\.ma\).*"
                       r"da\.ma\.filled\(x, fill_value\).*da\.ma\.getmaskarray\(x\)"):
        dg.map_kernel(copy, dg.Out(np.float32, like=masked), masked)


def test_a_masked_numpy_array_passed_whole_is_refused(simulate, x):
    whole = np.ma.masked_greater(np.arange(10, dtype=np.float32), 5)
    with pytest.raises(TypeError, match=r"argument 2 is a numpy masked array.*np\.ma\.filled"):
        dg.map_kernel(keep_unmasked, dg.Out(np.float32, like=x), x, whole)


@hlg_only  # Dask's expressions have no da.ma and no boolean-mask indexing yet
def test_the_masked_arrays_fix_carries_the_mask_as_an_argument(simulate, x):
    masked = da.ma.masked_greater(x, 5)
    z = dg.map_kernel(keep_unmasked, dg.Out(np.float32, like=masked),
                      da.ma.filled(masked, 0), da.ma.getmaskarray(masked))
    assert type(z._meta) is np.ndarray  # the output is plain, like= gives shape and chunks
    want = np.where(np.arange(10) > 5, 0, np.arange(10)).astype(np.float32)
    np.testing.assert_array_equal(z.compute(), want)


# -- record dtypes -------------------------------------------------------------------

def test_out_like_a_record_array_takes_its_shape_and_chunks_only(simulate, x):
    records = da.from_array(np.zeros(10, [("a", "<f4"), ("b", "<f4")]), chunks=5)
    out = dg.Out(np.float32, like=records)
    assert out.shape == (10,) and out.chunks == ((5, 5),)
    z = dg.map_kernel(copy, out, x)
    assert z.dtype == np.float32 and z._meta.dtype == np.float32
    np.testing.assert_array_equal(z.compute(), np.arange(10, dtype=np.float32))


# -- byte order ----------------------------------------------------------------------------

def test_a_big_endian_dask_array_gets_the_astype_fix(simulate, x):
    with pytest.raises(TypeError, match=r"argument 1 has dtype >f4, not in this machine's "
                       r"byte order.*convert with x\.astype\('float32'\)"):
        dg.map_kernel(copy, dg.Out(np.float32, like=x), x.astype(">f4"))
    # The eager path says the same, for an eager kernel's map too.
    with pytest.raises(TypeError, match=r"astype\('float32'\)"):
        dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(1), x.astype(">f4"), x)


def test_a_big_endian_whole_array_gets_the_astype_fix(simulate, x):
    with pytest.raises(TypeError, match=r"argument 2 has dtype >i2.*a\.astype\('int16'\)"):
        dg.map_kernel(keep_unmasked, dg.Out(np.float32, like=x), x, np.zeros(10, ">i2"))


def test_a_big_endian_out_is_refused_naming_the_native_dtype():
    with pytest.raises(TypeError, match=r"dg\.Out got dtype >f4.*dg\.Out\('float32', \.\.\.\)"
                       r".*\.astype\('>f4'\)"):
        dg.Out(">f4", shape=10)
    with pytest.raises(TypeError, match=r"dg\.Out got dtype"):
        dg.Out(np.dtype([("a", ">f4")]), shape=10)


def test_what_the_byte_order_message_advises_works(simulate, x):
    z = dg.map_kernel(copy, dg.Out(np.float32, like=x), x.astype(">f4").astype("float32"))
    np.testing.assert_array_equal(z.compute(), np.arange(10, dtype=np.float32))


# -- forgetting dg.Out -----------------------------------------------------------------

def test_forgetting_the_output_names_dg_out(simulate, x):
    # An eager kernel: before, "takes 4 arguments, got 3" deep in dispatch's message.
    with pytest.raises(TypeError, match=r"^kernel 'saxpy' takes 4 parameters \(out, a, x, y\), "
                       r"but map_kernel got 3 \(a number, a dask array, a dask array\)\. A "
                       r"kernel's outputs are parameters too: pass dg\.Out\(dtype, like=x\) "
                       r"in the place of each array it writes \('out'\)"):
        dg.map_kernel(saxpy, np.float32(2), x, x)


def test_forgetting_the_output_of_a_lazy_kernel_names_dg_out(simulate, x):
    double = dg.jit(kit_double.py_func)  # lazy, and compiled nothing yet

    with pytest.raises(TypeError, match=r"^kernel 'double' takes 2 parameters \(out, x\), but "
                       r"map_kernel got 1 \(a dask array\)\. .*dg\.Out\(dtype, like=x\)"):
        dg.map_kernel(double, x)
    assert double.signatures == []  # refused before compiling anything


def test_too_many_arguments_count_dg_offset_per_dimension(simulate):
    @dg.jit
    def index(out, start):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = start + i

    x2 = da.zeros((4, 4), chunks=2)
    with pytest.raises(TypeError, match=r"takes 2 parameters \(out, start\), but map_kernel got "
                       r"3 \(dg\.Out, dg\.offset; dg\.offset stands for 2 parameters"):
        dg.map_kernel(index, dg.Out(np.int64, like=x2), dg.offset)
