"""Launches stay on GPU workers on a cluster started by hand, whatever either side optimizes.

A ``dask scheduler`` process with its own (default) config, two simulated
``daskgpu worker`` processes offering ``GPU=1`` and one plain ``dask worker``
beside them: no ``map_kernel`` launch may run on the plain worker, though the
scheduler's low-level fusion drops layer annotations.
"""

import os
import pathlib
import subprocess
import sys
import tempfile
import time

import dask
import dask.array as da
import numpy as np
import pytest
from dask.utils import key_split
from distributed import Client, get_task_stream, wait
from distributed.diagnostics.plugin import SchedulerPlugin
from kit import stencils
from kit.kernels import heat_1d, scale
from layers import EXPRESSIONS, hlg_only, launch_restrictions

import daskgpu as dg
from daskgpu._dask.launch_core.resources import LAUNCH_SHARE
from daskgpu._dask.launch_core.walk import runs_launch
from daskgpu._dask.placement import GPUPlacement, ensure_placement
from daskgpu._runtime.launch_task import LaunchTask


def _start(argv, env, log):
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_for(path: pathlib.Path, seconds: float):
    end = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def mixed_cluster():
    """A scheduler, two simulated GPU workers and one plain worker, each its own process."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        scheduler_file = tmp / "scheduler.json"
        env = dict(os.environ, DASK_DASKGPU__SIMULATE="1",
                   DASK_DISTRIBUTED__WORKER__DAEMON="False")
        env.pop("CUDA_VISIBLE_DEVICES", None)
        log = open(tmp / "cluster.log", "wb")
        procs = [_start([sys.executable, "-m", "distributed.cli.dask_scheduler",
                         "--scheduler-file", str(scheduler_file), "--port", "0",
                         "--dashboard-address", ":0", "--no-show"],
                        {k: v for k, v in env.items() if k != "DASK_DASKGPU__SIMULATE"}, log)]
        try:
            _wait_for(scheduler_file, 60)
            procs.append(_start([sys.executable, "-m", "daskgpu", "worker",
                                 "--scheduler-file", str(scheduler_file), "--devices", "0,1",
                                 "--nthreads", "1"], env, log))
            procs.append(_start([sys.executable, "-m", "distributed.cli.dask_worker",
                                 "--scheduler-file", str(scheduler_file), "--nthreads", "2",
                                 "--name", "plain-cpu", "--no-dashboard"],
                                {k: v for k, v in env.items()
                                 if k != "DASK_DASKGPU__SIMULATE"}, log))
            with dask.config.set({"daskgpu.simulate": True}), \
                    Client(scheduler_file=str(scheduler_file), timeout="60s") as client:
                client.wait_for_workers(3, timeout=120)
                yield client
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in reversed(procs):
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
            log.close()


def _plain_worker(client) -> str:
    info = client.scheduler_info()["workers"]
    (address,) = [a for a, w in info.items() if w["name"] == "plain-cpu"]
    return address


def _launch_tasks_run_on(client, collection) -> tuple:
    """``collection``'s result, and {worker address: how many of its launching tasks ran there}.

    The launching tasks are found in the graph as the scheduler optimizes it
    (default settings): fused, a launch hides inside another layer's task.
    """
    if EXPRESSIONS:
        collection = collection.optimize()
    graph = dict(collection.__dask_optimize__(collection.__dask_graph__(),
                                              collection.__dask_keys__()))
    launching = {key for key, task in graph.items() if runs_launch(task)}
    assert launching, "no task of the graph launches"
    with get_task_stream(client) as stream:
        result = collection.compute()
    counts = {}
    for record in stream.data:
        if record["key"] in launching:
            counts[record["worker"]] = counts.get(record["worker"], 0) + 1
    return result, counts, len(launching)


@pytest.mark.slow
def test_no_launch_runs_on_the_plain_worker_with_default_settings(mixed_cluster):
    client = mixed_cluster
    plain = _plain_worker(client)
    # A CPU layer before the map (float32 again: Dask's expressions make it float64).
    x = (da.arange(24 * 64, dtype=np.float32, chunks=64) + 1).astype(np.float32)
    y = dg.map_kernel(scale, dg.Out(np.float32, like=x), 2.0, x)
    total, counts, launching = _launch_tasks_run_on(client, (y * 1).sum())
    assert float(total) == 2.0 * float(np.arange(1, 24 * 64 + 1).sum())
    assert sum(counts.values()) == launching == 24, counts  # fused into the sum's chunks
    assert counts.get(plain, 0) == 0, counts


@pytest.mark.slow
def test_every_launch_task_on_the_scheduler_is_restricted_to_gpus(mixed_cluster):
    client = mixed_cluster
    x = da.ones(8 * 32, dtype=np.float32, chunks=32)
    y = dg.map_kernel(scale, dg.Out(np.float32, like=x), 3.0, x).persist()
    wait(y)  # persist returns before the graph reaches the scheduler
    try:
        restrictions = list(launch_restrictions(client).values())
        assert restrictions == [{"GPU": LAUNCH_SHARE}] * 8
        assert (y.compute() == 3.0).all()
    finally:
        del y


def test_launch_callables_mark_themselves():
    launch = scale.forall(8)
    assert isinstance(launch, LaunchTask)
    assert not isinstance(np.add, LaunchTask)
    assert isinstance(GPUPlacement(), SchedulerPlugin)


@hlg_only  # low-level fusion is the HighLevelGraph's
@pytest.mark.parametrize("blocks", [3, 300])  # the launch in each task, or a key of its own
def test_the_launch_and_its_chunk_are_found_inside_fused_tasks(blocks):
    # Low-level fusion hands a fused task its map's launch (inline, or a reference to the
    # launch key) and its place among its inputs: the scheduler's placement and the
    # worker's time limit both read them there, and the memory of each task's own block.
    from types import SimpleNamespace

    from daskgpu._dask.launch_core.asks import device_bytes
    from daskgpu._dask.launch_core.walk import held_in, launch_of
    from daskgpu._dask.map_kernel.graphs.hlg import EMBED_BYTES

    with dask.config.set({"daskgpu.simulate": True}):
        x = da.zeros(2 * blocks - 1, chunks=2, dtype=np.float32)  # the last block of 1
        z = dg.map_kernel(scale, dg.Out(like=x), np.float32(2), x, timeout=7)
        (fused,) = dask.optimize(z)
    graph = dict(fused.__dask_graph__())
    keys = [k for k in graph if str(k).endswith("-launch")]
    assert len(keys) == (blocks > EMBED_BYTES >> 10)
    held = {k: graph[k].value for k in keys}  # a worker's data
    scheduler = {k: SimpleNamespace(run_spec=graph[k]) for k in keys}  # its tasks
    tasks = {k: t for k, t in graph.items() if runs_launch(t)}
    assert len(tasks) == blocks and all(t.has_subgraph() for t in tasks.values())
    for key, task in tasks.items():
        launch = launch_of(task, held_in(held))
        assert launch is not None and launch.timeout == 7, key
        assert device_bytes(task, scheduler) == 8 * x.chunks[0][key[1]], key


@pytest.mark.slow
def test_a_client_that_does_not_simulate_ships_python_to_simulated_workers(mixed_cluster):
    # The workers were started by hand with DASK_DASKGPU__SIMULATE=1; this client is not.
    client = mixed_cluster
    with dask.config.set({"daskgpu.simulate": False}):
        x = da.arange(6 * 16, dtype=np.float32, chunks=16)
        y = dg.map_kernel(scale, dg.Out(np.float32, like=x), 4.0, x)
        np.testing.assert_array_equal(y.compute(), 4 * np.arange(6 * 16, dtype=np.float32))
        # A bundle has no Python function to ship: refused when the graph is built.
        ptx_only = scale.ptx_kernel(with_function=False)
        with pytest.raises(TypeError, match=r"cannot run in the CUDA simulator.*daskgpu\.simulate"):
            dg.map_kernel(ptx_only, dg.Out(np.float32, like=x), 4.0, x)
        # A launch pickled PTX-only fails on a simulated worker with one line naming the setting.
        fut = client.submit(scale.forall(16), np.empty(16, np.float32), np.float32(1),
                            np.ones(16, np.float32), pure=False)
        with pytest.raises(dg.DeviceError, match=r"shipped PTX only.*daskgpu\.simulate"):
            fut.result(timeout=60)


@pytest.mark.slow
@pytest.mark.grouped
def test_10000_small_chunks_group_into_a_few_launches_on_gpu_workers_on_a_cluster_by_hand(
        mixed_cluster):
    # Grouping is sized from what the hand-started workers offer, as the client sees them;
    # the scheduler, with its own config, only runs the few tasks.
    client = mixed_cluster
    plain = _plain_worker(client)
    xn = np.arange(10_000, dtype=np.float32)
    x = da.from_array(xn, chunks=1)
    y = dg.map_kernel(scale, dg.Out(np.float32, like=x), 2.0, x)
    assert y.numblocks[0] < 10, y.numblocks  # a few launches, not 10,000
    # Persisted, each launch keeps its own key (a compute fuses one into its finalize).
    with get_task_stream(client) as stream:
        held = client.persist(y)
        wait(held, timeout=120)
    np.testing.assert_array_equal(held.compute(), 2 * xn)
    # The launch tasks, by their name: on expressions a persisted collection's keys are
    # its own, not those of the tasks that ran.
    ran = [(r["key"], r["worker"]) for r in stream.data]
    launched = [worker for key, worker in ran if key_split(key) == "scale"]
    assert len(launched) == y.numblocks[0] and plain not in launched, ran
    # Nothing per chunk in the graph: the source is read in the groups' pieces.
    assert len(stream.data) <= 3 * y.numblocks[0], [r["key"] for r in stream.data][:12]


@pytest.mark.slow
def test_10000_chunks_iterate_in_a_group_per_gpu_worker_on_a_cluster_by_hand(mixed_cluster):
    # The groups follow the GPU workers the client sees (two), not the plain one, and
    # the blocks run on those workers.
    client = mixed_cluster
    plain = _plain_worker(client)
    xn = np.random.default_rng(5).random(10_000).astype(np.float32)
    u0 = da.from_array(xn, chunks=1)
    u = dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, np.float32(0.2), steps=3,
                   depth=1, boundary="periodic", tpb=64)
    assert u.numblocks == (2,), u.numblocks
    got, counts, launching = _launch_tasks_run_on(client, u)
    (want,) = stencils.loop(stencils.heat(np.float32(0.2)), [xn], [], 3, 1, "periodic")
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert sum(counts.values()) == launching == 2, counts  # one block of 3 steps a group
    assert counts.get(plain, 0) == 0, counts


_KERNELS = '''
from numba import cuda


def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]
'''


@pytest.mark.slow
def test_daskgpu_batch_runs_on_a_simulated_cluster_started_by_hand(mixed_cluster, tmp_path):
    (tmp_path / "kernels.py").write_text(_KERNELS)
    x = np.arange(400, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.ones_like(x))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DASKGPU")}
    out = subprocess.run(
        [sys.executable, "-m", "daskgpu", "batch", "kernels.py:saxpy", "--input", "x.npy",
         "--input", "y.npy", "--output", "z.zarr:float32", "--scalar", "2.0", "--chunks", "100",
         "--scheduler", mixed_cluster.scheduler.address],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    import zarr

    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "z.zarr"))[:], 2 * x + 1)


def test_a_scheduler_that_refuses_the_plugin_is_named_once(caplog):
    import types

    from daskgpu._dask.placement import ensure_placement

    calls = []

    def register_plugin(plugin, name=None):
        calls.append(name)
        raise RuntimeError("No module named 'daskgpu'")

    client = types.SimpleNamespace(scheduler=types.SimpleNamespace(address="tcp://nowhere:1"),
                                   register_plugin=register_plugin)
    with caplog.at_level("WARNING", logger="daskgpu"):
        ensure_placement(client)
        ensure_placement(client)  # tried once per scheduler
    assert calls == [GPUPlacement.name]
    (record,) = caplog.records
    assert "tcp://nowhere:1" in record.getMessage()
    assert "install daskgpu where the scheduler runs" in record.getMessage()


@pytest.mark.slow
def test_a_gpu_worker_runs_as_many_launches_at_once_as_it_has_threads():
    # The restriction places launches; it does not make them wait for each other
    # (GPU=1 ran them one at a time, while map_blocks of the same work used every thread).
    with dg.LocalGPUCluster(simulate=True, processes=False, devices=[0], threads_per_worker=2,
                            dashboard_address=":0") as cluster, Client(cluster) as client:
        x = da.ones(6 * 4096, dtype=np.float32, chunks=4096)
        with get_task_stream(client) as stream:
            y = dg.map_kernel(scale, dg.Out(np.float32, like=x), 2.0, x).persist()
            wait(y)
        asked = launch_restrictions(client)
        assert list(asked.values()) == [{"GPU": LAUNCH_SHARE}] * 6
        spans = sorted((s["start"], s["stop"]) for t in stream.data
                       if t["key"] in asked for s in t["startstops"]
                       if s["action"] == "compute")
        assert len(spans) == 6
        # Two at once: the next starts well before the one before it ends (one at a
        # time, the clocks of start and stop still let them overlap by a millisecond).
        assert any(a[1] - b[0] > (a[1] - a[0]) / 4 for a, b in zip(spans, spans[1:])), spans
        assert (y.compute() == 2.0).all()


@pytest.mark.slow
def test_a_launch_that_asks_for_the_whole_gpu_keeps_it():
    # The README's way to keep each launch alone on its GPU: the placement plugin
    # keeps the larger of what the task asked and its share.
    with dg.LocalGPUCluster(simulate=True, processes=False, devices=[0], threads_per_worker=2,
                            dashboard_address=":0") as cluster, Client(cluster) as client:
        x = da.ones(2 * 4096, dtype=np.float32, chunks=4096)
        y = dg.map_kernel(scale, dg.Out(np.float32, like=x), 2.0, x).persist(
            resources={"GPU": 1})
        wait(y)
        assert list(launch_restrictions(client).values()) == [{"GPU": 1}] * 2
        assert (y.compute() == 2.0).all()


@pytest.mark.slow
def test_a_launch_restricted_to_a_worker_without_a_gpu_is_refused_at_once(mixed_cluster):
    # The caller's workers= allows only the plain worker; placement adds the GPU ask: no
    # worker can take it, and it must not wait for ever (nor for the no-worker timeout).
    client = mixed_cluster
    ensure_placement(client)  # as a map or LocalGPUCluster does (a bare submit does not)
    plain = _plain_worker(client)
    message = (r"^kernel 'scale' \(task .*\) asks for GPU=0.000976562, and is restricted to "
               rf"workers=\['{plain}'\], of which none offers that: they offer {plain}: "
               r"nothing; restrict it to a GPU worker")
    x = np.arange(8, dtype=np.float32)
    started = time.monotonic()
    future = client.submit(scale.forall(8), np.zeros_like(x), 2.0, x, workers=[plain],
                           pure=False)
    with pytest.raises(Exception, match=message) as caught:
        future.result(timeout=60)
    assert len(str(caught.value).splitlines()) == 1
    xd = da.arange(64, chunks=32, dtype=np.float32)
    y = dg.map_kernel(scale, dg.Out(np.float32, like=xd), 2.0, xd)
    with pytest.raises(Exception, match=message):
        client.compute(y, workers=[plain]).result(timeout=60)
    assert time.monotonic() - started < 30  # daskgpu.no-worker-timeout is 120 s
    # Allowed elsewhere too, it runs on a GPU worker.
    out = client.submit(scale.forall(8), np.zeros_like(x), 2.0, x, workers=[plain],
                        allow_other_workers=True, pure=False).result(timeout=60)
    np.testing.assert_array_equal(out, 2 * x)
