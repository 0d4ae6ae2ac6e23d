"""A new user's first mistakes around Dask end in one error that names the fix (simulated)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module", params=["simulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def client(request):
    from distributed import Client, Scheduler, SpecCluster, Worker

    if request.param == "gpu":
        with dask.config.set({"daskgpu.simulate": False}), \
                dg.LocalGPUCluster(simulate=False, dashboard_address=":0") as cluster, \
                Client(cluster) as c:
            yield c
        return
    with dask.config.set({"daskgpu.simulate": True}):
        # In-process workers: the task's function still travels pickled, by value.
        spec = {"gpu": {"cls": Worker, "options": {"nthreads": 1, "resources": {"GPU": 1}}}}
        with SpecCluster(workers=spec, scheduler={
                "cls": Scheduler, "options": {"dashboard_address": ":0"}}) as cluster, \
                Client(cluster) as c:
            yield c


def test_a_lazy_kernel_in_a_users_block_function_fails_naming_the_fix(client):
    # Before: "TypeError: Could not serialize object of type _HLGExprSequence", the fix
    # only in a chained traceback.
    @dg.jit
    def double(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] *= 2

    def twice(block):  # a closure: Dask pickles it, and the kernel with it, by value
        block = block.copy()
        double.forall(block.size)(block)
        return block

    x = da.ones(8, chunks=4, dtype=np.float32)
    y = da.map_blocks(twice, x, meta=np.empty((0,), np.float32))  # meta=: f is not run here
    with pytest.raises(dg.PicklingError, match=r"kernel 'double' reached a Dask task with no "
                       r"compiled signature.*double\.specialize\(\*example_args\).*"
                       r"dg\.map_kernel\(double"):
        y.compute()
    # What it advises works.
    ready = double.specialize(np.zeros(1, np.float32))

    def twice_compiled(block):
        block = block.copy()
        ready.forall(block.size)(block)
        return block

    y = da.map_blocks(twice_compiled, x, meta=np.empty((0,), np.float32))
    np.testing.assert_array_equal(y.compute(), np.full(8, 2, np.float32))


def test_submitting_a_kernel_without_a_configuration_names_the_launch(client):
    # Before: "'PTXKernel' object is not callable".
    @dg.jit("void(float32[::1])")
    def ones(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = 1

    future = client.submit(ones, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match=r"must be launched with a configuration.*"
                       r"client\.submit\(ones\.forall\(n\), \*args\)"):
        future.result()
    result = client.submit(ones.forall(4), np.zeros(4, np.float32)).result()
    np.testing.assert_array_equal(result, np.ones(4, np.float32))


# -- block sizes a kernel depends on -------------------------------------------------

TPB = 64


@dg.jit
def block_sums(sums, x):
    partial = cuda.shared.array(TPB, np.float32)  # sized for blocks of TPB threads
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    partial[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    if t == 0:
        total = np.float32(0)
        for k in range(TPB):
            total += partial[k]
        cuda.atomic.add(sums, 0, total)


@dg.jit
def reversed_in_block(out, x):
    tile = cuda.shared.array(0, np.float32)  # dynamic: sized at launch
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    if i < x.size:
        tile[t] = x[i]
    cuda.syncthreads()
    if i < x.size:
        out[i] = tile[cuda.blockDim.x - 1 - t]


def test_static_shared_memory_needs_tpb(simulate):
    # Before, the simulator's block size happened to be 64 and this passed; on a GPU the
    # occupancy API may choose another, and the shared array overflows silently.
    x = da.ones(256, chunks=128, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^kernel 'block_sums' declares 256 bytes of static "
                       r"shared memory .*pass tpb= that block size"):
        dg.map_kernel(block_sums, dg.Out(np.float32, per_chunk=1, combine="sum"), x)
    total = dg.map_kernel(block_sums, dg.Out(np.float32, per_chunk=1, combine="sum"), x,
                          tpb=TPB)
    np.testing.assert_array_equal(total.compute(), [256])


@pytest.mark.gpu
def test_gpu_static_shared_memory_with_tpb_sums_right():
    xn = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
    x = da.from_array(xn, chunks=1 << 18)
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "sync"}):
        total = dg.map_kernel(block_sums, dg.Out(np.float32, per_chunk=1, combine="sum"), x,
                              tpb=TPB).compute()
    np.testing.assert_allclose(total, [xn.sum(dtype=np.float64)], rtol=1e-4)


def test_dynamic_shared_memory_is_refused(simulate):
    x = da.ones(256, chunks=128, dtype=np.float32)
    for tpb in (0, 64):
        with pytest.raises(ValueError, match=r"^kernel 'reversed_in_block' uses dynamic shared "
                           r"memory .*map_kernel launches with none"):
            dg.map_kernel(reversed_in_block, dg.Out(np.float32, like=x), x, tpb=tpb)


@cuda.jit(device=True)
def _bump_in_shared(x, i):
    scratch = cuda.shared.array((4, 8), np.int32)  # in a device function: 128 bytes
    scratch[0, 0] = 1
    cuda.syncthreads()
    x[i] += scratch[0, 0]


@dg.jit
def bump(x):
    i = cuda.grid(1)
    if i < x.size:
        _bump_in_shared(x, i)


def test_static_shared_memory_of_a_device_function_counts_too(simulate):
    x = da.zeros(8, chunks=4, dtype=np.int32)
    with pytest.raises(ValueError, match=r"'bump' declares 128 bytes of static shared memory"):
        dg.map_kernel(bump, x)
    np.testing.assert_array_equal(dg.map_kernel(bump, x, tpb=4).compute(), np.ones(8))
