"""Page-locked outputs on a GPU: made, filled by DMA alone, recycled, fed back in."""

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._image.array_info import Zeroed
from daskgpu._runtime.gpu import host_staging
from daskgpu._runtime.gpu.pinned_arrays import (
    PageLockedBuffer,
    PinnedArrays,
    is_page_locked,
)

pytestmark = pytest.mark.gpu

N = (32 << 20) // 4  # above daskgpu.pipeline-min-bytes


def values(n):
    """Small whole numbers, so that 9x is exact in float32, differing between chunks of N."""
    return (np.arange(n) % 4099).astype(np.float32)


@dg.jit("void(float32[::1], float32[::1])")
def triple(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 3 * x[i]


def test_page_locked_buffer_is_locked_until_freed():
    from daskgpu._runtime.gpu import device

    device.current()
    buffer = PageLockedBuffer(4 << 20)
    assert is_page_locked(buffer.array)
    array = buffer.array
    buffer.free()
    assert not is_page_locked(array)
    assert not is_page_locked(np.ones(4 << 20, np.uint8))


def test_large_fresh_output_is_page_locked_and_needs_no_copy_thread():
    x = values(N)
    triple.forall(N)(Zeroed(np.empty(N, np.float32)), x)  # warm: links, fills the pools
    stager = host_staging.stager()
    busy = stager.busy_seconds
    out = triple.forall(N)(Zeroed(np.empty(N, np.float32)), x)
    copied_in = stager.busy_seconds - busy
    assert is_page_locked(out)
    np.testing.assert_array_equal(out, 3 * x)

    # Fed back in, the page-locked output goes to the GPU without copy threads.
    busy = stager.busy_seconds
    again = triple.forall(N)(Zeroed(np.empty(N, np.float32)), out)
    assert stager.busy_seconds == busy and copied_in > 0
    np.testing.assert_array_equal(again, 9 * x)


def test_outputs_are_recycled_once_freed():
    x = np.ones(N, np.float32)
    pool = host_staging.pinned_outputs()
    for _ in range(3):  # each result dies before the next launch
        triple.forall(N)(Zeroed(np.empty(N, np.float32)), x)
    made = pool.made
    for _ in range(10):
        out = triple.forall(N)(Zeroed(np.empty(N, np.float32)), x)
        assert out[0] == 3
        del out
    assert pool.made == made


def test_a_full_pool_falls_back_to_pageable_outputs(monkeypatch):
    monkeypatch.setattr(host_staging, "pinned_outputs", lambda: PinnedArrays(0))
    x = np.ones(N, np.float32)
    given = np.empty(N, np.float32)
    out = triple.forall(N)(Zeroed(given), x)
    assert out is given and not is_page_locked(out)
    assert (out == 3).all()


def test_map_kernel_chains_page_locked_chunks():
    import dask.array as da

    x = da.from_array(values(4 * N), chunks=N)
    y = dg.map_kernel(triple, dg.Out(np.float32, like=x), x)
    z = dg.map_kernel(triple, dg.Out(np.float32, like=y), y)
    np.testing.assert_array_equal(z.compute(scheduler="threads"), 9 * values(4 * N))
