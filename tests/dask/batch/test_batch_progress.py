"""Batch progress as events: the job reports its start, each chunk and its end to a
:class:`BatchProgress` and writes nothing itself; a terminal gets a bar, a log plain lines.

Every test runs simulated, on the module's threaded cluster that a subprocess can reach.
"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from kit.batch import write_zarr
from kit.kernels import SAXPY_FILE, SAXPY_SIG, saxpy
from numba import cuda

import daskgpu as dg
from daskgpu._dask.batch import progress as progress_module
from daskgpu._dask.batch import run_batch
from daskgpu._dask.batch.progress import BatchProgress, BatchStart, LineProgress

zarr = pytest.importorskip("zarr")


@dg.jit("void(float64[::1], int64[::1], float64[::1])")
def gather(out, index, x):
    """``out[i] = x[index[i]]`` within a chunk: a bad index fails the chunk."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[index[i]]


class Recorder(BatchProgress):
    """Every event, in order."""

    def __init__(self):
        self.events = []

    def start(self, plan):
        self.events.append(("start", plan))

    def chunk_done(self, chunk):
        self.events.append(("done", chunk))

    def chunk_failed(self, chunk, error):
        self.events.append(("failed", chunk, error))

    def end(self, report):
        self.events.append(("end", report))


def _batch(*argv):
    """``daskgpu batch`` in a subprocess, stderr a pipe; its output as written (a text
    mode pipe would turn carriage returns into newlines)."""
    args = [a for part in argv for a in ([part] if isinstance(part, str) else part)]
    proc = subprocess.run([sys.executable, "-m", "daskgpu", "batch", *args],
                          capture_output=True, timeout=120)
    proc.stdout, proc.stderr = proc.stdout.decode(), proc.stderr.decode()
    return proc


def _workers(client) -> str:
    n = len(client.scheduler_info()["workers"])
    return f"{n} worker{'s' * (n != 1)}"


@pytest.fixture
def saxpy_job(tmp_path):
    """z = 2x + y over 400 elements in 10 chunks, and the command line that computes it."""
    x = np.arange(400, dtype=np.float32)
    inputs = [write_zarr(tmp_path / "x.zarr", x, 40), write_zarr(tmp_path / "y.zarr", x, 40)]
    kernel = tmp_path / "progkern.py"
    kernel.write_text(SAXPY_FILE)
    out = str(tmp_path / "z.zarr")
    # One task a chunk, as the tests here run (grouped, the 10 chunks are one task).
    argv = [f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", "float32:2", "--simulate",
            "--no-group"]
    for p in inputs:
        argv += ["--input", p]
    return {"inputs": inputs, "out": out, "argv": argv + ["--output", f"{out}:float32"]}


def test_the_job_reports_its_events_and_writes_nothing_itself(client, tmp_path, capsys):
    x = np.arange(240, dtype=np.float64)
    index = np.tile(np.arange(30), 8)
    index[95] = 10_000  # chunk 3 fails
    inputs = [write_zarr(tmp_path / "index.zarr", index, 30),
              write_zarr(tmp_path / "x.zarr", x, 30)]
    out = str(tmp_path / "y.zarr")
    run_batch(gather, inputs, [(out, np.float64)], client=client, retries=0, max_chunks=2,
              progress=False)  # 2 chunks written before
    recorder = Recorder()
    report = run_batch(gather, inputs, [(out, np.float64)], client=client, retries=0,
                       max_chunks=5, progress=recorder)
    assert capsys.readouterr().err == ""  # only displays write
    kinds = [e[0] for e in recorder.events]
    assert kinds[0] == "start" and kinds[-1] == "end" and len(kinds) == 7
    plan = recorder.events[0][1]
    assert (plan.kernel, plan.chunks, plan.chunk_shape, plan.shape) == ("gather", 8, (30,),
                                                                          (240,))
    assert (plan.skipped, plan.now, plan.later, plan.simulated) == (2, 5, 1, True)
    assert plan.workers == len(client.scheduler_info()["workers"])
    done = {e[1] for e in recorder.events if e[0] == "done"}
    failed = [e[1:] for e in recorder.events if e[0] == "failed"]
    assert done == set(report.computed) and len(done) == 4
    assert [c for c, _ in failed] == [(3,)] and failed[0][1].startswith("IndexError")
    assert recorder.events[-1][1] is report


def test_a_run_that_stops_early_ends_its_display_without_a_report(client, saxpy_job):
    class Stop(Recorder):
        def chunk_done(self, chunk):
            super().chunk_done(chunk)
            raise KeyboardInterrupt  # as Ctrl-C would, between two chunks

    stop = Stop()
    with pytest.raises(KeyboardInterrupt):
        run_batch(saxpy, saxpy_job["inputs"], [(saxpy_job["out"], np.float32)],
                  scalars=[np.float32(2)], client=client, progress=stop)
    assert [e[0] for e in stop.events] == ["start", "done", "end"]
    assert stop.events[-1][1] is None


def test_cli_without_a_terminal_writes_progress_lines_without_carriage_returns(client,
                                                                               saxpy_job):
    proc = _batch(saxpy_job["argv"], "--scheduler", client.scheduler.address)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr, repr(proc.stderr)
    lines = proc.stderr.split("\n")
    assert lines[0] == (f"batch saxpy: 10 chunks of 40 over 400 on {_workers(client)} "
                        "(simulated); 0 already written, 10 to compute"), proc.stderr
    counts = [line for line in lines if line.startswith("chunks written: ")]
    assert 2 <= len(counts) <= 11, proc.stderr  # every 10%, not every redraw
    assert counts[-1].startswith("chunks written: 10/10 (100%), 10 this run in ")
    assert "10/10 chunks written (10 this run, 0 before)" in proc.stdout


@pytest.mark.parametrize("mode,expect_cr", [("bar", True), ("lines", False), ("none", None)])
def test_cli_progress_option_chooses_the_display(client, saxpy_job, mode, expect_cr):
    proc = _batch(saxpy_job["argv"], "--scheduler", client.scheduler.address, "--progress",
                  mode)
    assert proc.returncode == 0, proc.stderr
    if expect_cr is None:
        assert "chunks written" not in proc.stderr and "batch saxpy" not in proc.stderr
    else:
        assert ("\r" in proc.stderr) is expect_cr, repr(proc.stderr)
        assert "batch saxpy: 10 chunks of 40" in proc.stderr


def test_line_progress_writes_every_share_or_interval_and_at_the_end(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    plan = BatchStart("k", chunks=1000, chunk_shape=(10,), shape=(10000,), skipped=0,
                      now=1000, workers=4)
    log = LineProgress(io.StringIO(), percent=10, seconds=30)
    log.start(plan)
    for chunk in range(1000):
        log.chunk_done((chunk,))
    log.end(dg.BatchReport(outputs=("z",), chunks=1000,
                           computed=tuple((c,) for c in range(1000))))
    lines = log.file.getvalue().splitlines()
    assert len(lines) == 1 + 9 + 1  # the headline, every 10% but the last, the end
    assert lines[1] == "chunks written: 100/1000 (10%), 100 this run"

    slow = LineProgress(io.StringIO(), percent=50, seconds=30)
    slow.start(plan)
    for chunk in range(10):
        clock[0] += 31  # each chunk more than the interval after the last line
        slow.chunk_failed((chunk,), "IndexError: out of bounds")
    assert slow.file.getvalue().splitlines()[-1] == ("chunks written: 0/1000 (0%), 0 this "
                                                     "run, 10 failed")
    assert len(slow.file.getvalue().splitlines()) == 1 + 10


def test_one_chunk_is_one_chunk(client, tmp_path):
    x = np.arange(40, dtype=np.float32)
    inputs = [write_zarr(tmp_path / "x.zarr", x, 40), write_zarr(tmp_path / "y.zarr", x, 40)]
    recorder = Recorder()
    report = run_batch(saxpy, inputs, [(str(tmp_path / "z.zarr"), np.float32)],
                       scalars=[np.float32(2)], client=client, progress=recorder)
    assert report.summary().startswith("1/1 chunk written (1 this run, 0 before)")
    assert recorder.events[0][1].headline().startswith(
        f"batch saxpy: 1 chunk of 40 over 40 on {_workers(client)} ")


def test_progress_refuses_what_it_cannot_show():
    with pytest.raises(TypeError, match="progress must be True, False, one of 'auto', 'bar', "
                                        "'lines', 'none' or a daskgpu BatchProgress"):
        run_batch(saxpy, ["x.zarr"], ["z.zarr"], progress="verbose")
