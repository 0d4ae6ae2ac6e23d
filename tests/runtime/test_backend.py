"""The backend is the one seam to a device: both backends implement the whole interface,
and the GPU backend finds devices the way CUDA_VISIBLE_DEVICES names them."""

import inspect

import dask
import pytest
from cuda.bindings import driver

from daskgpu._runtime import backends
from daskgpu._runtime.backends.base import Backend, Devices

UUID_A = "GPU-8f1c2d3e-0000-1111-2222-333344445555"
UUID_B = "GPU-9a7b6c5d-0000-1111-2222-333344445555"


def test_every_backend_implements_the_whole_interface():
    abstract = Backend.__abstractmethods__
    assert {"run", "repeat_launch", "random_states", "device_chain", "device_facts",
            "devices"} <= abstract
    for backend in (backends.GPU, backends.SIMULATOR):
        assert isinstance(backend, Backend)
        assert not inspect.isabstract(type(backend)), type(backend)
        assert isinstance(backend.name, str) and isinstance(backend.description, str)
    assert backends.GPU.simulated is False and backends.SIMULATOR.simulated is True


def test_a_backend_missing_a_method_cannot_be_made():
    class Half(Backend):
        name, simulated, description = "half", True, "half a backend"

        def run(self, image, config, args, infos, function=None):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_current_follows_the_setting():
    with dask.config.set({"daskgpu.simulate": True}):
        assert backends.current() is backends.SIMULATOR
    with dask.config.set({"daskgpu.simulate": "false"}):
        assert backends.current() is backends.GPU


def test_simulated_facts_name_the_simulator_and_nothing_a_gpu_would_tell(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    facts = backends.SIMULATOR.device_facts(warm=True)
    assert facts["simulated"] is True and facts["name"] == "Numba CUDA simulator"
    assert facts["cuda_visible_devices"] == "3"
    assert all(facts[k] is None for k in ("cc", "total_memory", "uuid", "driver_version"))
    assert backends.SIMULATOR.devices() == Devices((), "simulated workers have no device")


def fake_gpus(monkeypatch, count):
    ok = driver.CUresult.CUDA_SUCCESS
    monkeypatch.setattr(driver, "cuInit", lambda flags: (ok,))
    monkeypatch.setattr(driver, "cuDeviceGetCount", lambda: (ok, count))


def test_gpu_devices_count_and_follow_cuda_visible_devices(monkeypatch):
    fake_gpus(monkeypatch, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert backends.GPU.devices() == Devices((0, 1))
    # CUDA stops at the first entry it cannot use: the first `count` entries are it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUID_B}, {UUID_A},7")
    assert backends.GPU.devices() == Devices((UUID_B, UUID_A))
    fake_gpus(monkeypatch, 0)
    assert backends.GPU.devices() == Devices((), "the CUDA driver reports no device")


@pytest.mark.nogpu
def test_gpu_facts_without_a_gpu_name_the_setting():
    from daskgpu._errors import DeviceError

    with pytest.raises(DeviceError, match="no usable CUDA GPU.*daskgpu.simulate=True"):
        backends.GPU.device_facts()
    machine = backends.GPU.machine()
    assert machine["devices"] == [] and machine["version"] is None and machine["error"]


@pytest.mark.gpu
def test_gpu_facts_and_machine_agree():
    facts = backends.GPU.device_facts(warm=True)
    machine = backends.GPU.machine()
    assert facts["simulated"] is False and facts["total_memory"] > 0
    assert facts["uuid"] in {d["uuid"] for d in machine["devices"]}
    assert len(backends.GPU.devices().names) == len(machine["devices"])
    assert tuple(machine["version"]) == facts["driver_version"]
