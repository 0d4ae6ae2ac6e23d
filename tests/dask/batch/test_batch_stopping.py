"""How a batch run stops: SIGTERM as Ctrl-C (SLURM's time limit), Ctrl-C while the local
cluster starts acted on rather than dropped, and a lock file that cannot be removed
reported without losing the finished run.

The command line runs in a subprocess of its own session, so that a signal can reach its
whole process group as a terminal's Ctrl-C or SLURM's SIGTERM does. Runs with
``--scheduler`` use the module's threaded simulated cluster; the others start the local
cluster ``daskgpu batch`` makes for itself (a few seconds each).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import psutil
import pytest
from kit.batch import write_zarr
from kit.kernels import SAXPY_FILE, SAXPY_SIG, saxpy

from daskgpu._cli.batch import main
from daskgpu._dask.batch import lock as lock_module
from daskgpu._dask.batch import run_batch
from daskgpu._dask.batch.ledger import done_chunks
from daskgpu._dask.batch.lock import lock_path

zarr = pytest.importorskip("zarr")

TIMEOUT = 120  # seconds, for each wait on a subprocess


@pytest.fixture
def job(tmp_path):
    """z = 2x + y over 4000 elements in 20 chunks; the command line that computes it."""
    x = np.arange(4000, dtype=np.float32)
    y = np.ones(4000, np.float32)
    inputs = [write_zarr(tmp_path / "x.zarr", x, 200), write_zarr(tmp_path / "y.zarr", y, 200)]
    kernel = tmp_path / "stopkern.py"
    kernel.write_text(SAXPY_FILE)
    # One task a chunk, so that a signal comes while chunks are still to be written.
    argv = [f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", "float32:2", "--simulate",
            "--no-group"]
    for p in inputs:
        argv += ["--input", p]
    out = str(tmp_path / "z.zarr")
    return {"inputs": inputs, "out": out, "expected": 2 * x + y,
            "argv": argv + ["--output", f"{out}:float32"]}


def _start(argv):
    """``daskgpu batch ARGV`` in a session of its own, its stderr a pipe (no terminal)."""
    return subprocess.Popen([sys.executable, "-m", "daskgpu", "batch", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(proc, condition, what):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (status {proc.returncode}) before {what}:\n{out}{err}")
        assert time.monotonic() < deadline, f"no {what} in {TIMEOUT} s"
        time.sleep(0.02)


def _written(out, at_least):
    return lambda: os.path.isdir(out) and len(done_chunks(out)) >= at_least


def _alive(processes):
    return [p.pid for p in processes
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _no_process_left(processes):
    deadline = time.monotonic() + 30
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(processes)


def _resume_is_exact(job, client, before):
    from daskgpu._cli.batch import load_kernel

    kernel = load_kernel(job["argv"][0], [SAXPY_SIG])  # the same kernel, compiled here
    report = run_batch(kernel, job["inputs"], [(job["out"], np.float32)],
                       scalars=[np.float32(2)], client=client, progress=False)
    assert set(report.skipped) == before
    assert set(report.computed) == set(np.ndindex(20)) - before
    np.testing.assert_array_equal(zarr.open_array(job["out"], mode="r")[:], job["expected"])


# -- SIGTERM ------------------------------------------------------------------------------
def test_sigterm_with_a_scheduler_stops_as_ctrl_c_does(client, job):
    proc = _start([*job["argv"], "--scheduler", client.scheduler.address])
    _wait_for(proc, _written(job["out"], 3), "3 chunks written")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 143, err
    assert "daskgpu batch interrupted:" in err and "run the same job again" in err, err
    assert "Traceback" not in err, err
    assert not os.path.exists(lock_path(job["out"]))
    deadline = time.monotonic() + 30  # a launch running at SIGTERM still records its chunk
    while any(client.run(lambda dask_worker: len(dask_worker.state.executing)).values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Nothing of the run is left on the cluster: its tasks are gone from the scheduler.
    while client.run_on_scheduler(
            lambda dask_scheduler: [k for k in dask_scheduler.tasks if "saxpy" in str(k)
                                    or "batch-" in str(k)]):
        assert time.monotonic() < deadline, "the run's tasks stay on the scheduler"
        time.sleep(0.05)
    _resume_is_exact(job, client, done_chunks(job["out"]))


@pytest.mark.parametrize("grouped", [False, True], ids=["one-task-a-chunk", "grouped"])
def test_ctrl_c_to_the_group_with_a_scheduler_says_one_line_and_exits_130(client, job,
                                                                           grouped):
    # A terminal's Ctrl-C reaches the run's whole process group: it died by the signal,
    # with nothing on stderr.
    argv = [a for a in job["argv"] if not (grouped and a == "--no-group")]
    proc = _start([*argv, "--scheduler", client.scheduler.address, "--no-progress"])
    _wait_for(proc, _written(job["out"], 1 if grouped else 3), "chunks written")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err
    (line,) = err.splitlines()
    assert line.startswith("daskgpu batch interrupted:") and "run the same job again" in line
    assert not os.path.exists(lock_path(job["out"]))


@pytest.mark.parametrize("signum,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_whole_group_stops_the_local_cluster_cleanly(client, job, signum,
                                                                     status):
    # As SLURM's time limit (SIGTERM) or a terminal's Ctrl-C (SIGINT) reach every process
    # of the job: the workers as well as the run.
    proc = _start(job["argv"])
    _wait_for(proc, _written(job["out"], 3), "3 chunks written")
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the local cluster runs its workers in processes"
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == status, err
    assert "daskgpu batch interrupted:" in err and "run the same job again" in err, err
    # Workers ignore Ctrl-C (their nanny closes them): none dies with a traceback.
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _no_process_left(children), f"left running: {_alive(children)}"
    assert not os.path.exists(lock_path(job["out"]))
    _resume_is_exact(job, client, done_chunks(job["out"]))


def _worker_processes(me):
    """The worker processes ``me`` has spawned so far (not other children, which may come
    before the cluster starts)."""
    found = []
    for child in me.children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_ctrl_c_while_the_local_cluster_starts_is_acted_on_once_it_is_up(job):
    proc = _start(job["argv"])
    me = psutil.Process(proc.pid)
    _wait_for(proc, lambda: _worker_processes(me), "a worker process")  # the cluster starts
    children = me.children(recursive=True)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    # Before, Ctrl-C was ignored while the cluster started: the run went on, exit 0.
    assert proc.returncode == 130, err
    assert "daskgpu batch interrupted: 0/20 chunks written" in err, err
    assert "Traceback" not in err, err
    assert _no_process_left(children), f"left running: {_alive(children)}"
    assert not os.path.exists(lock_path(job["out"]))


# -- a lock file that cannot be removed ---------------------------------------------------
@pytest.fixture
def lock_stays(monkeypatch):
    """Removing a lock file fails as in a folder turned read-only (root may write there)."""
    unlink = os.unlink

    def refuse_locks(path, *args, **kwargs):
        if str(path).endswith(".daskgpu-lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(lock_module.os, "unlink", refuse_locks)


def test_a_lock_file_left_behind_is_a_warning_and_the_report_is_returned(client, job,
                                                                         lock_stays):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_batch(saxpy, job["inputs"], [(job["out"], np.float32)],
                           scalars=[np.float32(2)], client=client, progress=False)
    assert report.complete and len(report.computed) == 20
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert any("could not remove the lock file" in m and "blocks no later run" in m
               for m in messages), messages
    # The file left behind blocks nothing: the next run takes the lock and resumes.
    assert os.path.exists(lock_path(job["out"]))
    with pytest.warns(RuntimeWarning, match="could not remove the lock file"):
        again = run_batch(saxpy, job["inputs"], [(job["out"], np.float32)],
                          scalars=[np.float32(2)], client=client, progress=False)
    assert len(again.skipped) == 20


def test_cli_with_a_lock_file_left_behind_prints_the_summary_and_exits_0(client, job,
                                                                         lock_stays, capsys):
    argv = [*job["argv"], "--scheduler", client.scheduler.address, "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "20/20 chunks written (20 this run, 0 before)" in captured.out
    lines = [line for line in captured.err.splitlines() if "lock file" in line]
    assert len(lines) == 1 and lines[0].startswith("daskgpu batch: warning: could not "
                                                   "remove the lock file"), captured.err


@pytest.mark.skipif(os.geteuid() == 0, reason="root removes files from read-only folders")
def test_a_lock_file_in_a_folder_turned_read_only(client, job, tmp_path):
    # The output's folder turns read-only while the run writes into the output itself.
    class ReadOnlyAtStart:
        def start(self, plan):
            os.chmod(tmp_path, 0o555)

    from daskgpu._dask.batch.progress import BatchProgress

    progress = type("ReadOnly", (ReadOnlyAtStart, BatchProgress), {})()
    try:
        with pytest.warns(RuntimeWarning, match="could not remove the lock file"):
            report = run_batch(saxpy, job["inputs"], [(job["out"], np.float32)],
                               scalars=[np.float32(2)], client=client, progress=progress)
    finally:
        os.chmod(tmp_path, 0o755)
    assert report.complete


#: Makes each worker process spend its first seconds importing, as a cold one does.
SLOW_WORKER_START = """
import sys, time
if any("spawn_main" in arg for arg in sys.orig_argv):
    time.sleep(3)
"""


@pytest.mark.slow
def test_ctrl_c_to_the_whole_group_while_a_worker_imports_prints_only_the_one_line(
        job, tmp_path):
    # A terminal's Ctrl-C reaches every process of the group: a worker still importing,
    # before its preload ignores SIGINT, died with a KeyboardInterrupt traceback.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_WORKER_START)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, "-m", "daskgpu", "batch", *job["argv"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    me = psutil.Process(proc.pid)
    _wait_for(proc, lambda: _worker_processes(me), "a worker process")
    time.sleep(0.5)  # into its start's imports, three seconds long
    children = me.children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err
    assert err == ("daskgpu batch interrupted: 0/20 chunks written; run the same job again "
                   "to compute only the rest\n"), err
    assert _no_process_left(children), f"left running: {_alive(children)}"
    assert not os.path.exists(lock_path(job["out"]))


def test_ctrl_c_before_the_job_starts_is_one_line_too(job, tmp_path, capsys):
    # As when Ctrl-C comes while the kernel's module is imported: it printed nothing.
    kernel = tmp_path / "interrupted.py"
    kernel.write_text("raise KeyboardInterrupt\n")
    argv = [f"{kernel}:saxpy", *job["argv"][1:]]
    assert main(argv) == 130
    assert capsys.readouterr().err == ("daskgpu batch interrupted before the job started: "
                                       "nothing was written\n")
    assert not os.path.exists(job["out"])
