"""Soak: many launches and tasks leave device memory flat and caches bounded."""

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg

pytestmark = pytest.mark.gpu


@dg.jit("void(float32[::1], float32[::1], float32[::1])")
def add(out, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


def _device_used():
    from cuda.bindings import driver

    free, total = driver.cuMemGetInfo()[1:]
    return total - free


@pytest.mark.slow
def test_ten_thousand_launches_and_two_thousand_tasks():
    from distributed import Client

    from daskgpu._runtime.gpu.linked_kernel import module_cache

    x = np.ones(4096, np.float32)
    launch = add.forall(x.size)
    launch(np.empty_like(x), x, x)
    before = _device_used()
    for _ in range(10_000):
        out = launch(np.empty_like(x), x, x)
    assert (out == 2).all()
    assert _device_used() - before <= 64 << 20
    assert len(module_cache) <= module_cache.maxsize

    with dg.LocalGPUCluster(simulate=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        def used_on_worker():  # nested, so it is pickled by value for the workers
            from cuda.bindings import driver

            free, total = driver.cuMemGetInfo()[1:]
            return total - free

        def worker_memory():
            return client.run(used_on_worker)

        client.submit(launch, np.empty_like(x), x, x).result()
        start = worker_memory()
        futures = [client.submit(launch, np.empty_like(x), x, x, pure=False)
                   for _ in range(2000)]
        results = client.gather(futures)
        assert all((r == 2).all() for r in results)
        end = worker_memory()
        for addr in start:
            assert end[addr] - start[addr] <= 64 << 20
