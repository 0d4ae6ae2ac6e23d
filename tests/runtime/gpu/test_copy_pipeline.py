"""The copy pipeline's bookkeeping, without a GPU (its transfers: test_copy_pipeline_gpu.py)."""

import threading

import numpy as np
import pytest

from daskgpu._runtime.gpu.copy_pipeline import PinnedPool, Stager


def test_copy_threads_account_their_busy_time_from_several_threads():
    stager = Stager(PinnedPool(1 << 20, 1 << 20), threads=4)  # no slot is allocated here
    src = np.arange(1 << 20, dtype=np.uint8)
    dsts = [np.empty_like(src) for _ in range(8)]
    workers = [threading.Thread(target=stager._copy, args=(d, src)) for d in dsts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for d in dsts:
        np.testing.assert_array_equal(d, src)
    assert stager.threads == 4
    assert stager.busy_seconds > 0
    before = stager.busy_seconds
    stager._copy(dsts[0], src)
    assert stager.busy_seconds > before


@pytest.mark.parametrize("threads", [0, -3])
def test_at_least_one_copy_thread(threads):
    assert Stager(PinnedPool(1 << 20, 1 << 20), threads=threads).threads == 1


@pytest.mark.parametrize("nbytes, threads, pieces", [
    (16 << 20, 8, 8),          # 2 MiB each: every thread copies one
    (64 << 20, 8, 8),          # a slot each
    (256 << 20, 8, 32),        # never more than a slot
    (3 << 20, 8, 3),           # never under a MiB
    (16 << 20, 2, 2),          # 8 MiB each: one a thread
    ((16 << 20) + 5, 8, 8),    # whole pages, the remainder last
])
def test_copies_are_cut_to_keep_every_thread_busy(nbytes, threads, pieces):
    stager = Stager(PinnedPool(8 << 20, 64 << 20), threads=threads)
    cut = stager._pieces(nbytes)
    assert len(cut) == pieces
    assert sum(size for _, size in cut) == nbytes
    assert all(off % 4096 == 0 and size <= 8 << 20 for off, size in cut)
    assert [off for off, _ in cut] == sorted({off for off, _ in cut})
