"""``daskgpu worker`` without a GPU: with ``daskgpu.simulate`` on it starts simulated workers."""

import asyncio
import os
import pathlib
import subprocess
import sys
import time

import dask
import numpy as np
import pytest
from kit.restart import SLOW_MODULE, lose_the_context
from numba import cuda

import daskgpu as dg
from daskgpu._cli import main as cli
from daskgpu._cli.main import main
from daskgpu._cli.workers import nanny_options, run_workers
from daskgpu._dask.workers.gpu_worker import WORKER_START_TIMEOUT
from daskgpu._runtime import backends
from daskgpu._runtime.backends.base import Devices

REPO = pathlib.Path(__file__).resolve().parents[2]


# At module level: simulated, the kernel travels with its Python function.
@dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without a GPU or CUDA_VISIBLE_DEVICES."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((), "libcuda not found"))


@pytest.fixture
def captured_specs(monkeypatch):
    """The nanny specs ``daskgpu worker`` would run, instead of running them."""
    runs = []

    async def run_workers(specs, stop=None):
        runs.append(specs)

    monkeypatch.setattr(cli, "run_workers", run_workers)
    return runs


def test_simulated_worker_without_a_gpu_is_one_nanny_with_the_setting(
        no_gpu, captured_specs, capsys):
    with dask.config.set({"daskgpu.simulate": True}):
        assert main(["worker", "tcp://scheduler:8786"]) == 0
    (specs,) = captured_specs
    (spec,) = specs
    # The setting reaches the worker both ways: its dask config and its environment.
    assert spec["config"] == {"daskgpu.simulate": True}
    assert spec["env"] == {"DASK_DASKGPU__SIMULATE": "True"}  # and no GPU pinned
    assert spec["resources"] == {"GPU": 1}
    assert spec["scheduler_ip"] == "tcp://scheduler:8786"
    (plugin,) = spec["plugins"]
    assert isinstance(plugin, dg.GPUWorkerPlugin)
    err = capsys.readouterr().err
    assert err == ("daskgpu worker: daskgpu.simulate is on; 1 simulated worker(s) run kernels "
                   "in Numba's CUDA simulator\n")


def test_simulated_workers_one_per_device_named(no_gpu, captured_specs):
    with dask.config.set({"daskgpu.simulate": True}):
        assert main(["worker", "tcp://s:8786", "--devices", "0,1,2", "--name", "sim"]) == 0
    (specs,) = captured_specs
    assert [s["name"] for s in specs] == ["sim-0", "sim-1", "sim-2"]
    # Simulated workers have no device: none is pinned, as in LocalGPUCluster.
    assert [s["env"] for s in specs] == [{"DASK_DASKGPU__SIMULATE": "True"}] * 3
    assert all(s["config"] == {"daskgpu.simulate": True} for s in specs)


def test_simulated_default_is_one_worker_even_where_gpus_are_visible(monkeypatch):
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices(("0", "1")))
    assert len(nanny_options("tcp://s:8786", simulate=False)) == 2
    (spec,) = nanny_options("tcp://s:8786", simulate=True)
    assert "CUDA_VISIBLE_DEVICES" not in spec["env"]


def test_without_simulate_and_without_a_gpu_the_error_names_the_setting(
        no_gpu, captured_specs, capsys):
    with dask.config.set({"daskgpu.simulate": False}):
        # 2: a command this machine cannot run, as `daskgpu --help` says.
        assert main(["worker", "tcp://s:8786"]) == 2
        # Naming devices does not help without a GPU: refused the same, before any nanny.
        assert main(["worker", "tcp://s:8786", "--devices", "0,1"]) == 2
    assert captured_specs == []
    for err in capsys.readouterr().err.splitlines():
        assert "no CUDA GPU to run workers on (libcuda not found)" in err
        assert "DASK_DASKGPU__SIMULATE=1" in err
        assert "--devices" not in err  # following such advice ended in a traceback


def test_not_simulated_specs_pin_their_gpu_and_turn_simulation_off(monkeypatch):
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices(("0", "1", "2", "3")))
    (spec,) = nanny_options("tcp://s:8786", devices=["3"], simulate=False)
    # Off both ways: a scheduler's config must not turn its workers to simulating.
    assert spec["env"] == {"DASK_DASKGPU__SIMULATE": "False", "CUDA_VISIBLE_DEVICES": "3"}
    assert spec["config"] == {"daskgpu.simulate": False}


# -- the real thing: dask scheduler + daskgpu worker + a client, in separate processes --
def _wait_for(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size):
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path} not written in {timeout}s"
        time.sleep(0.2)


@pytest.mark.slow
def test_hand_started_simulated_cluster_runs_map_kernel(tmp_path):
    """``DASK_DASKGPU__SIMULATE=1 dask scheduler`` / ``daskgpu worker``, and a client.

    The client sets ``daskgpu.simulate`` too: a client that does not ships PTX only,
    which a simulated worker without a GPU cannot load.
    """
    import dask.array as da
    from distributed import Client

    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(DASK_DASKGPU__SIMULATE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    scheduler_file = tmp_path / "scheduler.json"
    procs = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--port", "0", "--dashboard-address",
             ":0", "--scheduler-file", str(scheduler_file)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(scheduler_file, procs[0])
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "daskgpu", "worker", "--scheduler-file",
                 str(scheduler_file), "--dashboard-address", ":0",
                 "--local-directory", str(tmp_path)],
                env=env, stdout=out, stderr=subprocess.STDOUT))
        with dask.config.set({"daskgpu.simulate": True}), \
                Client(scheduler_file=str(scheduler_file), timeout="60s",
                       set_as_default=False) as client:
            client.wait_for_workers(1, timeout=90)
            x = da.arange(256, chunks=64, dtype=np.float32)
            out = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
            got = client.compute(out).result(timeout=90)
            info = client.run(dg.device_info)
        np.testing.assert_array_equal(got, 3 * np.arange(256, dtype=np.float32))
        assert [i["simulated"] for i in info.values()] == [True]
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert "daskgpu.simulate is on; 1 simulated worker(s)" in text
    assert "Traceback" not in text, text


# -- restarts: a nanny waits for a slow worker start, up to a finite bound -------
def test_nannies_bound_each_worker_start_as_local_gpu_cluster_does():
    (spec,) = nanny_options("tcp://s:8786", simulate=True)
    assert spec["death_timeout"] == WORKER_START_TIMEOUT == 120
    (spec,) = nanny_options("tcp://s:8786", simulate=True, death_timeout=30)
    assert spec["death_timeout"] == 30


@pytest.mark.slow
def test_a_worker_restarted_after_a_lost_context_comes_back_after_a_slow_import(tmp_path):
    """``daskgpu worker``'s nanny restarts its worker however long the import takes.

    The worker process imports a module that sleeps once a marker file exists,
    so the first start is fast and the restart (after a task lost the CUDA
    context, and GPUWorkerPlugin closed the worker) slow.
    """
    from distributed import Client, Scheduler

    marker = tmp_path / "import-seconds"
    module = tmp_path / "slow_import.py"
    module.write_text(SLOW_MODULE.format(marker=str(marker)))

    async def scenario():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler:
            (spec,) = nanny_options(scheduler.address, simulate=True, dashboard_address=":0",
                                    local_directory=str(tmp_path))
            spec["preload"] = [str(module)]
            stop = asyncio.Event()
            workers = asyncio.ensure_future(run_workers([spec], stop))
            try:
                async with Client(scheduler.address, asynchronous=True) as client:
                    await client.wait_for_workers(1, timeout=60)
                    (old,) = scheduler.workers
                    marker.write_text("3")
                    with pytest.raises(Exception, match="ILLEGAL_ADDRESS"):
                        await client.submit(lose_the_context, pure=False)
                    start = time.monotonic()
                    while set(scheduler.workers) in (set(), {old}):
                        assert time.monotonic() - start < 60, "the worker did not come back"
                        assert not workers.done(), "the nanny gave up"
                        await asyncio.sleep(0.1)
                    assert time.monotonic() - start > 3
                    assert await client.submit(lambda: 1, pure=False) == 1
            finally:
                stop.set()
                await workers

    asyncio.run(scenario())


class FakeNanny:
    """A nanny that starts at once and finishes when ``done`` is set."""

    def __init__(self, **spec):
        self.spec = spec
        self.done = asyncio.Event()

    def __await__(self):
        return asyncio.sleep(0, self).__await__()

    async def finished(self):
        await self.done.wait()

    async def close(self, timeout=None, reason=None):
        self.done.set()


def test_a_nanny_that_gives_up_is_reported_and_the_others_run_on(monkeypatch, capsys):
    import distributed

    made = []
    monkeypatch.setattr(distributed, "Nanny", lambda **spec: made.append(FakeNanny(**spec))
                        or made[-1])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((0, 1)))
    specs = nanny_options("tcp://s:8786", devices=["0", "1"], simulate=False)

    async def scenario():
        stop = asyncio.Event()
        running = asyncio.ensure_future(run_workers(specs, stop))
        while len(made) < 2:
            await asyncio.sleep(0.01)
        made[0].done.set()  # as when the worker on GPU 0 did not restart in time
        await asyncio.sleep(0.05)
        assert not running.done()  # GPU 1's worker runs on
        stop.set()
        await asyncio.wait_for(running, 10)

    asyncio.run(scenario())
    assert capsys.readouterr().err == (
        "daskgpu worker: the worker on GPU 0 stopped for good: its nanny closed, either "
        "because the scheduler closed it or because its process did not start within "
        "death_timeout=120 s; 1 of 2 worker(s) still run\n")


@pytest.mark.slow
def test_tls_credentials_in_dasks_environment_variables_are_taken():
    # As a Kubernetes manifest or a SLURM script sets them, before the process starts:
    # dask's config then holds "ca_file" where a config file says "ca-file".
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": "/secrets/ca.pem",
           "DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT": "/secrets/worker.pem",
           "DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY": "/secrets/worker.key"}
    code = ("from daskgpu._cli.workers import worker_security\n"
            "print(worker_security('tls://scheduler:8786'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "None\n"  # Dask's own settings serve: no credentials refused
