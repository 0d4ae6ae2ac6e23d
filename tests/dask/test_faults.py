"""Faults on a cluster: a worker process dies mid-job, or a task loses its CUDA context.

Either way the job's result is whole: the nanny starts a fresh worker process,
and the scheduler reruns what was lost. A task that loses the CUDA context
fails with the runtime's ContextLostError, and the worker plugin has its
worker replaced.
"""

import math
import threading
import time

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg


@dg.jit("void(float32[::1], float32[::1], int64)")
def slow_double(out, x, start):
    # start (dg.offset) keeps each chunk's work tied to its place in the array.
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i] + (start + i) * 0


@dg.jit("void(float32[::1], float32[::1], int32)")
def busy_double(out, x, iters):
    # Dependent sin/cos steps make a chunk take time on a real GPU. Adding v * 0
    # keeps them: without fastmath it cannot be folded (v could be NaN), yet v
    # stays in [-1, 1], so the sum is exactly 2 * x.
    i = cuda.grid(1)
    if i < out.size:
        v, half = x[i], np.float32(0.5)  # a float64 0.5 would make the loop float64
        for _ in range(iters):
            v = math.sin(v) * half + math.cos(v) * half
        out[i] = 2 * x[i] + v * 0


def result_after_killing_a_worker(client, future, holding=None, timeout=240):
    """``future``'s result, with one busy worker's process killed during the job.

    Kills the first worker seen processing (and, given a key name ``holding``,
    holding a finished chunk of it, so that results are lost too); checks that
    it left the scheduler.
    """
    killed = []

    def kill_one_worker_once_busy():
        deadline = time.time() + 60
        while time.time() < deadline:
            has_what = client.has_what() if holding else {}
            busy = [w for w, keys in client.processing().items() if keys and (
                not holding or any(isinstance(k, tuple) and k[0] == holding
                                   for k in has_what.get(w, ())))]
            if busy:
                # The nanny sees its worker process die and starts another;
                # the scheduler reruns what was lost. The timer lets run() return.
                client.run(
                    lambda: __import__("threading").Timer(
                        0.05, __import__("os")._exit, (1,)).start(),
                    workers=[busy[0]],
                )
                killed.append(busy[0])
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_worker_once_busy)
    killer.start()
    result = future.result(timeout=timeout)
    killer.join()
    assert killed, "no worker was busy to be killed"
    deadline = time.time() + 30
    while killed[0] in client.scheduler_info()["workers"] and time.time() < deadline:
        time.sleep(0.2)
    assert killed[0] not in client.scheduler_info()["workers"]
    return result


@pytest.mark.slow
def test_worker_killed_mid_job_result_is_complete():
    import dask.array as da
    from distributed import Client

    xn = np.arange(24000, dtype=np.float32)
    with dg.LocalGPUCluster(simulate=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        x = da.from_array(xn, chunks=1000)  # 24 chunks, each ~0.15 s simulated
        out = dg.map_kernel(slow_double, dg.Out(np.float32, like=x), x, dg.offset)
        result = result_after_killing_a_worker(client, client.compute(out))
    np.testing.assert_array_equal(result, 2 * xn)


@pytest.mark.slow
@pytest.mark.gpu
def test_gpu_worker_killed_mid_job_result_is_complete():
    import dask.array as da
    from distributed import Client

    # One worker per GPU and devices may not repeat: on a one-GPU machine the
    # only worker dies, its nanny restarts it and the lost chunks rerun there.
    n = 1 << 24  # float32 holds every index exactly, so 2 * x is exact
    with dg.LocalGPUCluster(simulate=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        # 64 chunks that each about fill an H200; 100k steps make the job ~1-4 s.
        x = da.arange(n, chunks=1 << 18, dtype=np.float32)
        out = dg.map_kernel(busy_double, dg.Out(np.float32, like=x), x, 100_000)
        result = result_after_killing_a_worker(
            client, client.compute(out), holding=out.name, timeout=120)
    np.testing.assert_array_equal(result, 2 * np.arange(n, dtype=np.float32))


@pytest.mark.slow
def test_a_task_that_loses_the_cuda_context_fails_and_its_worker_is_replaced():
    # The runtime raises ContextLostError after a sticky CUDA error, and that is
    # all it does; the GPUWorkerPlugin closes the worker and its nanny starts a
    # fresh process. Simulated here by a task that raises what the runtime raises.
    from distributed import Client

    def lose_the_context():
        from daskgpu._errors import ContextLostError

        raise ContextLostError(700, "launching kernel 'k' failed: CUDA_ERROR_ILLEGAL_ADDRESS: "
                                    "an illegal memory access was encountered.")

    def fail_otherwise():
        raise ValueError("an ordinary failure")

    with dg.LocalGPUCluster(simulate=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        lost, other = sorted(client.scheduler_info()["workers"])
        with pytest.raises(Exception, match="ILLEGAL_ADDRESS"):
            client.submit(lose_the_context, workers=[lost], pure=False).result(timeout=60)
        with pytest.raises(ValueError, match="an ordinary failure"):
            client.submit(fail_otherwise, workers=[other], pure=False).result(timeout=60)
        deadline = time.time() + 90
        while time.time() < deadline:
            now = set(client.scheduler_info()["workers"])
            if lost not in now and len(now) == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"worker {lost} was not replaced: now {now}")
        assert other in now  # an ordinary failure leaves its worker alone
        again = client.submit(lambda: 1, pure=False)
        assert again.result(timeout=60) == 1


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


@pytest.mark.slow
@pytest.mark.gpu
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
