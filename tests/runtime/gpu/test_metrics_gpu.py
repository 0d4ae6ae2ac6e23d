"""Real launches report link, copies, kernel and launch time to the runtime's meter."""

import time

import numpy as np
import pytest
from kit.meter import Seen
from numba import cuda

import daskgpu as dg
from daskgpu import _config
from daskgpu._runtime import metrics

pytestmark = pytest.mark.gpu


def _spin_kernel(salt: float):
    """A kernel that runs long enough to measure; ``salt`` makes its image (and its
    link) new for each test."""

    def spin(out, n):
        i = cuda.grid(1)
        if i < out.size:
            acc = out[i]
            for _ in range(n):
                acc = acc * 0.999999 + salt
            out[i] = acc

    return dg.jit("void(float32[::1], int64)")(spin)


def _timed(seen, launch, *args):
    """``launch(*args)``: its activities summed, and its wall time."""
    seen.clear()
    t0 = time.perf_counter()
    launch(*args)
    return seen.by_activity("spin"), time.perf_counter() - t0


def test_a_launch_on_host_arrays_reports_link_copies_and_kernel(seen):
    spin = _spin_kernel(1.25e-6)
    out = np.ones(4096, np.float32)
    launch = spin.forall(out.size)
    first, wall = _timed(seen, launch, out, 200_000)
    assert [a for _, a, _ in seen] == ["link", "copy-in", "kernel", "copy-out"]
    assert first["link"] > 0 and first["kernel"] > 0
    assert all(v >= 0 for v in first.values())
    # Never overlapping: together at most the call's wall time.
    assert sum(first.values()) <= wall

    again, wall = _timed(seen, launch, out, 200_000)
    assert [a for _, a, _ in seen] == ["copy-in", "kernel", "copy-out"]  # linked once
    # The kernel spins far longer than 16 KiB take across PCIe, and is most of the call.
    assert again["kernel"] > again["copy-in"] + again["copy-out"]
    assert again["kernel"] > 0.5 * wall and sum(again.values()) <= wall


def test_large_pageable_arrays_report_their_copies_through_the_pipeline(seen):
    @dg.jit("void(float32[::1], float32[::1])")
    def twice(out, x):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = 2 * x[i]

    n = 2 * int(_config.get("pipeline-min-bytes")) // 4  # above the pipeline's threshold
    x = np.ones(n, np.float32)
    out = np.empty_like(x)
    twice.forall(n)(out, x)  # linked, pinned pools made
    seen.clear()
    t0 = time.perf_counter()
    twice.forall(n)(out, x)
    wall = time.perf_counter() - t0
    assert (out == 2).all()
    times = seen.by_activity("twice")
    assert set(times) == {"copy-in", "kernel", "copy-out"}
    # 2 x 32 MiB each way: the copies take most of the call.
    assert times["copy-in"] > times["kernel"] and times["copy-out"] > times["kernel"]
    assert 0.5 * wall < sum(times.values()) <= wall


def test_device_arrays_report_the_host_launch_only(seen):
    spin = _spin_kernel(5e-6)
    out = cuda.to_device(np.ones(256, np.float32))
    launch = spin.forall(256)
    launch(out, 10)  # the general path: links, then launches
    first = [a for _, a, _ in seen]
    seen.clear()
    launch(out, 10)  # the fast path
    cuda.synchronize()
    assert first == ["link", "launch"]
    assert [a for _, a, _ in seen] == ["launch"]
    assert 0 < seen[0][2] < 0.01


def test_with_nobody_looking_nothing_is_timed():
    spin = _spin_kernel(1e-5)
    recorder = Seen()
    metrics.add_recorder(recorder)
    metrics.remove_recorder(recorder)
    out = np.ones(256, np.float32)
    spin.forall(256)(out, 10)
    assert recorder == []
