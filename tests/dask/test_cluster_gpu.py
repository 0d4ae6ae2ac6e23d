"""A cluster started by hand, on one GPU: several workers share it, and results stay exact.

``dask scheduler`` (its own process, default config), ``daskgpu worker``
processes offering ``GPU=1`` and a plain ``dask worker`` without that
resource, all subprocesses; the client is this process. Checked:

1. two worker processes share one GPU, and a ``map_kernel`` over many chunks
   runs on both;
2. no launch runs on the plain worker;
3. a GPU worker SIGKILLed mid-map: its nanny restarts it, the chunks it held
   are computed again, and the result is whole;
4. a chain whose intermediate moves between workers: A persisted on one
   worker, B restricted to the other, on host (numpy) and CuPy chunks.

Every comparison is exact, on integers or exactly representable floats.

Two variants of the same tests:

- ``gpu`` (marker ``gpu``): real workers. ``daskgpu worker`` refuses a
  device named twice, so each GPU worker is its own ``daskgpu worker
  --devices D`` process, all on the first visible GPU.
- ``simulated``: ``DASK_DASKGPU__SIMULATE=1`` and one ``daskgpu worker
  --devices 0,1`` process (two simulated workers). Six started processes
  make it slow on a small CI machine (about a minute on two cores), so it
  runs only with ``DASKGPU_SIM_CLUSTER_TESTS=1``.
"""

from __future__ import annotations

import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, get_task_stream, wait
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.walk import runs_launch

REPO = pathlib.Path(__file__).resolve().parents[2]
PLAIN = "plain-cpu"


# -- kernels (module level: compiled once here, to PTX; no GPU needed) ---------

@dg.jit("void(int32[::1], int32[::1], int64)")
def affine(out, x, start):
    # start (dg.offset) makes every element depend on its global place.
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 3 * x[i] + (start + i) % 7


@dg.jit("void(int32[::1], int32[::1], int32)")
def twice_minus(out, x, c):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i] - c


@dg.jit("void(float32[::1], float32[::1], int32)")
def busy_double(out, x, iters):
    # Dependent sin/cos steps make a chunk take time. Adding v * 0 keeps them
    # (without fastmath it cannot be folded: v could be NaN), yet v stays in
    # [-1, 1], so the result is exactly 2 * x.
    i = cuda.grid(1)
    if i < out.size:
        v, half = x[i], np.float32(0.5)
        for _ in range(iters):
            v = math.sin(v) * half + math.cos(v) * half
        out[i] = 2 * x[i] + v * 0


# -- the cluster ---------------------------------------------------------------

def _wait_for(path: pathlib.Path, seconds: float, log: pathlib.Path):
    end = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear within {seconds} s\n{_tail(log)}")
        time.sleep(0.2)


def _tail(log: pathlib.Path, n: int = 60) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "cluster log, last lines:\n" + "\n".join(lines[-n:])


class HandStartedCluster:
    """The client, and what the tests need to know about the workers."""

    def __init__(self, client, simulated, log):
        self.client, self.simulated, self.log = client, simulated, log
        # Elements per chunk: the simulator takes about a millisecond an element.
        self.chunk = 16 if simulated else 1 << 16

    def gpu_workers(self) -> list:
        """The addresses of the workers offering ``GPU``, sorted."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return sorted(a for a, w in info.items() if (w.get("resources") or {}).get("GPU"))

    def plain_worker(self) -> str:
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        (address,) = [a for a, w in info.items() if w["name"] == PLAIN]
        return address

    def wait_for_gpu_workers(self, n: int = 2, seconds: float = 120) -> list:
        deadline = time.monotonic() + seconds
        while len(workers := self.gpu_workers()) < n:
            if time.monotonic() > deadline:
                pytest.fail(f"{len(workers)} GPU workers after {seconds} s, expected {n}\n"
                            f"{_tail(self.log)}")
            time.sleep(0.2)
        return workers


def _gpu_worker_commands(simulated: bool, scheduler_file: str) -> list:
    base = [sys.executable, "-m", "daskgpu", "worker", "--scheduler-file", scheduler_file,
            "--nthreads", "1", "--memory-limit", "4GB"]
    if simulated:
        return [base + ["--devices", "0,1", "--name", "sim"]]
    # One process per worker: a device named twice is refused.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    device = next((d.strip() for d in visible.split(",") if d.strip()), "0")
    return [base + ["--devices", device, "--name", f"gpu-{i}"] for i in range(2)]


def _stop(procs):
    """SIGTERM the workers, then the scheduler (first in ``procs``), each group at once."""
    for group in (procs[1:], procs[:1]):
        for p in group:
            if p.poll() is None:
                p.terminate()
        for p in group:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _simulated_variant_wanted() -> bool:
    return os.environ.get("DASKGPU_SIM_CLUSTER_TESTS", "") not in ("", "0")


@pytest.fixture(scope="module", params=[
    pytest.param(False, id="gpu", marks=pytest.mark.gpu),
    pytest.param(True, id="simulated", marks=pytest.mark.skipif(
        not _simulated_variant_wanted(),
        reason="slow (six processes on this machine): set DASKGPU_SIM_CLUSTER_TESTS=1 to run")),
])
def cluster(request):
    """A scheduler, two GPU workers and a plain worker, each started as on the command line."""
    simulated = request.param
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        scheduler_file = str(tmp / "scheduler.json")
        log_path = tmp / "cluster.log"
        # The package may come from PYTHONPATH rather than an installation.
        path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        plain_env = {k: v for k, v in os.environ.items() if k != "DASK_DASKGPU__SIMULATE"}
        plain_env.update(PYTHONPATH=os.pathsep.join(path),
                         DASK_DISTRIBUTED__WORKER__DAEMON="False")
        gpu_env = dict(plain_env)
        if simulated:
            gpu_env["DASK_DASKGPU__SIMULATE"] = "1"
        procs = []
        with open(log_path, "wb") as log:
            def start(argv, env):
                procs.append(subprocess.Popen(argv, env=env, stdout=log,
                                              stderr=subprocess.STDOUT))

            try:
                start([sys.executable, "-m", "distributed.cli.dask_scheduler",
                       "--scheduler-file", scheduler_file, "--port", "0",
                       "--dashboard-address", ":0", "--no-show"], plain_env)
                _wait_for(pathlib.Path(scheduler_file), 60, log_path)
                for argv in _gpu_worker_commands(simulated, scheduler_file):
                    start(argv, gpu_env)
                start([sys.executable, "-m", "distributed.cli.dask_worker",
                       "--scheduler-file", scheduler_file, "--nthreads", "2",
                       "--name", PLAIN, "--no-dashboard"], plain_env)
                with dask.config.set({"daskgpu.simulate": simulated}), \
                        Client(scheduler_file=scheduler_file, timeout="60s") as client:
                    try:
                        client.wait_for_workers(3, timeout=180)
                    except TimeoutError:
                        pytest.fail(f"the workers did not join\n{_tail(log_path)}")
                    hand = HandStartedCluster(client, simulated, log_path)
                    hand.wait_for_gpu_workers(2)
                    yield hand
            finally:
                _stop(procs)


def _launching_keys(collection) -> set:
    """The keys of ``collection``'s tasks that launch, in the graph as optimized to run."""
    graph = dict(collection.__dask_optimize__(collection.__dask_graph__(),
                                              collection.__dask_keys__()))
    return {key for key, task in graph.items() if runs_launch(task)}


def _count(stream, keys) -> dict:
    counts = {}
    for record in stream.data:
        if record["key"] in keys:
            counts[record["worker"]] = counts.get(record["worker"], 0) + 1
    return counts


def _compute_counting_launches(client, collection, **compute_kw):
    """``collection``'s result, {worker: launching tasks run there}, the number of them,
    and the task stream's records."""
    launching = _launching_keys(collection)
    assert launching, "no task of the graph launches"
    with get_task_stream(client) as stream:
        result = client.compute(collection, **compute_kw).result(timeout=120)
    return result, _count(stream, launching), len(launching), stream.data


# -- 1. several worker processes on one GPU ----------------------------------

def test_two_worker_processes_share_one_gpu_and_both_launch(cluster):
    client = cluster.client
    gpus = cluster.gpu_workers()
    assert len(gpus) == 2
    pids = client.run(os.getpid, workers=gpus)
    assert len(set(pids.values())) == 2, pids  # two processes...
    infos = client.run(dg.device_info, workers=gpus)
    assert {i["simulated"] for i in infos.values()} == {cluster.simulated}
    if not cluster.simulated:  # ... on one and the same GPU
        assert len({i["uuid"] for i in infos.values()}) == 1, infos
        assert None not in {i["uuid"] for i in infos.values()}

    n = 48 * cluster.chunk
    xn = np.arange(n, dtype=np.int32)
    x = da.from_array(xn, chunks=cluster.chunk)
    y = dg.map_kernel(affine, dg.Out(np.int32, like=x), x, dg.offset)
    result, counts, launching, _ = _compute_counting_launches(client, y)
    np.testing.assert_array_equal(result, 3 * xn + np.arange(n, dtype=np.int32) % 7)
    assert launching == 48 and sum(counts.values()) == 48, counts
    assert set(counts) == set(gpus), f"launches ran on {counts}, not on both of {gpus}"


# -- 2. the plain worker runs no launch -------------------------------------

def test_no_launch_runs_on_the_plain_worker(cluster):
    client = cluster.client
    plain = cluster.plain_worker()
    assert client.submit(os.getpid, workers=[plain], pure=False).result(timeout=60)
    n = 32 * cluster.chunk
    x = da.arange(n, dtype=np.int32, chunks=cluster.chunk) + 1  # a CPU layer before the map
    y = dg.map_kernel(affine, dg.Out(np.int32, like=x), x, dg.offset)
    z = y * 2 - 1  # and one after, fused with the launch by default
    result, counts, launching, _ = _compute_counting_launches(client, z)
    idx = np.arange(n, dtype=np.int32)
    np.testing.assert_array_equal(result, 2 * (3 * (idx + 1) + idx % 7) - 1)
    assert sum(counts.values()) == launching == 32, counts
    assert counts.get(plain, 0) == 0, counts
    assert set(counts) <= set(cluster.gpu_workers()), counts

    total, counts, launching, _ = _compute_counting_launches(client, z.sum(dtype=np.int64))
    assert int(total) == int((2 * (3 * (idx.astype(np.int64) + 1) + idx % 7) - 1).sum())
    assert sum(counts.values()) == launching == 32 and counts.get(plain, 0) == 0, counts


# -- 3. a GPU worker killed mid-map -------------------------------------------

def _kill_a_busy_gpu_worker(client, gpus, pids, holding, future, killed, seconds=90):
    """SIGKILL the process of the first GPU worker seen computing while holding a
    finished chunk of ``holding``; record (address, pid, whether the job was done)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not future.done():
        processing, has_what = client.processing(), client.has_what()
        for w in gpus:
            if processing.get(w) and any(
                    isinstance(k, tuple) and k[0] == holding for k in has_what.get(w, ())):
                done = future.done()
                os.kill(pids[w], signal.SIGKILL)
                killed.append((w, pids[w], done))
                return
        time.sleep(0.02)


def test_a_gpu_worker_killed_mid_map_leaves_the_result_whole(cluster):
    client = cluster.client
    gpus = cluster.wait_for_gpu_workers(2)
    pids = client.run(os.getpid, workers=gpus)
    if cluster.simulated:
        nchunks, chunk, iters = 32, 64, 2
    else:
        # 64 chunks that each about fill an H200; seconds of work in all.
        nchunks, chunk, iters = 64, 1 << 18, 150_000
    n = nchunks * chunk  # float32 holds every index exactly, so 2 * x is exact
    x = da.arange(n, chunks=chunk, dtype=np.float32)
    out = dg.map_kernel(busy_double, dg.Out(np.float32, like=x), x, iters)
    future = client.compute(out)
    killed = []
    killer = threading.Thread(target=_kill_a_busy_gpu_worker,
                              args=(client, gpus, pids, out.name, future, killed))
    killer.start()
    try:
        result = future.result(timeout=240)
    finally:
        killer.join()
    assert killed, "the map finished before a GPU worker could be killed"
    address, pid, done = killed[0]
    assert not done, "the worker was killed only after the map had finished"
    np.testing.assert_array_equal(result, 2 * np.arange(n, dtype=np.float32))

    # The killed worker left; its nanny started a fresh process in its place.
    deadline = time.monotonic() + 60
    while address in client.scheduler_info(n_workers=-1)["workers"]:
        assert time.monotonic() < deadline, f"{address} is still on the scheduler"
        time.sleep(0.2)
    now = cluster.wait_for_gpu_workers(2)
    assert address not in now
    assert pid not in client.run(os.getpid, workers=now).values()
    again = dg.map_kernel(busy_double, dg.Out(np.float32, like=x), x, 1)
    np.testing.assert_array_equal(again.compute(), 2 * np.arange(n, dtype=np.float32))


# -- 4. an intermediate that moves between workers ----------------------------

@pytest.mark.parametrize("chunk_kind", ["numpy", "cupy"])
def test_a_chain_whose_intermediate_moves_to_another_worker(cluster, chunk_kind):
    client = cluster.client
    if chunk_kind == "cupy":
        if cluster.simulated:
            pytest.skip("CuPy chunks need a GPU")
        cupy = pytest.importorskip("cupy")
    w1, w2 = cluster.wait_for_gpu_workers(2)
    n = 24 * cluster.chunk
    xn = np.arange(n, dtype=np.int32) - n // 2
    x = da.from_array(xn, chunks=cluster.chunk)
    if chunk_kind == "cupy":  # made on the worker, in its GPU's memory
        x = x.map_blocks(cupy.asarray, dtype=np.int32, meta=cupy.empty((0,), np.int32))
    a = dg.map_kernel(affine, dg.Out(np.int32, like=x), x, dg.offset)
    assert _launching_keys(a)
    a = client.persist(a, workers=[w1])
    wait(a)
    try:
        holders = client.who_has(a)
        assert len(holders) == 24
        assert all(list(ws) == [w1] for ws in holders.values()), holders
        types = client.run(  # tuple keys arrive as lists
            lambda dask_worker, keys: sorted({type(dask_worker.data[tuple(k)]).__module__
                                              .split(".")[0] for k in keys}),
            keys=list(holders), workers=[w1])
        assert types == {w1: [chunk_kind]}, types

        b = dg.map_kernel(twice_minus, dg.Out(np.int32, like=a), a, np.int32(5))
        if chunk_kind == "cupy":  # back to the host on the worker, for the client
            b = b.map_blocks(cupy.asnumpy, dtype=np.int32, meta=np.empty((0,), np.int32))
        result, counts, launching, records = _compute_counting_launches(
            client, b, workers=[w2], allow_other_workers=False)
    finally:
        del a
    expected_a = 3 * xn + np.arange(n, dtype=np.int32) % 7
    np.testing.assert_array_equal(result, 2 * expected_a - 5)
    assert isinstance(result, np.ndarray)
    # Only B launches here (A is read, not computed again), and all of it on w2...
    assert launching == 24 and counts == {w2: 24}, counts
    # ... which fetched A's chunks from w1.
    sources = {ss.get("source") for r in records if r["worker"] == w2
               for ss in r.get("startstops", ()) if ss["action"] == "transfer"}
    assert w1 in sources, f"no transfer from {w1} in the task stream: {sources}"
