"""The runtime's meter: launches report their time by activity to whoever installed a
recorder, and nothing while nobody looks; NVTX ranges only while a profiler reads them."""

import pickle

import dask
import numpy as np
import pytest
from kit.kernels import saxpy
from kit.meter import Seen

import daskgpu as dg
from daskgpu._runtime import metrics

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


def _simulated_saxpy(launch=None):
    x = np.arange(64, dtype=np.float32)
    with dask.config.set({"daskgpu.simulate": True}):
        launch = launch or saxpy.forall(64)
        out = launch(np.zeros_like(x), 2.0, x, x)
    np.testing.assert_array_equal(out, 3 * x)


def test_a_simulated_launch_reports_its_kernel_time(seen):
    _simulated_saxpy()
    assert [(k, a) for k, a, _ in seen] == [("saxpy", "kernel")]
    assert seen[0][2] > 0


def test_a_shipped_simulated_launch_reports_under_the_kernel_name(seen):
    with dask.config.set({"daskgpu.simulate": True}):
        shipped = pickle.loads(pickle.dumps(saxpy.forall(64)))  # a PTXKernel, as on a worker
    _simulated_saxpy(shipped)
    assert [(k, a) for k, a, _ in seen] == [("saxpy", "kernel")]


@pytest.fixture
def nobody(monkeypatch):
    """No recorder installed, whatever other tests of this process left behind."""
    monkeypatch.setattr(metrics, "_recorders", [])
    monkeypatch.setattr(metrics, "hook", None)


def test_nothing_is_recorded_while_nobody_looks(nobody):
    recorder = Seen()
    metrics.add_recorder(recorder)
    metrics.remove_recorder(recorder)
    assert metrics.hook is None  # the one test per launch finds nobody
    _simulated_saxpy()
    assert recorder == []


def test_a_recorder_installed_twice_stays_until_removed_twice(nobody):
    recorder = Seen()
    metrics.add_recorder(recorder)
    metrics.add_recorder(recorder)
    metrics.remove_recorder(recorder)
    _simulated_saxpy()
    assert len(recorder) == 1
    metrics.remove_recorder(recorder)
    _simulated_saxpy()
    assert len(recorder) == 1
    metrics.remove_recorder(recorder)  # no longer installed: nothing happens
    assert metrics.hook is None


def test_a_recorder_must_be_callable():
    with pytest.raises(TypeError, match=r"recorder\(kernel, activity, seconds\)"):
        metrics.add_recorder("not a function")


def test_record_names_the_kernel_not_its_module(seen):
    metrics.record("package.module.saxpy", "link", 0.5)
    assert seen == [("saxpy", "link", 0.5)]


class Domain:
    """An NVTX domain that keeps the calls made to it, in order."""

    def __init__(self):
        self.calls = []

    def get_event_attributes(self, message):
        return message

    def push_range(self, attributes):
        self.calls.append(("push", attributes))

    def pop_range(self):
        self.calls.append(("pop",))

    def start_range(self, attributes):
        self.calls.append(("start", attributes))
        return len(self.calls)

    def end_range(self, range_id):
        self.calls.append(("end", range_id))


def test_a_launch_is_an_nvtx_range_named_after_its_kernel(monkeypatch):
    domain = Domain()
    monkeypatch.setattr(metrics, "hook", metrics.Meter(None, domain))
    _simulated_saxpy()
    assert domain.calls == [("push", "saxpy"), ("pop",)]


def test_a_range_over_threads_opens_and_closes(monkeypatch):
    domain = Domain()
    monkeypatch.setattr(metrics, "hook", metrics.Meter(None, domain))
    range_id = metrics.start_range("saxpy-chunk")
    metrics.end_range(range_id)
    assert domain.calls == [("start", "saxpy-chunk"), ("end", 1)]


def test_no_range_and_no_nvtx_import_without_a_profiler(monkeypatch, nobody):
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    assert metrics._nvtx_domain() is None
    assert metrics.start_range("x") is None  # nobody looks: no range


def test_nvtx_without_a_loadable_tool_gives_no_domain(monkeypatch):
    pytest.importorskip("nvtx")
    # NVTX loads the tool named here on first use; none loads, so every range is a no-op.
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/nonexistent/libinjection.so")
    assert metrics._nvtx_domain() is None


def test_a_launch_on_device_arrays_reports_through_the_recorders_sink():
    class Sinks(Seen):
        def sink(self, kernel, activity):
            return lambda seconds: self.append((kernel, activity, seconds, "sink"))

    for recorder in (Seen(), Sinks()):
        meter = metrics.Meter(recorder)
        start = metrics.clock()
        meter.launched("tests.saxpy", start)
        meter.launched("tests.saxpy", start)  # the second through the kept sink
        assert [r[:2] for r in recorder] == [("saxpy", "launch")] * 2
        assert all(r[2] >= 0 for r in recorder)
        assert all(r[3:] == ("sink",) for r in recorder) == isinstance(recorder, Sinks)


def test_a_meter_without_a_recorder_reports_no_launch():
    meter = metrics.Meter(None)
    meter.launched("tests.saxpy", metrics.clock())  # NVTX only: nothing to call
    assert meter._launch_sinks == {"tests.saxpy": metrics._ignore}
