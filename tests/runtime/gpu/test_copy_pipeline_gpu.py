"""The pinned copy pipeline on a GPU: large host arrays in every layout, outputs."""

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._image.array_info import Zeroed

pytestmark = pytest.mark.gpu


@dg.jit
def affine(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * 3 + 1


@dg.jit
def affine2(out, x):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = x[i, j] * 3 + 1


@pytest.mark.parametrize("n", [(64 << 20) // 4 + 12345, 1 << 20])  # pipelined, and direct
def test_large_host_arrays_round_trip(n):
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    out = np.zeros_like(x)
    res = affine.forall(n)(out, x)
    assert res is out
    np.testing.assert_array_equal(out, x * 3 + 1)


@pytest.mark.parametrize("order", ["F", "strided"])
def test_large_2d_host_arrays_in_other_layouts(order):
    base = np.random.default_rng(1).random((4096, 2 * 2048), dtype=np.float32)
    x = np.asfortranarray(base[:, :2048]) if order == "F" else base[:, ::2]
    out = np.zeros(x.shape, np.float32, order="F" if order == "F" else "C")
    res = affine2.forall(x.shape)(out, x)
    assert res is out
    np.testing.assert_array_equal(out, x * 3 + 1)


@dg.jit("void(float32[::1], float32[::1])")
def evens(out, x):
    i = cuda.grid(1)
    if i < out.size and i % 2 == 0:
        out[i] = x[i]


@pytest.mark.parametrize("n", [(32 << 20) // 4, 1 << 10])  # page-locked, and as given
def test_zeroed_output_starts_as_zeros_and_is_returned_bare(n):
    garbage = np.full(n, 7, np.float32)
    res = evens.forall(n)(Zeroed(garbage), np.ones(n, np.float32))
    assert type(res) is np.ndarray and res.shape == (n,)
    assert (res[::2] == 1).all() and (res[1::2] == 0).all()


def test_pinned_pool_stays_bounded_over_many_launches():
    from daskgpu._runtime.gpu.host_staging import stager

    x = np.ones((16 << 20) // 4, np.float32)
    out = np.empty_like(x)
    for _ in range(20):
        affine.forall(x.size)(out, x)
    pool = stager().pool
    assert pool.allocated_bytes <= pool.max_slots * pool.slot_bytes
    assert (out == 4).all()


def test_device_memory_is_flat_over_many_launches():
    from cuda.bindings import driver

    x = np.ones(1 << 20, np.float32)
    out = np.empty_like(x)
    affine.forall(x.size)(out, x)

    def used():
        free, total = driver.cuMemGetInfo()[1:]
        return total - free

    before = used()
    for _ in range(2000):
        affine.forall(x.size)(out, x)
    assert used() - before <= 64 << 20


def test_launches_from_threads_at_once_share_slots_safely():
    # Slots go back to the pool while their transfers are in flight; every
    # other launch must wait for those before refilling a slot.
    from concurrent.futures import ThreadPoolExecutor

    from daskgpu._cli.bench.kernels import add

    n = (64 << 20) // 4 + 999
    xs = [np.random.default_rng(k).random(n, dtype=np.float32) for k in range(4)]
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda k: add.forall(n)(np.zeros(n, np.float32), xs[k % 4], xs[k % 4]),
                           range(8)))
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, 2 * xs[k % 4])


def test_pinned_pool_hands_out_the_oldest_returned_slots_first():
    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.copy_pipeline import PinnedPool

    device.current()
    pool = PinnedPool(1 << 20, 4 << 20)
    first, second = pool.acquire(2), pool.acquire(2)
    pool.release(first)
    pool.release(second)
    try:
        assert pool.acquire(2) == first  # the ones whose transfers were queued earliest
    finally:
        pool.release(first)
        pool.clear()
    assert pool.allocated_bytes == 0


def test_device_chain_copies_each_host_array_once_and_frees_everything():
    from cuda.bindings import driver

    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.chains.device_chain import DeviceChain
    from daskgpu._runtime.gpu.host_staging import stager

    device.current()
    x = np.random.default_rng(4).random((64 << 20) // 4 + 7, dtype=np.float32)  # pipelined
    small = np.arange(1000, dtype=np.float32)
    affine.forall(small.size)(np.empty_like(small), small)  # compiles float32[::1] here
    chain = DeviceChain(stager)
    dx = chain.to_device(x)
    assert chain.to_device(x) is dx and chain.to_device(small) is not dx
    mid = chain.zeros(x.shape, np.float32)
    out = np.empty_like(x)
    affine.forall(x.size, stream=chain.handle)(mid, dx)  # mid = 3x + 1, on the device
    affine.forall(x.size, stream=chain.handle)(out, mid)  # out = 3 mid + 1, copied back
    np.testing.assert_array_equal(out, (x * 3 + 1) * 3 + 1)
    back = np.empty_like(small)
    driver.cuMemcpyDtoH(back.ctypes.data, chain.to_device(small).ptr, small.nbytes)
    np.testing.assert_array_equal(back, small)
    chain.free()
    assert not chain._allocations and not chain._copies
