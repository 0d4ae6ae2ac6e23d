"""One writer per batch output: a second run is refused while one is alive, a crashed run's
lock blocks nothing, and a job trusts only the chunks its own instance wrote.

Every test runs simulated, on one threaded cluster that a subprocess can also reach.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from kit.batch import write_zarr
from kit.kernels import SAXPY_FILE, SAXPY_SIG, saxpy

from daskgpu._cli.batch import main
from daskgpu._dask.batch import BatchError, run_batch
from daskgpu._dask.batch.ledger import LEDGER, done_chunks
from daskgpu._dask.batch.lock import OutputLock, lock_path
from daskgpu._dask.batch.store import ChunkWriter

zarr = pytest.importorskip("zarr")


@pytest.fixture
def job(tmp_path):
    """z = a x + y over 4000 elements in 20 chunks: long enough to overlap a second run."""
    x = np.arange(4000, dtype=np.float32)
    y = np.ones(4000, np.float32)
    return {"inputs": [write_zarr(tmp_path / "x.zarr", x, 200), write_zarr(tmp_path / "y.zarr", y, 200)],
            "out": str(tmp_path / "z.zarr"), "x": x, "y": y}


def _run(job, client, a, **kw):
    return run_batch(saxpy, job["inputs"], [(job["out"], np.float32)], scalars=[np.float32(a)],
                     client=client, progress=False, **kw)


def _result(job):
    return zarr.open_array(job["out"], mode="r")[:]


def _argv(tmp_path, job, a, *extra):
    kernel = tmp_path / "writerkern.py"
    kernel.write_text(SAXPY_FILE)
    # One task a chunk, so that a run is still writing when another starts.
    argv = [f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", f"float32:{a}", "--no-progress",
            "--no-group"]
    for p in job["inputs"]:
        argv += ["--input", p]
    return argv + ["--output", f"{job['out']}:float32", *extra]


# -- a second run while one writes -----------------------------------------------------
def test_second_run_on_a_busy_output_is_refused_and_the_first_finishes_exact(
        client, job, tmp_path, capsys):
    """The issue's case: a second run with other scalars and --no-resume while one writes."""
    address = ["--scheduler", client.scheduler.address, "--simulate"]
    first = subprocess.Popen([sys.executable, "-m", "daskgpu", "batch",
                              *_argv(tmp_path, job, 2, *address)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not done_chunks(job["out"]) and first.poll() is None:
            assert time.monotonic() < deadline, "the first run wrote no chunk"
            time.sleep(0.02)
        assert first.poll() is None, "the first run ended before the second started"
        with pytest.raises(BatchError, match=rf"another daskgpu batch run \(pid {first.pid} "
                                             r"on .*\) is writing .*z\.zarr'"):
            _run(job, client, 3, resume=False)
        assert main(_argv(tmp_path, job, 3, *address, "--no-resume")) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "another daskgpu batch run" in err, err
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "20/20 chunks written" in out
    np.testing.assert_array_equal(_result(job), 2 * job["x"] + job["y"])
    assert not os.path.exists(lock_path(job["out"]))  # removed when the run ended
    assert main(_argv(tmp_path, job, 2, *address)) == 0  # the lock is free again
    assert "20/20 chunks written (0 this run, 20 before)" in capsys.readouterr().out


def test_a_killed_runs_lock_blocks_nothing(client, job):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, sys
        from daskgpu._dask.batch.lock import OutputLock
        OutputLock({job["out"]!r}, "crashed").acquire()
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert holder.wait(timeout=30) == -signal.SIGKILL
    assert os.path.exists(lock_path(job["out"]))  # left behind, but no longer held
    report = _run(job, client, 2)
    assert report.complete
    np.testing.assert_array_equal(_result(job), 2 * job["x"] + job["y"])


@pytest.mark.slow
def test_without_flock_a_dead_holder_is_taken_over_and_a_live_one_refused(tmp_path,
                                                                           monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    out = str(tmp_path / "z.zarr")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    with open(lock_path(out), "w") as f:
        json.dump({"host": os.uname().nodename, "pid": int(dead.stdout), "job": "gone"}, f)
    with OutputLock(out, "mine"):  # the holder's process is gone: a stale lock
        with pytest.raises(BatchError, match=rf"pid {os.getpid()} .*if no run is alive "
                                             r"there, remove"):
            OutputLock(out, "other").acquire()
    assert not os.path.exists(lock_path(out))


# -- chunks of another job instance -----------------------------------------------------
def test_chunks_left_by_another_instance_are_recomputed(client, job, tmp_path):
    """A first run's late writes (its markers and data) in the output a second run
    recreated: the second job, resumed, must not count them as its own."""
    assert _run(job, client, 2).complete
    first = tmp_path / "first.zarr"
    shutil.copytree(job["out"], first)
    assert _run(job, client, 3, resume=False, max_chunks=4).computed == tuple(
        (i,) for i in range(4))
    for i in range(4, 20):  # what the first run's orphaned tasks would have written
        shutil.copy(first / "c" / str(i), os.path.join(job["out"], "c", str(i)))
        shutil.copy(first / LEDGER / str(i), os.path.join(job["out"], LEDGER, str(i)))
    assert done_chunks(job["out"]) == {(i,) for i in range(20)}

    report = _run(job, client, 3)
    assert report.skipped == tuple((i,) for i in range(4))
    assert report.computed == tuple((i,) for i in range(4, 20)) and report.complete
    np.testing.assert_array_equal(_result(job), 3 * job["x"] + job["y"])


def test_a_task_of_a_replaced_instance_writes_nothing(client, job):
    assert _run(job, client, 2, max_chunks=1).computed == ((0,),)
    before = _result(job)
    stale = ChunkWriter([job["out"]], (200,), ["an-older-instance"])
    with pytest.raises(BatchError, match="recreated by another batch job"):
        stale(np.full(200, 7, np.float32), block_id=(1,))
    np.testing.assert_array_equal(_result(job), before)
    assert done_chunks(job["out"]) == {(0,)}


def test_a_write_in_flight_when_its_output_is_recreated_never_lands_in_the_new_one(
        client, job, monkeypatch):
    # A task of a run whose client died can outlive it on the workers. Here one has
    # checked its job's nonce and is about to write when a new run recreates the output.
    import contextlib
    import threading

    from daskgpu._dask.batch import store
    from daskgpu._dask.batch.ledger import read_job

    _run(job, client, 2, max_chunks=1)
    stale = ChunkWriter([job["out"]], (200,), [read_job(job["out"])["nonce"]])
    checked, go = threading.Event(), threading.Event()
    opening, locking = store._open_output, store.writers
    swap_wanted, swapping = threading.Event(), threading.Event()

    def held_open(path, mode="r+"):
        if threading.current_thread().name == "stale":
            checked.set()
            go.wait(timeout=60)
        return opening(path, mode)

    @contextlib.contextmanager
    def watched(path, exclusive=False):
        if exclusive:
            swap_wanted.set()
        with locking(path, exclusive):
            if exclusive:
                swapping.set()
            yield

    monkeypatch.setattr(store, "_open_output", held_open)
    monkeypatch.setattr(store, "writers", watched)
    writer = threading.Thread(name="stale", daemon=True,
                              target=lambda: stale(np.full(200, 7, np.float32), block_id=(1,)))
    writer.start()
    assert checked.wait(timeout=60)
    rerun = threading.Thread(daemon=True, target=lambda: _run(job, client, 3, resume=False))
    rerun.start()
    assert swap_wanted.wait(timeout=60)
    if swapping.wait(timeout=1.0):  # nothing held the swap back: let the new run finish
        rerun.join(timeout=120)
    go.set()  # the stale task writes now
    writer.join(timeout=60)
    rerun.join(timeout=120)
    assert not rerun.is_alive()
    np.testing.assert_array_equal(_result(job), 3 * job["x"] + job["y"])
    assert len(done_chunks(job["out"])) == 20
