"""``daskgpu batch`` calls a kernel in the order it is told, says so when the order does not
fit, starts no cluster when nothing is left to compute, and says in one line that it lost
its scheduler.

Simulated: one threaded cluster that subprocesses can reach, plus, for the lost scheduler,
a scheduler and a worker of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from kit.batch import batch_without_a_cluster

import daskgpu as dg
from daskgpu._cli.batch import main
from daskgpu._dask.batch import BatchError, run_batch
from daskgpu._dask.batch.ledger import done_chunks

zarr = pytest.importorskip("zarr")

KERNELS = '''
from numba import cuda

def scale_last(out, x, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i]

def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]
'''


@pytest.fixture
def data(tmp_path):
    x = np.arange(400, dtype=np.float32)
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=x.shape, chunks=40,
                        dtype=x.dtype)
    z[...] = x
    (tmp_path / "orderkern.py").write_text(KERNELS)
    return {"x": x, "input": str(tmp_path / "x.zarr"), "out": str(tmp_path / "z.zarr"),
            "kernels": str(tmp_path / "orderkern.py")}


def _argv(data, kernel, *extra):
    return [f"{data['kernels']}:{kernel}", "--input", data["input"], "--output", data["out"],
            "--scalar", "float32:3", "--no-progress", *extra]


# -- the argument order ---------------------------------------------------------------
def test_a_scalar_last_kernel_runs_with_order_and_is_named_without(client, data, capsys):
    address = ["--scheduler", client.scheduler.address, "--simulate"]
    assert main(_argv(data, "scale_last", *address)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "calls it as (out, scalar, in)" in err and "scale_last(out, x, a)" in err
    assert "--order" in err
    assert not os.path.exists(data["out"])  # refused before anything was written

    assert main(_argv(data, "scale_last", *address, "--order", "out,in,scalar")) == 0
    np.testing.assert_array_equal(zarr.open_array(data["out"], mode="r")[:], 3 * data["x"])


def test_run_batch_takes_the_order(client, data):
    sys.path.insert(0, os.path.dirname(data["kernels"]))
    try:
        from orderkern import scale_last
    finally:
        sys.path.pop(0)
    kernel = dg.jit(scale_last)
    with pytest.raises(BatchError, match=r"calls it as \(out, scalar, in\).*order="):
        run_batch(kernel, [data["input"]], [data["out"]], scalars=[np.float32(3)],
                  client=client, progress=False)
    report = run_batch(kernel, [data["input"]], [data["out"]], scalars=[np.float32(3)],
                       order=["out", "in", "scalar"], client=client, progress=False)
    assert report.complete
    np.testing.assert_array_equal(zarr.open_array(data["out"], mode="r")[:], 3 * data["x"])


@pytest.mark.parametrize("order,message", [
    ("out,inp,scalar", "'inp' is not out, in or scalar"),
    ("out,in", "names 1 out, 1 in and 0 scalar, but the job has 1 output(s), 1 input(s) "
               "and 1 scalar(s)"),
])
def test_a_wrong_order_exits_2_in_one_line(data, capsys, order, message):
    assert main(_argv(data, "scale_last", "--simulate", "--order", order)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


# -- nothing left to compute: no cluster ------------------------------------------------
def test_a_rerun_with_nothing_left_starts_no_cluster(client, data):
    # One grouping for both runs: this process maps one chunk a launch, the subprocess
    # would group them by default, and a chunk launched otherwise is computed again.
    argv = _argv(data, "scale_last", "--order", "out,in,scalar", "--simulate", "--no-group")
    assert main([*argv, "--scheduler", client.scheduler.address]) == 0
    proc = batch_without_a_cluster(argv)
    assert proc.returncode == 0, proc.stderr
    assert "10/10 chunks written (0 this run, 10 before)" in proc.stdout

    zarr.open_array(data["input"], mode="r+")[5] = -1  # now one chunk is stale
    proc = batch_without_a_cluster(argv)
    assert proc.returncode == 1 and "a cluster was started" in proc.stderr


# -- the scheduler lost mid-run ---------------------------------------------------------
def _start(args, env=None):
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def test_a_lost_scheduler_is_one_line_and_the_rerun_resumes(client, data, tmp_path):
    x = np.arange(8000, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.ones_like(x))
    scheduler_file = str(tmp_path / "scheduler.json")
    scheduler = _start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                        "0", "--no-dashboard", "--scheduler-file", scheduler_file])
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(scheduler_file):
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        worker = _start(["daskgpu", "worker", "--scheduler-file", scheduler_file,
                         "--nthreads", "1"], env=dict(os.environ, DASK_DASKGPU__SIMULATE="1"))
        argv = [f"{data['kernels']}:saxpy", "--scalar", "float32:2", "--no-progress",
                "--input", str(tmp_path / "x.npy"), "--input", str(tmp_path / "y.npy"),
                "--output", data["out"], "--chunks", "100", "--simulate",
                "--no-group"]  # one task a chunk: grouped, the 80 chunks are one task
        batch = subprocess.Popen([sys.executable, "-m", "daskgpu", "batch", *argv,
                                  "--scheduler-file", scheduler_file],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while len(done_chunks(data["out"])) < 3 and batch.poll() is None:
            assert time.monotonic() < deadline, "the batch wrote no chunks"
            time.sleep(0.05)
        scheduler.send_signal(signal.SIGKILL)
        out, err = batch.communicate(timeout=120)
    finally:
        _stop(scheduler)
        if worker is not None:
            _stop(worker)
    assert batch.returncode == 1, (out, err)
    assert "lost the scheduler at tcp://127.0.0.1:" in err and "rerun" in err, err
    assert "Traceback" not in err, err
    written = done_chunks(data["out"])
    assert 3 <= len(written) < 80

    assert main([*argv, "--scheduler", client.scheduler.address]) == 0  # resumes
    np.testing.assert_array_equal(zarr.open_array(data["out"], mode="r")[:], 2 * x + 1)
