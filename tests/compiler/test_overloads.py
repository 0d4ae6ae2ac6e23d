"""Which compiled signature a launch takes: Numba's dispatcher rules, without a GPU."""

import pickle

import numpy as np
import pytest

import daskgpu as dg
from daskgpu._runtime.dispatch import select_image


def store(out, x):
    out[0] = x


def sig_of(kernel, *args):
    return kernel.select_image(args).signature


def test_an_eager_kernel_takes_an_out_of_range_int_by_an_unsafe_cast():
    k = dg.jit("void(int32[:], int32)")(store)
    assert sig_of(k, np.zeros(1, np.int32), 0xFFFFFFFF) == "(int32[:], int32)"
    assert sig_of(k, np.zeros(1, np.int32), np.uint64(2**40)) == "(int32[:], int32)"
    shipped = pickle.loads(pickle.dumps(k))  # a worker cannot compile either
    assert shipped.select_image((np.zeros(1, np.int32), 0x80000000)).signature == "(int32[:], int32)"


def test_a_lazy_kernel_compiles_instead_of_casting_unsafely():
    k = dg.jit(store)
    k.compile("void(int32[:], int32)")
    assert sig_of(k, np.zeros(1, np.int32), 5) == "(int32[:], int32)"
    assert sig_of(k, np.zeros(1, np.int32), 0xFFFFFFFF) == "(int32[::1], int64)"


def test_an_integer_array_is_read_as_the_signatures_integer_dtype_of_its_size():
    k = dg.jit("void(int32[:], int32)")(store)
    assert sig_of(k, np.zeros(1, np.uint32), 1) == "(int32[:], int32)"
    for wrong in (np.zeros(1, np.float32), np.zeros(1, np.int64), np.zeros((1, 1), np.uint32)):
        with pytest.raises(TypeError, match="no compiled signature"):
            k.select_image((wrong, 1))


def test_exact_matches_win_over_unsafe_casts():
    k = dg.jit(["void(int32[:], int32)", "void(uint32[:], int64)"])(store)
    assert sig_of(k, np.zeros(1, np.uint32), 0xFFFFFFFF) == "(uint32[:], int64)"
    assert sig_of(k, np.zeros(1, np.int32), 7) == "(int32[:], int32)"
    # Among unsafe matches, the one with fewest casts.
    assert sig_of(k, np.zeros(1, np.uint32), np.uint64(2**63 + 1)) == "(uint32[:], int64)"


def test_floats_never_cast_to_integers():
    k = dg.jit("void(int32[:], int32)")(store)
    for bad in (1.5, np.float64(2.0), 1j):
        with pytest.raises(TypeError, match="no compiled signature"):
            select_image("store", k.images, (np.zeros(1, np.int32), bad))


def test_numbers_cast_to_floats_and_complexes():
    f = dg.jit("void(float32[:], float32)")(store)
    assert sig_of(f, np.zeros(1, np.float32), np.float64(1e300)) == "(float32[:], float32)"
    c = dg.jit("void(complex64[:], complex64)")(store)
    assert sig_of(c, np.zeros(1, np.complex64), np.int64(3)) == "(complex64[:], complex64)"
