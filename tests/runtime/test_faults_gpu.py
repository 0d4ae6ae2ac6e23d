"""A kernel that poisons its CUDA context: the task fails, the worker is replaced."""

import time

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg

pytestmark = pytest.mark.gpu


@dg.jit("void(float32[::1])")
def wild_store(a):
    i = cuda.grid(1)
    if i == 0:
        a[i + (1 << 40)] = 1.0  # far past the array: an illegal address


@dg.jit("void(float32[::1])")
def ones(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = 1.0


def test_illegal_address_fails_the_task_and_the_worker_is_replaced():
    from distributed import Client

    with dg.LocalGPUCluster(simulate=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        before = set(client.scheduler_info()["workers"])
        good = client.submit(ones.forall(64), np.zeros(64, np.float32))
        assert (good.result() == 1).all()
        bad = client.submit(wild_store[1, 1], np.zeros(64, np.float32))
        with pytest.raises(Exception, match="ILLEGAL_ADDRESS"):
            bad.result()
        # The earlier result is untouched, and a new worker process takes over.
        assert (good.result() == 1).all()
        deadline = time.time() + 90
        while time.time() < deadline:
            now = set(client.scheduler_info()["workers"])
            if now and not now & before:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"worker was not replaced: before {before}, now {now}")
        again = client.submit(ones.forall(64), np.zeros(64, np.float32), pure=False)
        assert (again.result(timeout=60) == 1).all()
