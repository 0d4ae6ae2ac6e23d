"""Recycling and bounds of the page-locked output pool, with plain host buffers.

Page-locking itself and DMA into these arrays are in test_pinned_arrays_gpu.py.
"""

import gc
import threading

import numpy as np
import pytest

from daskgpu._runtime.gpu.pinned_arrays import PinnedArrays

MiB = 1 << 20


class HostBuffer:
    """A pageable stand-in for PageLockedBuffer that records its frees."""

    freed = []

    def __init__(self, nbytes):
        self.array = np.empty(nbytes, np.uint8)

    def free(self):
        HostBuffer.freed.append(self.array.nbytes)
        self.array = None


@pytest.fixture
def pool():
    HostBuffer.freed = []
    return PinnedArrays(8 * MiB, granule=MiB, new_buffer=HostBuffer)


@pytest.mark.parametrize("order", ["C", "F"])
def test_arrays_have_the_shape_dtype_and_layout_asked_for(pool, order):
    a = pool.empty((300, 500), np.float64, order)
    assert a.shape == (300, 500) and a.dtype == np.float64
    assert a.flags.c_contiguous if order == "C" else a.flags.f_contiguous
    a[...] = 7
    assert (a == 7).all()
    assert pool.held_bytes == 2 * MiB  # 1.14 MiB rounded up to the granule


def test_a_freed_array_gives_its_buffer_to_the_next_of_its_size(pool):
    a = pool.empty((MiB // 4,), np.float32)
    address = a.ctypes.data
    del a
    b = pool.empty((MiB // 8 - 5,), np.float64)  # a different shape in the same granule
    assert b.ctypes.data == address
    assert pool.made == 1


def test_views_keep_the_buffer_in_use(pool):
    a = pool.empty((MiB,), np.uint8)
    view = a[10:20]
    address = a.ctypes.data
    del a
    b = pool.empty((MiB,), np.uint8)
    assert b.ctypes.data != address and pool.made == 2
    del b
    assert pool.empty((MiB,), np.uint8).ctypes.data != address  # b's buffer, not view's
    del view
    both = [pool.empty((MiB,), np.uint8) for _ in range(2)]
    assert address in {x.ctypes.data for x in both} and pool.made == 2


def test_live_arrays_filling_the_bound_give_none(pool):
    live = [pool.empty((4 * MiB,), np.uint8) for _ in range(2)]
    assert pool.empty((1,), np.uint8) is None
    assert pool.held_bytes == 8 * MiB
    del live[0]
    assert pool.empty((4 * MiB,), np.uint8) is not None


def test_idle_buffers_are_freed_oldest_size_first_to_make_room(pool):
    for size in (2 * MiB, 3 * MiB, 1 * MiB):  # all idle once made and dropped
        pool.empty((size,), np.uint8)
    assert pool.held_bytes == 6 * MiB and HostBuffer.freed == []
    kept = pool.empty((5 * MiB,), np.uint8)
    assert HostBuffer.freed == [2 * MiB, 3 * MiB]  # 1 MiB was used last, so kept
    assert pool.held_bytes == 6 * MiB and kept is not None


def test_reuse_makes_a_size_the_most_recently_used(pool):
    for size in (2 * MiB, 3 * MiB):
        pool.empty((size,), np.uint8)
    pool.empty((2 * MiB,), np.uint8)  # 2 MiB is now the newest
    pool.empty((5 * MiB,), np.uint8)
    assert HostBuffer.freed == [3 * MiB]


def test_clear_frees_idle_buffers_and_keeps_live_ones(pool):
    live = pool.empty((MiB,), np.uint8)
    pool.empty((2 * MiB,), np.uint8)
    pool.clear()
    assert HostBuffer.freed == [2 * MiB]
    assert pool.held_bytes == MiB
    live[...] = 1  # still valid memory
    del live
    assert pool.empty((MiB,), np.uint8) is not None and pool.made == 2


def test_arrays_freed_in_other_threads_come_back(pool):
    arrays = [pool.empty((MiB,), np.uint8) for _ in range(4)]
    addresses = {a.ctypes.data for a in arrays}

    def drop():
        arrays.clear()
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    again = [pool.empty((MiB,), np.uint8) for _ in range(4)]
    assert {a.ctypes.data for a in again} == addresses and pool.made == 4


def test_a_failing_allocation_gives_back_its_room(pool):
    def broken(nbytes):
        raise MemoryError("no pages")

    pool.new_buffer = broken
    with pytest.raises(MemoryError):
        pool.empty((MiB,), np.uint8)
    assert pool.held_bytes == 0
