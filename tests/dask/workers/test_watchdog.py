"""Launches that will not end: a time limit fails the task in one line, and a cancelled
launch frees its worker; either way the worker's process is replaced and takes new work."""

import time

import dask
import numpy as np
import pytest
from distributed import Client
from numba import cuda

import daskgpu as dg
from daskgpu._dask.workers.watchdog import LaunchWatch

dg._config.register()  # before dask.config.set, so the defaults outlive its blocks


@dg.jit("void(int64[::1])")
def spin(flag):
    # Runs until flag[0] is set, which nothing does: a kernel that will not end.
    i = cuda.grid(1)
    while flag[0] == 0:
        if i > 1 << 40:
            flag[0] = 1


@dg.jit("void(float32[::1], float32[::1])")
def double(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i]


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
def test_a_map_over_its_time_limit_names_the_chunk(one_worker):
    import dask.array as da

    flags = da.zeros(4, chunks=2, dtype=np.int64)
    z = dg.map_kernel(spin, flags, timeout=1)
    with pytest.raises(dg.LaunchTimeoutError, match=r"kernel 'spin' on chunk \(\d,\) did not "
                                                    r"finish within its time limit of 1 s"):
        one_worker.compute(z).result(timeout=60)


@pytest.mark.slow
def test_the_setting_limits_launches_without_their_own(one_worker):
    client = one_worker

    def set_limit(dask_worker):
        plugin = dask_worker.plugins["daskgpu-gpu"]
        plugin._watch.default_limit = 0.5  # as daskgpu.launch-timeout=0.5 would at setup

    client.run(set_limit)
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
def test_launches_that_end_are_left_alone(one_worker):
    x = np.arange(64, dtype=np.float32)
    out = one_worker.submit(double.forall(64, timeout=30), np.zeros_like(x), x).result()
    np.testing.assert_array_equal(out, 2 * x)
    assert len(_addresses(one_worker)) == 1


def test_the_watch_keeps_time_and_the_grace():
    watch = LaunchWatch(default_limit=10.0, grace=2.0)
    watch.started("a", None, now=0.0)  # the default limit
    watch.started("b", 1.0, now=0.0)
    assert watch.overdue(now=5.0) == [("b", 1.0)]
    watch.cancelled("a", now=5.0)
    assert watch.overdue(now=11.0) == [("b", 1.0)]  # a cancelled task is not also failed
    assert watch.stuck(now=6.0) == [] and watch.stuck(now=7.5) == ["a"]
    watch.ended("a")
    watch.ended("b")
    assert not watch and watch.stuck(now=100.0) == []


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
