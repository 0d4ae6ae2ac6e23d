"""GPU time in distributed's fine performance metrics: what Dask users read on the
dashboard, in a Span, or from the scheduler: the total by activity, and each kernel's."""

import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, span
from kit.kernels import saxpy
from numba import cuda

import daskgpu as dg
from daskgpu._dask.workers.gpu_time import (
    KERNEL_UNIT,
    activity_label,
    digest_gpu_time,
    kernel_label,
)
from daskgpu._dask.workers.plugin import GPUWorkerPlugin
from daskgpu._runtime import metrics


def _gpu_seconds(metrics_by_key, unit="seconds") -> dict:
    """``{(task prefix, label): value}`` of daskgpu's labels among fine performance metrics:
    by activity in seconds, or by kernel in KERNEL_UNIT."""
    return {(k[1], k[2]): v for k, v in metrics_by_key.items()
            if k[0] == "execute" and k[3] == unit
            and (unit == KERNEL_UNIT or str(k[2]).startswith("daskgpu "))}


def _scheduler_gpu_seconds(client, label, timeout=20, unit="seconds"):
    """The scheduler's cumulative metrics of daskgpu, once ``label`` has arrived
    (workers send their metrics with their heartbeats)."""
    deadline = time.monotonic() + timeout
    while True:
        found = _gpu_seconds(client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.cumulative_worker_metrics)), unit)
        if any(k[1] == label for k in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_map_kernel_reports_kernel_time_by_name_to_the_scheduler(client):
    x = da.arange(256, chunks=64, dtype=np.float32)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
    np.testing.assert_array_equal(client.compute(z).result(), 3 * np.arange(256, dtype=np.float32))
    found = _scheduler_gpu_seconds(client, "saxpy kernel", unit=KERNEL_UNIT)
    kernel = {prefix: v for (prefix, label), v in found.items() if label == "saxpy kernel"}
    assert kernel and all(v > 0 for v in kernel.values()), found


@dg.jit("void(float32[::1], float32[::1])")
def square(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * x[i]


def test_two_kernels_one_fused_into_a_sum_give_totals_by_activity_and_time_by_kernel(client):
    # The activity view adds up over kernels; the kernel view names each, also where the
    # launch was fused into the reduction's task (whose function is then `sum`'s).
    x = da.arange(256, chunks=64, dtype=np.float32)
    a = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
    b = dg.map_kernel(square, dg.Out(np.float32, like=x), x).sum()
    got_a, got_b = client.compute([a, b], sync=True)
    ref = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(got_a, 3 * ref)
    assert got_b == (ref * ref).sum()
    by_kernel = _scheduler_gpu_seconds(client, "square kernel", unit=KERNEL_UNIT)
    totals = _scheduler_gpu_seconds(client, "daskgpu kernel")
    kernel_total = sum(v for (_, label), v in totals.items() if label == "daskgpu kernel")
    per_kernel = {name: sum(v for (_, label), v in by_kernel.items()
                            if label == f"{name} kernel") for name in ("saxpy", "square")}
    assert per_kernel["saxpy"] > 0 and per_kernel["square"] > 0, by_kernel
    # Both views count the same launches (this module's earlier tests ran saxpy too).
    assert kernel_total == pytest.approx(sum(v for (_, label), v in by_kernel.items()
                                             if label.endswith(" kernel")))
    # One label per activity, however many kernels ran.
    assert {label for _, label in totals} <= {activity_label(a) for a in metrics.ACTIVITIES}


def test_a_span_shows_the_gpu_share_of_its_tasks(client):
    x = np.arange(64, dtype=np.float32)
    with span("gpu share") as span_id:
        out = client.submit(saxpy.forall(64), np.zeros_like(x), 2.0, x, x, pure=False).result()
    np.testing.assert_array_equal(out, 3 * x)

    def span_metrics(dask_scheduler, span_id=span_id):
        return dict(dask_scheduler.extensions["spans"].spans[span_id].cumulative_worker_metrics)

    deadline = time.monotonic() + 20
    while not (found := _gpu_seconds(client.run_on_scheduler(span_metrics))):
        assert time.monotonic() < deadline, "no daskgpu metrics reached the span"
        time.sleep(0.2)
    assert found["saxpy", "daskgpu kernel"] > 0
    by_kernel = _gpu_seconds(client.run_on_scheduler(span_metrics), KERNEL_UNIT)
    assert by_kernel["saxpy", "saxpy kernel"] == found["saxpy", "daskgpu kernel"]


def _installed() -> int:
    return metrics._recorders.count(digest_gpu_time)  # one per worker set up in this process


@pytest.mark.slow
def test_the_worker_plugin_installs_its_recorder_and_teardown_removes_it():
    before = _installed()
    with dg.LocalGPUCluster(simulate=True, processes=False, devices=[0, 1],
                            dashboard_address=":0") as cluster:
        assert len(cluster.workers) == 2
        assert _installed() == before + 2
        assert metrics.hook.recorder is digest_gpu_time
    assert _installed() == before


def test_teardown_without_setup_removes_nothing():
    other = GPUWorkerPlugin()
    metrics.add_recorder(digest_gpu_time)
    try:
        other.teardown(worker=None)
        assert metrics.hook.recorder is digest_gpu_time
    finally:
        metrics.remove_recorder(digest_gpu_time)


def test_labels_name_the_activity_and_the_kernel():
    assert activity_label("copy-in") == "daskgpu copy-in"
    assert kernel_label("saxpy", "copy-in") == "saxpy copy-in"


@pytest.mark.slow
@pytest.mark.gpu
def test_a_gpu_worker_reports_copies_and_kernel_of_host_chunks():
    n = 1 << 16
    # On a GPU, whatever simulated cluster of this module is open in this process.
    with dask.config.set({"daskgpu.simulate": False}):
        x = da.arange(n, chunks=n // 4, dtype=np.float32)
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
        with dg.LocalGPUCluster(simulate=False, dashboard_address=":0") as cluster:
            with Client(cluster, set_as_default=False) as client:
                result = client.compute(z).result()
                found = _scheduler_gpu_seconds(client, "saxpy copy-out", unit=KERNEL_UNIT)
    np.testing.assert_array_equal(result, 3 * np.arange(n, dtype=np.float32))
    labels = {label for _, label in found}
    assert {"saxpy link", "saxpy copy-in", "saxpy kernel", "saxpy copy-out"} <= labels, found
    assert all(v >= 0 for v in found.values())
