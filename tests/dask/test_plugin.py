"""GPUWorkerPlugin and device_info, on daskgpu's cluster and on a plain distributed one."""

import pickle

import dask
import pytest
from distributed import Client, LocalCluster

import daskgpu as dg
from daskgpu._dask.plugin import GPUWorkerPlugin

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


@pytest.mark.nogpu
def test_no_gpu_and_not_simulating_fails_with_the_fix():
    with dask.config.set({"daskgpu.simulate": False}):
        with pytest.raises(dg.DeviceError, match="no usable CUDA GPU.*daskgpu.simulate=True"):
            GPUWorkerPlugin().setup(worker=None)
        with pytest.raises(dg.DeviceError, match="Install the NVIDIA driver"):
            dg.device_info()


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


def test_register_on_a_plain_local_cluster(plain_client):
    with dask.config.set({"daskgpu.simulate": True}):
        plain_client.register_plugin(dg.GPUWorkerPlugin())
        names = plain_client.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert all("daskgpu-gpu" in n for n in names.values())
        info = plain_client.run(dg.device_info)
        assert len(info) == 2 and all(f["simulated"] for f in info.values())
        # Registering it again is a no-op: the plugin is idempotent.
        plain_client.register_plugin(dg.GPUWorkerPlugin())


@pytest.mark.nogpu
def test_register_without_gpu_raises_on_the_client(plain_client):
    with dask.config.set({"daskgpu.simulate": False}):
        with pytest.raises(dg.DeviceError, match="no usable CUDA GPU"):
            plain_client.register_plugin(dg.GPUWorkerPlugin())


@pytest.mark.gpu
def test_register_on_a_gpu_worker_process():
    with LocalCluster(n_workers=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        client.register_plugin(dg.GPUWorkerPlugin())
        [facts] = client.run(dg.device_info).values()
        assert facts["simulated"] is False
        assert facts["name"] and facts["total_memory"] > 0
        assert len(facts["cc"]) == 2 and len(facts["driver_version"]) == 2
        [modules] = client.run(eval, "sorted(__import__('sys').modules)").values()
        assert "daskgpu._runtime.launcher" in modules  # imported ahead of the first task
        assert "numba" not in modules


@pytest.mark.gpu
def test_device_info_outside_a_worker_on_a_gpu():
    facts = dg.device_info()
    assert facts["simulated"] is False and facts["device_id"] == 0
    assert facts["total_memory"] > 0
