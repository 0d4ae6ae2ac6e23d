"""GPUWorkerPlugin and device_info, on daskgpu's cluster and on a plain distributed one."""

import pickle
import types

import dask
import pytest
from distributed import Client, LocalCluster

import daskgpu as dg
from daskgpu._dask.workers.plugin import GPUWorkerPlugin
from daskgpu._errors import ContextLostError

FACTS = {"simulated", "device_id", "name", "cc", "total_memory", "uuid", "pci_bus_id",
         "driver_version", "nvjitlink_version", "cuda_visible_devices"}


def test_name_is_stable():
    assert GPUWorkerPlugin.name == "daskgpu-gpu"
    plugin = pickle.loads(pickle.dumps(dg.GPUWorkerPlugin()))
    assert plugin.name == "daskgpu-gpu"
    assert plugin.idempotent is True
    assert plugin.info is None


def test_device_info_outside_a_worker_when_simulating(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    with dask.config.set({"daskgpu.simulate": True}):
        facts = dg.device_info()
    assert set(facts) == FACTS
    assert facts["simulated"] is True and facts["device_id"] == 0
    assert facts["cuda_visible_devices"] == "3,1"
    assert facts["cc"] is None and facts["total_memory"] is None


def test_setup_records_facts_on_the_plugin():
    plugin = GPUWorkerPlugin()
    with dask.config.set({"daskgpu.simulate": True}):
        plugin.setup(worker=None)
    assert plugin.info["simulated"] is True

    class FakeWorker:
        plugins = {"daskgpu-gpu": plugin}

    facts = dg.device_info(FakeWorker())
    assert facts == plugin.info
    facts["name"] = "changed"  # a copy: the recorded facts stay as they are
    assert plugin.info["name"] == "Numba CUDA simulator"


class _Task:
    """What the plugin reads of a worker's failed task, kept as distributed keeps it:
    pickled, or as ``Exception(repr(exc))`` when it does not unpickle."""

    def __init__(self, exc):
        from distributed.protocol import pickle as dpickle
        from distributed.protocol.serialize import Serialize

        try:
            blob = dpickle.dumps(exc)
            dpickle.loads(blob)
        except Exception:
            blob = dpickle.dumps(Exception(repr(exc)))
        self.exception = Serialize(blob)
        self.exception_text = repr(exc)


class _Loop:
    def __init__(self):
        self.later = []

    def call_later(self, delay, fn, *args):
        self.later.append((delay, fn, args))


def _set_up_on(tasks):
    worker = types.SimpleNamespace(state=types.SimpleNamespace(tasks=tasks), loop=_Loop(),
                                   address="tcp://127.0.0.1:1")
    plugin = GPUWorkerPlugin()
    with dask.config.set({"daskgpu.simulate": True}):
        plugin.setup(worker)
    return plugin, worker


def _lost(picklable=False):
    message = "launching kernel 'k' failed: CUDA_ERROR_ILLEGAL_ADDRESS."
    return (_PicklableLost if picklable else ContextLostError)(700, message)


class _PicklableLost(ContextLostError):
    """A ContextLostError that unpickles (with its code and message)."""

    def __reduce__(self):
        return type(self), (self.code, str(self))


@pytest.mark.parametrize("picklable", [True, False], ids=["pickled", "as-text"])
def test_a_task_failing_with_a_lost_context_closes_the_worker_once(picklable):
    from daskgpu._dask.workers.plugin import GRACE as _GRACE
    from daskgpu._dask.workers.plugin import close_worker as _close

    plugin, worker = _set_up_on({"a": _Task(_lost(picklable)), "b": _Task(_lost(picklable))})
    plugin.transition("a", "executing", "memory")  # not an error: nothing
    assert worker.loop.later == []
    plugin.transition("a", "executing", "error")
    assert worker.loop.later == [(_GRACE, _close, (worker, False, "a"))]  # no kernel left running
    assert _GRACE > 0  # the task's error reaches the scheduler first
    plugin.transition("b", "executing", "error")  # closing already: once
    assert len(worker.loop.later) == 1


def test_a_lost_context_raised_from_counts_and_other_errors_do_not():
    from daskgpu._dask.workers.plugin import lost_context

    try:
        try:
            raise _lost(picklable=True)
        except Exception as exc:
            raise RuntimeError("the task wrapped it") from exc
    except RuntimeError as wrapped:
        chained = wrapped
    assert lost_context(_Task(chained))
    for other in (ValueError("no"), dg.DeviceError("a CUDA error, not sticky"),
                  RuntimeError("ContextLostError is only named here")):
        assert not lost_context(_Task(other))
    plugin, worker = _set_up_on({"c": _Task(ValueError("no"))})
    plugin.transition("c", "executing", "error")
    plugin.transition("gone", "executing", "error")  # a key the worker no longer has
    assert worker.loop.later == []


class _Unpicklable:
    def __reduce__(self):
        raise AssertionError("the worker was pickled with the plugin")


def test_the_worker_is_not_pickled_with_the_plugin():
    plugin, worker = _set_up_on({})
    worker.unpicklable = _Unpicklable()
    back = pickle.loads(pickle.dumps(plugin))
    assert back.info == plugin.info and repr(back) == "GPUWorkerPlugin()"


@pytest.mark.nogpu
def test_no_gpu_and_not_simulating_fails_with_the_fix():
    with dask.config.set({"daskgpu.simulate": False}):
        with pytest.raises(dg.DeviceError, match="no usable CUDA GPU.*daskgpu.simulate=True"):
            GPUWorkerPlugin().setup(worker=None)
        with pytest.raises(dg.DeviceError, match="Install the NVIDIA driver"):
            dg.device_info()


@pytest.mark.slow
def test_device_info_on_a_simulated_local_gpu_cluster():
    with dg.LocalGPUCluster(simulate=True, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            info = client.run(dg.device_info)
            assert len(info) == 2
            assert all(set(f) == FACTS and f["simulated"] for f in info.values())
            in_task = client.submit(dg.device_info, pure=False).result()
            assert in_task["simulated"] is True


@pytest.fixture
def plain_client():
    # In-process workers share this process's dask.config (daskgpu.simulate).
    with LocalCluster(n_workers=2, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            yield client


@pytest.mark.slow
def test_register_on_a_plain_local_cluster(plain_client):
    with dask.config.set({"daskgpu.simulate": True}):
        plain_client.register_plugin(dg.GPUWorkerPlugin())
        names = plain_client.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert all("daskgpu-gpu" in n for n in names.values())
        info = plain_client.run(dg.device_info)
        assert len(info) == 2 and all(f["simulated"] for f in info.values())
        # Registering it again is a no-op: the plugin is idempotent.
        plain_client.register_plugin(dg.GPUWorkerPlugin())


@pytest.mark.slow
@pytest.mark.nogpu
def test_register_without_gpu_raises_on_the_client(plain_client):
    with dask.config.set({"daskgpu.simulate": False}):
        with pytest.raises(dg.DeviceError, match="no usable CUDA GPU"):
            plain_client.register_plugin(dg.GPUWorkerPlugin())


@pytest.mark.slow
@pytest.mark.gpu
def test_register_on_a_gpu_worker_process():
    with LocalCluster(n_workers=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        client.register_plugin(dg.GPUWorkerPlugin())
        [facts] = client.run(dg.device_info).values()
        assert facts["simulated"] is False
        assert facts["name"] and facts["total_memory"] > 0
        assert len(facts["cc"]) == 2 and len(facts["driver_version"]) == 2
        [modules] = client.run(eval, "sorted(__import__('sys').modules)").values()
        assert "daskgpu._runtime.gpu.run" in modules  # imported ahead of the first task
        assert "daskgpu._runtime.gpu.fast_path" in modules
        assert "numba" not in modules


@pytest.mark.gpu
def test_device_info_outside_a_worker_on_a_gpu():
    facts = dg.device_info()
    assert facts["simulated"] is False and facts["device_id"] == 0
    assert facts["total_memory"] > 0
