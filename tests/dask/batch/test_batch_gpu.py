"""On a GPU: batch and map_kernel under load with flat memory, and a worker killed mid-job.

Each test prints its figures (chunks, seconds, memory before/after) for the record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._dask.batch import run_batch
from daskgpu._dask.batch.ledger import done_chunks

pytestmark = pytest.mark.gpu
zarr = pytest.importorskip("zarr")
from distributed import Client  # noqa: E402

MiB = 1 << 20


@dg.jit("void(float64[::1], float64, float64[::1])")
def affine(out, a, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0


@pytest.fixture(scope="module")
def client():
    with dg.LocalGPUCluster(simulate=False, devices=[0], dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        yield c


def _device_used():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                          "nounits", "-i", "0"], capture_output=True, text=True)
    return int(out.stdout.split()[0]) * MiB if out.returncode == 0 else 0


def _rss(client):
    import psutil

    workers = sum(client.run(lambda: __import__("psutil").Process().memory_info().rss).values())
    return psutil.Process().memory_info().rss, workers


class _Sampler:
    """Client RSS, worker RSS and device memory, sampled every 0.25 s while a job runs."""

    def __init__(self, client):
        self.client, self.samples, self._stop = client, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), *_rss(self.client), _device_used()))
            except Exception:  # a worker being replaced
                pass
            self._stop.wait(0.25)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def peaks(self):
        """The peak of each series: client RSS, worker RSS, device memory in use."""
        assert len(self.samples) >= 4, "the job was too short to sample"
        return [max(s[i] for s in self.samples) for i in (1, 2, 3)]


def _flat(name, first, second, limits=(64 * MiB, 128 * MiB, 64 * MiB)):
    """The second run of a job peaks no higher than the first: memory held, not leaked.

    A first run may raise a process's high-water mark (allocator arenas, pools
    filling to their bounds); a leak shows as a second run that climbs again.
    """
    growth = [b - a for a, b in zip(first, second)]
    print(f"{name}: peaks MiB run 1 {[p // MiB for p in first]}, run 2 "
          f"{[p // MiB for p in second]} (client RSS, worker RSS, device)")
    for what, g, limit in zip(("client RSS", "worker RSS", "device"), growth, limits):
        assert g <= limit, f"{name}: {what} peaked {g / MiB:.1f} MiB higher in the second run"


def test_batch_of_2000_chunks_holds_memory_flat_and_is_exact(client, tmp_path):
    n, chunk = 2000, 4096
    x = np.arange(n * chunk, dtype=np.float64)
    np.save(tmp_path / "x.npy", x)
    peaks = []
    for run in ("z1", "z2"):  # two jobs alike, to new outputs
        out = str(tmp_path / f"{run}.zarr")
        t0 = time.perf_counter()
        with _Sampler(client) as sampler:
            report = run_batch(affine, [str(tmp_path / "x.npy")], [out], scalars=[2.0],
                               chunks=chunk, client=client, progress=False)
        print(f"batch: {report.chunks} chunks in {time.perf_counter() - t0:.1f} s")
        assert report.complete and report.chunks == n and len(report.computed) == n
        np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], 2.0 * x + 1.0)
        peaks.append(sampler.peaks())
    _flat("batch", *peaks)
    again = run_batch(affine, [str(tmp_path / "x.npy")], [out], scalars=[2.0], chunks=chunk,
                      client=client, progress=False)
    assert again.computed == () and len(again.skipped) == n  # every chunk checked, kept


def test_map_kernel_of_5000_chunks_holds_memory_flat_and_is_exact(client):
    import dask.array as da

    n, chunk = 5000, 2048
    x = da.arange(n * chunk, chunks=chunk, dtype=np.float64)
    y = dg.map_kernel(affine, dg.Out(np.float64, like=x), 2.0, x)
    assert y.numblocks == (n,)
    expected = 2.0 * np.arange(n * chunk, dtype=np.float64) + 1.0
    peaks = []
    for _ in range(2):
        t0 = time.perf_counter()
        with _Sampler(client) as sampler:
            total, picks = client.compute([y.sum(), y[::4099]], sync=True)
        print(f"map_kernel: {n} chunks in {time.perf_counter() - t0:.1f} s")
        assert total == expected.sum()  # integers below 2**53: exact
        np.testing.assert_array_equal(picks, expected[::4099])
        peaks.append(sampler.peaks())
    _flat("map_kernel", *peaks)


def test_batch_finishes_exactly_when_its_worker_is_killed_mid_job(client, tmp_path):
    n, chunk = 600, 8192
    x = np.arange(n * chunk, dtype=np.float64)
    np.save(tmp_path / "x.npy", x)
    out = str(tmp_path / "z.zarr")
    [pid] = client.run(os.getpid).values()
    killed = {}

    def kill_midway():
        deadline = time.monotonic() + 120
        while len(done_chunks(out)) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        killed["at"] = len(done_chunks(out))
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_midway, daemon=True)
    killer.start()
    report = run_batch(affine, [str(tmp_path / "x.npy")], [out], scalars=[2.0], chunks=chunk,
                       client=client, progress=False, retries=2)
    killer.join()
    print(f"worker kill: killed with {killed['at']}/{n} chunks written; "
          f"{len(report.computed)} computed, failed {len(report.failed)}")
    assert 0 < killed["at"] < n, "the kill did not land mid-job"
    if not report.complete:  # chunks lost with the worker: the rerun computes only those
        report = run_batch(affine, [str(tmp_path / "x.npy")], [out], scalars=[2.0],
                           chunks=chunk, client=client, progress=False)
    assert report.complete
    assert [pid] != list(client.run(os.getpid).values())  # the nanny started a new worker
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], 2.0 * x + 1.0)


AFFINE_MODULE = '''
from numba import cuda

def affine(out, a, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0
'''


@pytest.mark.slow
def test_cli_on_its_own_gpu_cluster_stops_on_sigterm_and_resumes(tmp_path):
    # The local cluster daskgpu batch starts on GPUs (TLS, workers that ignore Ctrl-C
    # through their preload), stopped as SLURM's time limit would stop it.
    pytest.importorskip("cryptography")  # its TLS credentials (the batch extra)
    import sys

    import psutil

    n, chunk = 3000, 1 << 14
    x = np.arange(n * chunk, dtype=np.float64)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "gpukern.py").write_text(AFFINE_MODULE)
    out = str(tmp_path / "z.zarr")
    argv = [sys.executable, "-m", "daskgpu", "batch", f"{tmp_path / 'gpukern.py'}:affine",
            "--sig", "void(float64[::1], float64, float64[::1])", "--scalar", "2.0",
            "--input", str(tmp_path / "x.npy"), "--output", f"{out}:float64",
            "--chunks", str(chunk), "--no-simulate"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while (not os.path.isdir(out) or len(done_chunks(out)) < 20) and proc.poll() is None:
        assert time.monotonic() < deadline, "no 20 chunks written in 180 s"
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    children = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    written = len(done_chunks(out))
    print(f"gpu batch SIGTERM: {written}/{n} chunks written; stderr:\n{err}")
    assert proc.returncode == 143, err
    assert f"daskgpu batch interrupted: {written}/{n} chunks written" in err, err
    assert "\r" not in err and "Traceback" not in err, err
    time.sleep(2)
    assert not [c.pid for c in children if c.is_running()
                and c.status() != psutil.STATUS_ZOMBIE], "worker processes left running"
    rerun = subprocess.run([*argv, "--progress", "none"], capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{n}/{n} chunks written ({n - written} this run, {written} before)" in rerun.stdout
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], 2.0 * x + 1.0)


@pytest.mark.slow
def test_grouped_batch_on_a_gpu_writes_what_one_task_a_chunk_writes(client, tmp_path):
    from distributed import get_task_stream

    from daskgpu._dask.batch.ledger import read_marker

    n, chunk = 200, 1 << 14  # chunks of 128 KiB; 16 bytes an element with the output
    x = np.random.default_rng(0).random(n * chunk)
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=x.shape, chunks=(chunk,),
                        dtype=x.dtype)
    z[...] = x
    outs, launches = {}, {}
    for group in ("8 MiB", False):  # 8 MiB: 32 chunks a task
        out = str(tmp_path / f"z{group}.zarr")
        with get_task_stream(client) as ts:
            t0 = time.perf_counter()
            report = run_batch(affine, [str(tmp_path / "x.zarr")], [(out, np.float64)],
                               scalars=[2.0], order="out,scalar,in", client=client,
                               progress=False, group=group)
            seconds = time.perf_counter() - t0
        assert report.complete
        launches[group] = sum(1 for r in ts.data if str(r["key"][0]).startswith("affine-"))
        outs[group] = out
        print(f"gpu batch group={group!r}: {n} chunks in {launches[group]} launches, "
              f"{seconds:.2f} s")
    assert launches["8 MiB"] == -(-n // 32) and launches[False] == n
    a, b = (zarr.open_array(outs[g], mode="r")[:] for g in ("8 MiB", False))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, 2.0 * x + 1.0)
    for c in range(n):
        ma, mb = read_marker(outs["8 MiB"], (c,)), read_marker(outs[False], (c,))
        assert (ma["inputs"], ma["output"]) == (mb["inputs"], mb["output"]), c
