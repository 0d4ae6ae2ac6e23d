"""One definition of a GPU worker: LocalGPUCluster and ``daskgpu worker`` build theirs alike."""

import os
import pathlib
import subprocess
import sys

import dask
import pytest
from distributed import Client

import daskgpu as dg
from daskgpu._cli.main import main
from daskgpu._cli.workers import nanny_options
from daskgpu._dask.cluster import worker_specs
from daskgpu._dask.workers.gpu_worker import local_devices, parse_devices, worker_options
from daskgpu._runtime import backends
from daskgpu._runtime.backends.base import Devices

REPO = pathlib.Path(__file__).resolve().parents[3]
UUID_A = "GPU-8f1c2d3e-0000-1111-2222-333344445555"
UUID_B = "GPU-9a7b6c5d-0000-1111-2222-333344445555"
MIG = "MIG-4b1e0f2a-0000-1111-2222-333344445555"


# -- naming devices -------------------------------------------------------------
@pytest.mark.parametrize("given,expected", [
    (0, (0,)),
    ("0,1", (0, 1)),
    (" 2 , 3 ,", (2, 3)),
    ([1, "0"], (1, 0)),
    ((UUID_A, MIG), (UUID_A, MIG)),
    (f"{UUID_A},{UUID_B}", (UUID_A, UUID_B)),
    (range(3), (0, 1, 2)),
    (None, None),
])
def test_parse_devices(given, expected):
    assert parse_devices(given) == expected


@pytest.mark.parametrize("given,match", [
    ([-1], "not a device"),
    (["gpu0"], "not a device"),
    ([True], "not a device"),
    ([1.5], "not a device"),
    ("GPU-", "not a device"),
    ("", "names no device"),
    ([], "names no device"),
    ([0, "0"], "twice"),
])
def test_parse_devices_rejects(given, match):
    with pytest.raises(ValueError, match=match):
        parse_devices(given)


def test_local_devices_ask_the_backend(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices(("0", UUID_A)))
    assert local_devices(simulate=False) == (0, UUID_A)
    with pytest.raises(dg.DeviceError, match=r"names GPU 4, but this machine has 2 GPU\(s\)"):
        local_devices([4], simulate=False)
    assert local_devices(simulate=True, simulated_count=3) == (0, 1, 2)  # the driver unasked
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((), "libcuda not found"))
    with pytest.raises(dg.DeviceError, match=r"^no CUDA GPU to run workers on "
                                             r"\(libcuda not found\)\. Do this\.$"):
        local_devices([0], simulate=False, no_gpu_fix="Do this.")


# -- the two ways agree ------------------------------------------------------------
def test_both_ways_make_the_same_gpu_worker_but_for_its_peers(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((0, 1)))
    cluster = worker_specs((0, 1), simulate=False)[1]["options"]
    cli = nanny_options("tcp://s:8786", devices="0,1", simulate=False)[1]
    for key in ("resources", "config", "nthreads", "death_timeout"):
        assert cluster[key] == cli[key], key
    assert [type(p) for p in cluster["plugins"]] == [type(p) for p in cli["plugins"]] \
        == [dg.GPUWorkerPlugin]
    assert cluster["env"]["DASK_DASKGPU__SIMULATE"] == cli["env"]["DASK_DASKGPU__SIMULATE"]
    # The deliberate difference: a cluster's worker sees its peers after its own GPU.
    assert cluster["env"]["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert cli["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    sim_cluster = worker_specs((0,), simulate=True)[0]["options"]
    (sim_cli,) = nanny_options("tcp://s:8786", simulate=True)
    assert sim_cluster["env"] == sim_cli["env"] == {"DASK_DASKGPU__SIMULATE": "True"}
    assert sim_cluster["config"] == sim_cli["config"] == {"daskgpu.simulate": True}


def test_a_gpu_resource_other_than_one_is_refused_both_ways(capsys):
    # It was taken by `daskgpu worker --resources GPU=2` and silently replaced by 1
    # in LocalGPUCluster.
    with pytest.raises(ValueError, match="resources GPU=2: a daskgpu worker serves one GPU"):
        dg.LocalGPUCluster(simulate=True, resources={"GPU": 2})
    with dask.config.set({"daskgpu.simulate": True}):
        assert main(["worker", "tcp://s:8786", "--resources", "GPU=2 MEM=4"]) == 2
    assert "resources GPU=2: a daskgpu worker serves one GPU" in capsys.readouterr().err
    opts = worker_options((0,), 0, simulate=True, peers=False, resources={"MEM": 4, "GPU": 1})
    assert opts["resources"] == {"MEM": 4, "GPU": 1}



@pytest.mark.parametrize("offer", ["inf", "nan"])
def test_a_gpu_memory_offer_that_is_no_number_of_bytes_is_refused_both_ways(capsys, offer):
    # Taken, such an offer made every map on the cluster fail as its facts were read.
    with pytest.raises(ValueError, match=f"resources GPU-memory={offer}: the device memory"):
        dg.LocalGPUCluster(simulate=True, resources={"GPU-memory": float(offer)})
    with dask.config.set({"daskgpu.simulate": True}):
        assert main(["worker", "tcp://s:8786", "--resources", f"GPU-memory={offer}"]) == 2
    assert (f"cannot read resource 'GPU-memory={offer}': an amount is a finite number, 0 or "
            "more" in capsys.readouterr().err)

def test_device_forms_are_checked_both_ways(capsys):
    # `daskgpu worker --devices` took any string; LocalGPUCluster checked the forms.
    with pytest.raises(ValueError, match="'gpu1' is not a device"):
        dg.LocalGPUCluster(simulate=True, devices="0,gpu1")
    with dask.config.set({"daskgpu.simulate": True}):
        assert main(["worker", "tcp://s:8786", "--devices", "0,gpu1"]) == 2
    assert "'gpu1' is not a device" in capsys.readouterr().err


@pytest.mark.slow
def test_a_worker_started_each_way_looks_the_same_to_the_scheduler(tmp_path):
    """A LocalGPUCluster worker and a ``daskgpu worker`` process on its scheduler."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(DASK_DASKGPU__SIMULATE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    with dg.LocalGPUCluster(simulate=True, devices=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "daskgpu", "worker", cluster.scheduler_address,
                 "--name", "by-hand", "--local-directory", str(tmp_path)],
                env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            client.wait_for_workers(2, timeout=90)
            workers = client.scheduler_info(n_workers=-1)["workers"]

            def seen(dask_worker):
                return {"plugins": sorted(dask_worker.plugins),
                        "simulate": dask.config.get("daskgpu.simulate"),
                        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "facts": dg.device_info(dask_worker)["name"]}

            views = client.run(seen)
        finally:
            proc.terminate()
            proc.wait(60)
    by_name = {w["name"]: addr for addr, w in workers.items()}
    ours, theirs = by_name[0], by_name["by-hand"]
    assert workers[ours]["resources"] == workers[theirs]["resources"] == {"GPU": 1}
    assert workers[ours]["nthreads"] == workers[theirs]["nthreads"] == 1
    assert views[ours] == views[theirs]
    assert "daskgpu-gpu" in views[ours]["plugins"]
    assert views[ours]["simulate"] is True and views[ours]["visible"] is None
    assert views[ours]["facts"] == "Numba CUDA simulator"
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_a_gpu_worker_reports_nvml_memory_and_utilization_to_the_scheduler():
    # distributed fills the dashboard's GPU Memory and GPU Utilization pages from these
    # monitor figures; they arrive only where NVML's bindings (the cu12 extra) load.
    pytest.importorskip("pynvml", reason="NVML's bindings (nvidia-ml-py) are not installed")
    import dask.array as da
    import numpy as np
    from kit.kernels import double

    with dask.config.set({"daskgpu.simulate": False}), \
            dg.LocalGPUCluster(simulate=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        x = da.ones(1 << 22, chunks=1 << 20, dtype=np.float32)
        assert client.compute(dg.map_kernel(double, dg.Out(like=x), x).sum()).result() == 2 << 22
        seen = _scheduler_gpu_metrics(client)
    assert seen, "the scheduler knows no worker"
    for address, (used, utilization) in seen.items():
        assert used is not None and utilization is not None, \
            f"{address}'s heartbeats carried no NVML figures"
        assert used > 0, f"{address} reported no GPU memory in use"
        assert 0 <= utilization <= 100, (address, utilization)


def _scheduler_gpu_metrics(client, timeout=10.0):
    """``{worker: (gpu_memory_used, gpu_utilization)}`` as the dashboard reads them,
    once every worker's heartbeat has carried them (or what is there at ``timeout``)."""
    import time

    def read(dask_scheduler):
        return {a: (ws.metrics.get("gpu_memory_used"), ws.metrics.get("gpu_utilization"))
                for a, ws in dask_scheduler.workers.items()}

    deadline = time.monotonic() + timeout
    while True:
        seen = client.run_on_scheduler(read)
        if seen and all(None not in v for v in seen.values()) or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)
