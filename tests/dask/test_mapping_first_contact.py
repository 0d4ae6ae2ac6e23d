"""A new user's first mistakes around Dask end in one error that names the fix (simulated)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, Scheduler, SpecCluster, Worker

    with dask.config.set({"daskgpu.simulate": True}):
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
