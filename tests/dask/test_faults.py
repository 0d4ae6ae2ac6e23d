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
from distributed import Client
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


@pytest.mark.slow
def test_tasks_that_meet_a_context_lost_by_another_run_again_on_the_fresh_worker():
    # One worker, two threads, three launch tasks: one loses the CUDA context (as the
    # runtime reports it); one running beside it meets the lost context; one waits for a
    # thread. Only the first fails: the others run again on the worker's fresh process.
    # Simulated: the "context" is an environment variable of the worker's process.
    import os

    from daskgpu._errors import ContextLostError
    from daskgpu._runtime.launch_task import LaunchTask

    class Probe(LaunchTask):  # a launch task whose "kernel" is the lines below
        kernel_name, timeout = "probe", None

        def __init__(self, loses):
            self.loses = loses

        def device_bytes(self, block=None, argument_bytes=0):
            return 0

        def __call__(self, *args):
            if self.loses:
                time.sleep(1)
                os.environ["DASKGPU_TEST_CONTEXT"] = "lost"
                raise ContextLostError(700, "launching kernel 'wild' failed: "
                                            "CUDA_ERROR_ILLEGAL_ADDRESS")
            for _ in range(30):  # 3 s: as long as the first runs, and more
                if os.environ.get("DASKGPU_TEST_CONTEXT") == "lost":
                    time.sleep(0.5)  # its next CUDA call, after the first one's failure
                    raise ContextLostError(700, "cuMemAllocAsync failed: "
                                                "CUDA_ERROR_ILLEGAL_ADDRESS")
                time.sleep(0.1)
            return os.getpid()

    with dg.LocalGPUCluster(simulate=True, devices=1, threads_per_worker=2,
                            dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        (first_pid,) = client.run(os.getpid).values()
        bad = client.submit(Probe(True), pure=False)
        beside = client.submit(Probe(False), pure=False)
        time.sleep(0.2)
        queued = client.submit(Probe(False), pure=False)
        with pytest.raises(ContextLostError, match="launching kernel 'wild' failed"):
            bad.result(timeout=120)
        pids = [beside.result(timeout=120), queued.result(timeout=120)]
        assert first_pid not in pids  # both ran on the fresh process


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


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_a_map_submitted_right_after_one_that_loses_the_context_runs():
    import dask.array as da

    with dg.LocalGPUCluster(simulate=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        # Each chunk of the wild map loses a context of its own: two are enough.
        w = da.zeros(2 << 16, chunks=1 << 16, dtype=np.float32)
        x = da.zeros(1 << 20, chunks=1 << 16, dtype=np.float32)
        bad = client.compute(dg.map_kernel(wild_store, dg.Out(np.float32, like=w)))
        good = client.compute(dg.map_kernel(ones, dg.Out(np.float32, like=x)))
        with pytest.raises(dg.ContextLostError, match="wild_store"):
            bad.result(timeout=120)
        bad.release()
        assert (good.result(timeout=180) == 1).all()
