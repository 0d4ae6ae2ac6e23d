"""Launches that will not end: a time limit fails the task in one line, and a cancelled
launch frees its worker; either way the worker's process is replaced and takes new work."""

import time

import dask
import numpy as np
import pytest
from distributed import Client
from kit.kernels import double
from numba import cuda

import daskgpu as dg
from daskgpu._dask.workers.launch_watch import (
    STARTUP,
    FailLaunch,
    LaunchWatch,
    ReplaceWorker,
    Seen,
    StopLaunch,
    decide,
    replacement,
)


@dg.jit("void(int64[::1])")
def spin(flag):
    # Runs until flag[0] is set, which nothing does: a kernel that will not end.
    i = cuda.grid(1)
    while flag[0] == 0:
        if i > 1 << 40:
            flag[0] = 1


def _addresses(client):
    return set(client.scheduler_info(n_workers=-1)["workers"])


def _next_task_after(client, before, timeout=120):
    """Seconds until a launch runs on a worker that is not among ``before``."""
    start = time.monotonic()
    while not _addresses(client) - before:
        assert time.monotonic() - start < timeout, "no fresh worker joined"
        time.sleep(0.1)
    x = np.arange(8, dtype=np.float32)
    out = client.submit(double.forall(8), np.zeros_like(x), x, pure=False).result(timeout)
    np.testing.assert_array_equal(out, 2 * x)
    return time.monotonic() - start


@pytest.fixture
def one_worker():
    with dg.LocalGPUCluster(simulate=True, devices=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        yield client


@pytest.mark.slow
def test_a_launch_over_its_time_limit_fails_in_one_line_and_the_worker_comes_back(one_worker):
    client = one_worker
    before = _addresses(client)
    started = time.monotonic()
    future = client.submit(spin.forall(1, timeout=1), np.zeros(1, np.int64), pure=False)
    with pytest.raises(dg.LaunchTimeoutError) as caught:
        future.result(timeout=60)
    failed_after = time.monotonic() - started
    (line,) = str(caught.value).splitlines()
    assert line.startswith("kernel 'spin' did not finish within its time limit of 1 s")
    assert 1 <= failed_after < 30
    assert _next_task_after(client, before) < 120


@pytest.mark.slow
def test_every_one_of_five_spinning_launches_on_one_worker_fails_over_its_limit(one_worker):
    # Each over its limit replaces the worker while the others wait on it: the scheduler
    # must not count those replacements against the waiting launches (KilledWorker after
    # distributed.scheduler.allowed-failures of them).
    futures = [one_worker.submit(spin.configure(1, 1, timeout=1), np.zeros(1, np.int64),
                                 pure=False) for _ in range(5)]
    for future in futures:
        with pytest.raises(dg.LaunchTimeoutError, match="time limit of 1 s"):
            future.result(timeout=180)


@pytest.mark.slow
def test_a_map_over_its_time_limit_names_the_chunks_of_its_launch(one_worker):
    import dask.array as da

    # Four chunks of 2 in one grouped launch: its limit is 0.5 s a chunk, 2 s in all.
    flags = da.zeros(8, chunks=2, dtype=np.int64)
    z = dg.map_kernel(spin, flags, timeout=0.5, group="1 KiB")
    assert z.numblocks == (1,)
    with pytest.raises(dg.LaunchTimeoutError,
                       match=r"kernel 'spin' on chunks \(0,\) to \(3,\) \(one grouped launch; "
                             r"map_kernel\(group=False\) launches each alone\) did not finish "
                             r"within its time limit of 2 s"):
        one_worker.compute(z).result(timeout=60)


@pytest.mark.slow
def test_the_setting_limits_launches_without_their_own():
    # The nannies hand the workers the settings in force when the cluster starts.
    with dask.config.set({"daskgpu.launch-timeout": 0.5}), \
            dg.LocalGPUCluster(simulate=True, devices=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        with pytest.raises(dg.LaunchTimeoutError, match="time limit of 0.5 s"):
            client.submit(spin.forall(1), np.zeros(1, np.int64), pure=False).result(timeout=60)


@pytest.mark.slow
def test_a_cancelled_launch_that_spins_frees_its_worker_after_the_grace(one_worker):
    client = one_worker
    before = _addresses(client)
    future = client.submit(spin.forall(1), np.zeros(1, np.int64), pure=False)
    time.sleep(1)
    assert future.status == "pending"  # running, and would be forever
    cancelled_at = time.monotonic()
    future.cancel()
    took = _next_task_after(client, before)
    assert took < 120
    assert time.monotonic() - cancelled_at >= 2  # the grace (daskgpu.cancel-grace) first


@pytest.mark.slow
def test_a_launch_cancelled_and_submitted_again_under_its_key_keeps_its_time_limit(one_worker):
    # As re-running a notebook cell after an interrupt does: the same key, cancelled while
    # its kernel runs, then submitted again. The worker resumes the running task, and its
    # time limit still holds.
    client = one_worker
    launch = spin.forall(1, timeout=3)
    future = client.submit(launch, np.zeros(1, np.int64), key="spin-cell")
    time.sleep(1)
    assert future.status == "pending"
    future.cancel()
    while future.status != "cancelled":
        time.sleep(0.05)
    del future
    while "spin-cell" in client.futures or client.run_on_scheduler(  # all let go of it
            lambda dask_scheduler: "spin-cell" in dask_scheduler.tasks):
        time.sleep(0.05)
    time.sleep(1)  # a person re-runs the cell a moment later: every message has landed
    again = client.submit(launch, np.zeros(1, np.int64), key="spin-cell")
    with pytest.raises(dg.LaunchTimeoutError, match="time limit of 3 s"):
        again.result(timeout=60)


@pytest.mark.slow
def test_launches_that_end_are_left_alone(one_worker):
    x = np.arange(64, dtype=np.float32)
    out = one_worker.submit(double.forall(64, timeout=30), np.zeros_like(x), x).result()
    np.testing.assert_array_equal(out, 2 * x)
    assert len(_addresses(one_worker)) == 1


def test_the_watch_keeps_time_and_the_grace():
    watch = LaunchWatch(default_limit=10.0, grace=2.0)
    watch.started("a", None, now=0.0)  # the default limit
    watch.started("b", 1.0, now=0.0)
    assert watch.overdue(now=5.0) == []  # neither launch has begun its own run
    watch.launched("a", 0.0)
    watch.launched("b", 3.0)
    assert watch.overdue(now=3.5) == [] and watch.overdue(now=5.0) == [("b", 1.0)]
    watch.cancelled("a", now=5.0)
    assert watch.overdue(now=11.0) == [("b", 1.0)]  # a cancelled task is not also failed
    assert watch.stuck(now=6.0) == [] and watch.stuck(now=7.5) == ["a"]
    watch.resumed("a")  # wanted again while it runs: no longer stuck, and timed again
    assert watch.stuck(now=7.5) == [] and watch.overdue(now=11.0) == [("a", 10.0), ("b", 1.0)]
    watch.ended("a")
    watch.ended("b")
    assert not watch and watch.stuck(now=100.0) == []


def _seen(states, threads=None, runs=None, cancelled=(), alone=False):
    return Seen(threads=threads or {}, runs=runs or {}, states=states,
                cancelled_running=frozenset(cancelled), alone=alone)


def test_a_launch_over_its_limit_is_failed_once_and_left_to_its_thread_where_a_nanny_is():
    watch = LaunchWatch(default_limit=None, grace=2.0)
    watch.started("k", 1.0, now=0.0, kernel="spin")
    seen = _seen({"k": "executing"}, threads={"k": 7}, runs={"k": 0.5})
    assert decide(watch, seen, now=1.4) == []
    assert decide(watch, seen, now=1.6) == [FailLaunch("k", 1.0, "spin", None)]
    assert decide(watch, seen, now=9.0) == [] and not watch  # failed once, then forgotten


def test_a_launch_over_its_limit_without_a_nanny_is_stopped_in_its_thread():
    watch = LaunchWatch(default_limit=None, grace=2.0)
    watch.started("k", 1.0, now=0.0, kernel="spin")
    seen = _seen({"k": "executing"}, threads={"k": 7}, runs={"k": 0.0}, alone=True)
    assert decide(watch, seen, now=1.5) == [FailLaunch("k", 1.0, "spin", 7)]


def test_a_task_that_left_its_thread_is_not_failed():
    watch = LaunchWatch(default_limit=None, grace=2.0)
    watch.started("k", 1.0, now=0.0)
    assert decide(watch, _seen({"k": "memory"}, runs={"k": 0.0}), now=5.0) == []
    assert not watch


def test_a_cancelled_launch_running_past_the_grace_is_stopped_or_its_worker_replaced():
    for alone, decided, left in [(True, [StopLaunch("c", 3)], ReplaceWorker(("c",), 2.0)),
                                 (False, [], ReplaceWorker(("c",), 2.0))]:
        watch = LaunchWatch(default_limit=None, grace=2.0)
        watch.started("c", None, now=0.0)
        watch.cancelled("c", now=1.0)
        seen = _seen({"c": "cancelled"}, threads={"c": 3}, cancelled=("c",), alone=alone)
        assert decide(watch, seen, now=2.0) == [] and replacement(watch, now=2.0) is None
        assert decide(watch, seen, now=3.5) == decided
        # Until the guard has stopped it (and stops watching it), it is still running.
        assert replacement(watch, now=3.5) == left


def test_a_cancelled_launch_that_returned_or_is_wanted_again_is_not_replaced():
    watch = LaunchWatch(default_limit=10.0, grace=2.0)
    for key in ("returned", "again"):
        watch.started(key, None, now=0.0)
        watch.cancelled(key, now=0.0)
    seen = _seen({"returned": "released", "again": "executing"}, cancelled=())
    assert decide(watch, seen, now=3.0) == [] and replacement(watch, now=3.0) is None
    assert watch.keys() == ["again"]  # wanted again: still timed, under its limit
    assert decide(watch, _seen({"again": "executing"}, runs={"again": 0.0}), now=11.0) == [
        FailLaunch("again", 10.0, None, None)]


def test_a_launch_that_never_begins_its_run_is_timed_after_the_startup_allowance():
    watch = LaunchWatch(default_limit=None, grace=2.0)
    watch.started("k", 1.0, now=0.0)
    watch.launched("k", -5.0)  # another task's launch on the same thread: not this one's
    assert watch.overdue(now=STARTUP) == [] and watch.overdue(now=STARTUP + 1.5) == [("k", 1.0)]


@dg.jit("void(float32[::1], int64)")
def busy(out, iters):
    # One simulated thread computing for a while: a launch that holds the simulator.
    i = cuda.grid(1)
    if i == 0:
        v = np.float32(0)
        for _ in range(iters):
            v = v * np.float32(0.5) + np.float32(1)
        out[0] = v


@pytest.mark.slow
def test_a_time_limit_counts_the_launch_s_own_run_not_its_wait_to_start():
    # Two threads share one simulated worker; the simulator runs one launch at a time, so
    # the second launch waits for the first's seconds before its own run, which is quick:
    # its limit of 1 s counts that run, as it would on a cold worker's link.
    with dg.LocalGPUCluster(simulate=True, devices=1, threads_per_worker=2,
                            dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        long = client.submit(busy.forall(1), np.zeros(1, np.float32), 3_000_000, pure=False)
        while not client.processing() or not any(client.processing().values()):
            time.sleep(0.05)
        time.sleep(0.5)  # the long launch runs, holding the simulator
        x = np.arange(8, dtype=np.float32)
        quick = client.submit(double.forall(8, timeout=1), np.zeros_like(x), x, pure=False)
        np.testing.assert_array_equal(quick.result(timeout=120), 2 * x)
        assert long.result(timeout=120)[0] > 1
        assert long.status == "finished"


@pytest.mark.slow
def test_a_launch_over_its_limit_on_a_worker_without_a_nanny_is_stopped_and_wedges_nothing():
    # Threaded workers share one process, and the simulator's launch lock: the stopped
    # launch must release it, for the other worker's maps and the client's own launches.
    import threading

    import dask.array as da

    with dg.LocalGPUCluster(simulate=True, processes=False, devices=[0, 1],
                            dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        first, second = sorted(_addresses(client))
        with pytest.raises(dg.LaunchTimeoutError, match="time limit of 1 s.*the simulated "
                                                        "launch was stopped"):
            # One simulated thread (see the test below for why).
            client.submit(spin.configure(1, 1, timeout=1), np.zeros(1, np.int64),
                          workers=[first], pure=False).result(timeout=60)
        x = da.arange(64, chunks=16, dtype=np.float32)
        z = dg.map_kernel(double, dg.Out(np.float32, like=x), x)
        np.testing.assert_array_equal(client.compute(z, workers=[second]).result(timeout=60),
                                      2 * np.arange(64, dtype=np.float32))
        # The client's own launch, in a thread, so that a wedged simulator fails the test.
        out = np.zeros(8, np.float32)
        local = threading.Thread(target=double[1, 8], args=(out, np.ones(8, np.float32)),
                                 daemon=True)
        local.start()
        local.join(60)
        assert not local.is_alive() and (out == 2).all()
        # The worker is not wedged either: it takes launches again.
        again = client.submit(double.forall(8), np.zeros(8, np.float32),
                              np.ones(8, np.float32), workers=[first], pure=False)
        assert (again.result(timeout=60) == 2).all()
        assert _addresses(client) == {first, second}


@pytest.mark.slow
def test_a_cancelled_spinning_launch_on_a_worker_without_a_nanny_is_stopped_after_the_grace():
    import threading

    with dg.LocalGPUCluster(simulate=True, processes=False, devices=[0],
                            dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        before = _addresses(client)
        # One simulated thread: 64 spinning ones (a forall block) share the GIL with the
        # event loop of every worker in the process, and slow it down for minutes.
        future = client.submit(spin[1, 1], np.zeros(1, np.int64), pure=False)
        time.sleep(1)
        future.cancel()
        out = np.zeros(8, np.float32)  # the client's own launch waits for the simulator
        local = threading.Thread(target=double[1, 8], args=(out, np.ones(8, np.float32)),
                                 daemon=True)
        local.start()
        local.join(60)
        assert not local.is_alive() and (out == 2).all()
        x = np.arange(8, dtype=np.float32)
        again = client.submit(double.forall(8), np.zeros_like(x), x, pure=False)
        np.testing.assert_array_equal(again.result(timeout=60), 2 * x)
        assert _addresses(client) == before  # the same worker, not wedged


def test_a_time_limit_is_a_positive_number():
    with pytest.raises(dg.LaunchConfigError, match="timeout=0"):
        double.configure(1, 8, timeout=0)
    with dask.config.set({"daskgpu.launch-timeout": "2 minutes"}):
        assert dg._config.check()["launch-timeout"] == 120.0


@dg.jit("void(int32[::1], int32)")
def sleep_ms(flag, ms):
    # Spins on the device for ms milliseconds: a kernel that holds the GPU.
    for _ in range(ms):
        cuda.nanosleep(1000000)
    flag[0] = 1


@pytest.fixture
def one_gpu_worker():
    with dask.config.set({"daskgpu.simulate": False}), \
            dg.LocalGPUCluster(simulate=False, devices=[0], dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1, timeout=120)
        yield client


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_a_cancelled_60_s_kernel_frees_the_gpu_within_5_s(one_gpu_worker):
    client = one_gpu_worker
    before = _addresses(client)
    future = client.submit(sleep_ms.forall(1), np.zeros(1, np.int32), np.int32(60_000),
                           pure=False)
    time.sleep(1)
    assert future.status == "pending"
    cancelled_at = time.monotonic()
    future.cancel()
    took = _next_task_after(client, before)
    print(f"cancelled 60 s kernel: next launch done {took:.2f} s after the cancel "
          f"(grace {dg._config.get('cancel-grace')} s)")
    assert time.monotonic() - cancelled_at < 5 + dg._config.get("cancel-grace")
    info = client.run(dg.device_info)
    assert [i["simulated"] for i in info.values()] == [False]  # back, on its GPU


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_a_60_s_kernel_over_its_limit_fails_and_the_gpu_is_free_within_5_s(
        one_gpu_worker):
    client = one_gpu_worker
    before = _addresses(client)
    started = time.monotonic()
    future = client.submit(sleep_ms.forall(1, timeout=1), np.zeros(1, np.int32),
                           np.int32(60_000), pure=False)
    with pytest.raises(dg.LaunchTimeoutError, match="kernel 'sleep_ms' did not finish"):
        future.result(timeout=60)
    failed = time.monotonic() - started
    took = _next_task_after(client, before)
    print(f"60 s kernel, 1 s limit: failed after {failed:.2f} s; next launch done "
          f"{took:.2f} s after that")
    assert failed < 3 and took < 5


@pytest.mark.slow
def test_a_spinning_launch_ends_within_its_limit_and_the_grace_when_the_scheduler_dies(tmp_path):
    # The worker closes when it loses its scheduler; its launch watch must outlast the close,
    # or the closing process waits for the kernel (distributed's close timeout, 30 s).
    _kill_the_scheduler_under_a_launch(tmp_path, spin.configure(1, 1, timeout=3),
                                       (np.zeros(1, np.int64),), simulate=True)


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_a_60_s_kernel_frees_the_gpu_within_its_limit_when_the_scheduler_dies(
        tmp_path):
    _kill_the_scheduler_under_a_launch(tmp_path, sleep_ms.forall(1, timeout=3),
                                       (np.zeros(1, np.int32), np.int32(60_000)),
                                       simulate=False)


def _kill_the_scheduler_under_a_launch(tmp_path, launch, args, simulate):
    """Start a scheduler and one worker (under its nanny), run ``launch`` (limit 3 s) on
    ``args``, kill the scheduler: the worker's process must end within the limit and
    the grace (2 s), and some slack, which frees the GPU."""
    import os
    import subprocess
    import sys

    import psutil

    scheduler_file = tmp_path / "scheduler.json"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    log = open(tmp_path / "cluster.log", "wb")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
         str(scheduler_file), "--port", "0", "--dashboard-address", ":0", "--no-show"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    worker = None
    try:
        start = time.monotonic()
        while not scheduler_file.exists():
            assert time.monotonic() - start < 60, "the scheduler did not start"
            time.sleep(0.2)
        worker = subprocess.Popen(
            [sys.executable, "-m", "daskgpu", "worker", "--scheduler-file", str(scheduler_file),
             "--devices", "0", "--nthreads", "1"],
            env=dict(env, DASK_DASKGPU__SIMULATE="1" if simulate else "0"), stdout=log,
            stderr=subprocess.STDOUT)
        client = Client(scheduler_file=str(scheduler_file), timeout="60s")
        client.wait_for_workers(1, timeout=120)
        (pid,) = client.run(os.getpid).values()  # the worker's process, under its nanny
        with dask.config.set({"daskgpu.simulate": simulate}):
            future = client.submit(launch, *args, pure=False)
        while not any(client.processing().values()):
            time.sleep(0.05)
        time.sleep(0.5)  # it runs
        scheduler.kill()
        killed = time.monotonic()
        process = psutil.Process(pid)

        def running():
            try:
                return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        while running():
            assert time.monotonic() - killed < 15, \
                "the launch outlived its limit (3 s) and the grace (2 s)"
            time.sleep(0.1)
        del future
        client.close(timeout=1)
    finally:
        for p in (worker, scheduler):
            if p is not None:
                p.kill()
                p.wait(timeout=30)
        log.close()
