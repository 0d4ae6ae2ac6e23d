"""LocalGPUCluster: the spec it builds, and simulated (and real) clusters that start."""

import os
import time

import dask
import numpy as np
import pytest
from distributed import Client, Nanny, Worker
from distributed.security import Security

import daskgpu as dg
from daskgpu._dask import cluster as _cluster
from daskgpu._dask.cluster import resolve_devices, worker_specs
from daskgpu._dask.workers.gpu_worker import parse_devices
from daskgpu._dask.workers.plugin import GPUWorkerPlugin
from daskgpu._runtime import backends
from daskgpu._runtime.backends.base import Devices

UUID_A = "GPU-8f1c2d3e-0000-1111-2222-333344445555"
UUID_B = "GPU-9a7b6c5d-0000-1111-2222-333344445555"
MIG = "MIG-4b1e0f2a-0000-1111-2222-333344445555"


# -- the spec, without starting processes --------------------------------------
def test_one_worker_per_device_with_rotated_visible_devices():
    specs = worker_specs((0, 1, 2), simulate=False, threads_per_worker=2, memory_limit=None)
    assert list(specs) == [0, 1, 2]
    envs = [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()]
    assert envs == ["0,1,2", "1,2,0", "2,0,1"]
    for spec in specs.values():
        opts = spec["options"]
        assert spec["cls"] is Nanny
        assert opts["resources"] == {"GPU": 1}
        assert opts["nthreads"] == 2
        assert opts["memory_limit"] is None
        assert opts["env"]["DASK_DASKGPU__SIMULATE"] == "False"
        [plugin] = opts["plugins"]
        assert isinstance(plugin, GPUWorkerPlugin)
    plugins = [s["options"]["plugins"][0] for s in specs.values()]
    assert len({id(p) for p in plugins}) == 3  # each worker records its own facts


def test_rotation_with_uuids():
    specs = worker_specs((UUID_A, UUID_B, MIG), simulate=False)
    envs = [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()]
    assert envs == [f"{UUID_A},{UUID_B},{MIG}", f"{UUID_B},{MIG},{UUID_A}",
                    f"{MIG},{UUID_A},{UUID_B}"]


def test_spec_merges_user_options():
    class Extra(GPUWorkerPlugin):
        name = "extra"

    extra = Extra()
    specs = worker_specs((0,), simulate=False, resources={"MEM": 4, "GPU": 1},
                         plugins=[extra], env={"OMP_NUM_THREADS": "1"})
    opts = specs[0]["options"]
    assert opts["resources"] == {"MEM": 4, "GPU": 1}
    assert opts["plugins"][0] is extra and isinstance(opts["plugins"][1], GPUWorkerPlugin)
    assert opts["env"] == {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0",
                           "DASK_DASKGPU__SIMULATE": "False"}


def test_every_nanny_bounds_each_start_of_its_worker(monkeypatch):
    # A restart re-imports the main module: the nanny waits for it, up to this.
    started = []
    monkeypatch.setattr(_cluster.SpecCluster, "__init__",
                        lambda self, **kwargs: started.append(kwargs["workers"]))
    dg.LocalGPUCluster(simulate=True, devices=[0, 1])._restore_config()
    (workers,) = started
    assert [_cluster._start_timeout(w) for w in workers.values()] == [120, 120]
    assert _cluster.WORKER_START_TIMEOUT == 120
    for given, seconds in [(30, 30), ("2 minutes", 120), (None, 0)]:
        [spec] = worker_specs((0,), simulate=True, death_timeout=given).values()
        assert spec["options"]["death_timeout"] == given
        assert _cluster._start_timeout(spec) == seconds
    [threaded] = worker_specs((0,), simulate=True, processes=False, death_timeout=30).values()
    assert _cluster._start_timeout(threaded) == 0  # no nanny restarts it


def test_simulated_workers_are_pinned_to_no_gpu():
    # Their devices are not real: distributed's NVML monitor would fail on them.
    specs = worker_specs((0, 1), simulate=True)
    assert all("CUDA_VISIBLE_DEVICES" not in s["options"]["env"] for s in specs.values())


def test_threaded_spec_uses_worker_without_env():
    specs = worker_specs((0, 1), simulate=True, processes=False)
    assert all(s["cls"] is Worker and "env" not in s["options"] for s in specs.values())


def test_env_variable_reaches_dask_config():
    # What a Nanny's env does in a fresh worker process: the variable dask.config reads.
    [(key, value)] = worker_specs((0,), simulate=True)[0]["options"]["env"].items()
    assert dask.config.collect_env({key: value}) == {"daskgpu": {"simulate": True}}


def test_resolve_devices(monkeypatch):
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((3, 5)))
    assert resolve_devices() == ((3, 5), False)
    assert resolve_devices([UUID_A]) == ((UUID_A,), False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert resolve_devices([5]) == ((5,), False)  # ordinals as the workers' env takes them
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(dg.DeviceError, match=r"names GPU 5, but this machine has 2 GPU\(s\)"):
        resolve_devices([0, 5])
    assert resolve_devices(simulate=True) == ((0, 1), True)
    assert resolve_devices("0,1,2", simulate=True) == ((0, 1, 2), True)
    with dask.config.set({"daskgpu.simulate": True}):
        assert resolve_devices() == ((0, 1), True)
        assert resolve_devices(simulate=False) == ((3, 5), False)


def test_resolve_devices_without_gpu(monkeypatch, caplog):
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((), "no driver here"))
    with caplog.at_level("WARNING", logger="daskgpu"):
        assert resolve_devices() == ((0, 1), True)
        assert resolve_devices([0, 1, 2]) == ((0, 1, 2), True)
    assert "no CUDA GPU: no driver here; 2 simulated workers" in caplog.text
    with pytest.raises(dg.DeviceError, match="no driver here.*pass simulate=True"):
        resolve_devices(simulate=False)


@pytest.mark.nogpu
def test_simulate_false_without_gpu_errors_clearly():
    before = backends.current().simulated
    with pytest.raises(dg.DeviceError, match="no CUDA GPU to run workers on.*Install the NVIDIA driver"):
        dg.LocalGPUCluster(simulate=False)
    assert backends.current().simulated == before


def test_threads_need_simulation(monkeypatch):
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((0, 1)))
    with pytest.raises(ValueError, match="cannot pin them to different GPUs"):
        dg.LocalGPUCluster(processes=False)
    assert backends.current().simulated is False


# -- a simulated cluster of two worker processes ---------------------------------
@pytest.fixture(scope="module")
def cluster():
    with dg.LocalGPUCluster(simulate=True, dashboard_address=":0") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as client:
        yield client


def test_simulated_cluster_starts(cluster, client):
    assert cluster.devices == (0, 1)
    assert cluster.simulated is True
    assert len(client.scheduler_info()["workers"]) == 2
    assert backends.current().simulated is True  # in this process too


def test_each_worker_offers_one_gpu(client):
    workers = client.scheduler_info()["workers"].values()
    assert [w["resources"] for w in workers] == [{"GPU": 1}, {"GPU": 1}]
    assert all(w["nthreads"] == 1 for w in workers)


def test_simulate_flag_reaches_workers(client):
    flags = client.run(lambda: dask.config.get("daskgpu.simulate"))
    assert list(flags.values()) == [True, True]


def test_device_info_on_simulated_workers(client):
    info = client.run(dg.device_info)
    assert len(info) == 2
    for facts in info.values():
        assert facts["simulated"] is True and facts["device_id"] == 0
        assert facts["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_plugin_runs_again_after_restart(client):
    client.restart()
    recorded = client.run(lambda dask_worker: dask_worker.plugins["daskgpu-gpu"].info)
    assert len(recorded) == 2
    assert all(facts and facts["simulated"] for facts in recorded.values())


def test_scale_is_bounded_by_devices(cluster, client):
    with pytest.raises(ValueError, match="one worker per GPU.*give more devices"):
        cluster.scale(3)
    cluster.scale(1)
    deadline = time.monotonic() + 30
    while len(client.scheduler_info()["workers"]) != 1:
        assert time.monotonic() < deadline, "worker 1 did not retire"
        time.sleep(0.05)
    cluster.scale(2)
    client.wait_for_workers(2, timeout=30)
    assert sorted(cluster.worker_spec) == [0, 1]
    assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == [0, 1]


@pytest.mark.slow
def test_config_restored_after_close(cluster):
    with dask.config.set({"daskgpu.simulate": False}):
        with dg.LocalGPUCluster(simulate=True, processes=False, dashboard_address=":0") as c:
            assert c.simulated and backends.current().simulated is True
        # The module's simulated cluster (the fixture) is still open: simulation stays on for it
        # (tests/dask/test_cluster_simulate.py checks the setting coming back).
        assert backends.current().simulated is True


def test_each_nanny_gets_its_own_clusters_simulate_setting():
    for simulate in (True, False):
        [spec] = worker_specs((0,), simulate=simulate).values()
        assert spec["options"]["config"] == {"daskgpu.simulate": simulate}


def test_tls(client):
    pytest.importorskip("cryptography")
    security = Security.temporary()
    with dg.LocalGPUCluster(simulate=True, devices=[0], security=security,
                            dashboard_address=":0") as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        with Client(cluster) as tls_client:
            workers = tls_client.scheduler_info()["workers"]
            assert all(addr.startswith("tls://") for addr in workers)
            assert tls_client.submit(sum, [1, 2, 3]).result() == 6
            assert list(tls_client.run(dg.device_info).values())[0]["simulated"]


@pytest.mark.slow
def test_security_true_makes_temporary_credentials(monkeypatch):
    pytest.importorskip("cryptography")
    with dg.LocalGPUCluster(simulate=True, processes=False, security=True,
                            dashboard_address=":0") as cluster:
        assert cluster.scheduler_address.startswith("tls://")


# -- real GPUs ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.gpu
def test_real_cluster_pins_one_worker_per_gpu():
    devices = parse_devices(backends.GPU.devices().names)
    # simulate=False: the module's simulated cluster has daskgpu.simulate on here.
    with dg.LocalGPUCluster(simulate=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert cluster.devices == devices and cluster.simulated is False
        # The module's simulated cluster keeps daskgpu.simulate on here; the
        # workers of this one have it off.
        assert set(client.run(lambda: dask.config.get("daskgpu.simulate")).values()) == {False}
        names = {addr: w["name"] for addr, w in client.scheduler_info()["workers"].items()}
        info = client.run(dg.device_info)
        assert len(info) == len(devices)
        for addr, facts in info.items():
            assert facts["simulated"] is False
            assert facts["device_id"] == 0
            assert facts["cuda_visible_devices"].split(",")[0] == str(devices[names[addr]])
            assert facts["total_memory"] > 0 and len(facts["cc"]) == 2
        assert len({facts["uuid"] for facts in info.values()}) == len(devices)


# -- options checked before any process starts ----------------------------------
@pytest.mark.parametrize("option,value,fix", [
    ("CUDA_VISIBLE_DEVICES", "0,1", r"use devices="),
    ("n_workers", 2, r"use devices=: one worker runs per GPU"),
    ("nthreads", 2, r"use threads_per_worker="),
    ("device_memory_limit", "1GB", r"dask_cuda\.LocalCUDACluster .*GPUWorkerPlugin"),
    ("rmm_pool_size", "2GB", r"dask_cuda\.LocalCUDACluster .*GPUWorkerPlugin"),
    ("enable_nvlink", True, r"dask_cuda\.LocalCUDACluster"),
    ("no_such_option", 1, r"unexpected option\(s\) no_such_option=.*distributed\.Nanny"),
])
def test_options_it_does_not_take_raise_before_any_process_starts(option, value, fix,
                                                                  monkeypatch):
    started = []
    monkeypatch.setattr(_cluster.SpecCluster, "__init__",
                        lambda *a, **k: started.append(a))
    with pytest.raises(TypeError, match=fix):
        dg.LocalGPUCluster(simulate=True, **{option: value})
    assert not started


def test_threaded_workers_take_worker_options_only():
    _cluster.check_options(1, {"death_timeout": 5, "preload": []}, processes=False)
    with pytest.raises(TypeError, match=r"worker_class=.*distributed\.Worker"):
        _cluster.check_options(1, {"worker_class": Worker}, processes=False)
    _cluster.check_options(1, {"worker_class": Worker, "env": {}}, processes=True)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_threads_per_worker_must_be_a_positive_integer(threads):
    with pytest.raises(ValueError, match=f"threads_per_worker={threads!r}.*at least 1"):
        dg.LocalGPUCluster(simulate=True, threads_per_worker=threads)


@pytest.mark.slow
def test_no_dashboard_means_no_port_warning_when_8787_is_taken(recwarn):
    import socket

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", 8787))
        except OSError:
            pass  # already taken by someone else: the case under test all the same
        else:
            taken.listen()
        with dg.LocalGPUCluster(simulate=True, processes=False, dashboard_address=None) as c, \
                Client(c) as client:
            port = client.scheduler_info()["services"]["dashboard"]
    assert port != 8787
    assert not [w for w in recwarn if "already in use" in str(w.message)]


@pytest.mark.slow
@pytest.mark.nogpu
def test_simulating_without_a_gpu_says_so_in_one_short_line():
    import subprocess
    import sys

    script = ("import daskgpu as dg\n"
              "if __name__ == '__main__':\n"
              "    with dg.LocalGPUCluster(dashboard_address=None, processes=False):\n"
              "        pass\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 120, proc.stderr
    assert "simulated workers" in lines[0] and "DynamicLibNotFoundError" not in lines[0]
    assert ".." not in lines[0]



#: A user's script that maps before it starts its simulated cluster, then after.
MAP_BEFORE_THE_CLUSTER = """
import dask.array as da, numpy as np, daskgpu as dg
from distributed import Client
from kit.kernels import affine

x = da.arange(8.0, chunks=4)
y = dg.map_kernel(affine, dg.Out(np.float64, like=x), 2.0, x)  # no cluster yet: PTX only
if __name__ == "__main__":
    with dg.LocalGPUCluster(processes=False, simulate=True, dashboard_address=None) as c, \\
            Client(c) as client:
        try:
            client.compute(y).result(timeout=60)
        except dg.DeviceError as exc:
            print("ERROR", exc)
        z = dg.map_kernel(affine, dg.Out(np.float64, like=x), 2.0, x)  # built inside: runs
        print("INSIDE", client.compute(z).result(timeout=60).tolist())
"""


@pytest.mark.slow
def test_a_map_built_before_a_simulated_cluster_fails_naming_the_order(tmp_path):
    import subprocess
    import sys

    (tmp_path / "script.py").write_text(MAP_BEFORE_THE_CLUSTER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__) + "/..",
                                                        *sys.path]))
    env.pop("DASK_DASKGPU__SIMULATE", None)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    error = next(line for line in done.stdout.splitlines() if line.startswith("ERROR"))
    assert "shipped PTX only" in error and "a map_kernel built while neither the client nor "\
        "its cluster's workers simulated (before a simulated LocalGPUCluster started" in error
    assert f"INSIDE {(2.0 * np.arange(8.0) + 1.0).tolist()}" in done.stdout
