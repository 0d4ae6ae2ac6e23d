"""deploy/slurm/daskgpu.sbatch under a real SLURM, with simulated workers.

The ``slurm`` fixture (tests/deploy/conftest.py) gives a SLURM: a private one-node
cluster it starts where slurmctld, slurmd and munged are installed and the tests run
as root, or this machine's with ``DASKGPU_TEST_SLURM=system``; without one, these
tests skip. The batch script runs unchanged; the command line takes back its GPU
request (``--gres=none``) and its size (one node, one CPU), and
``DASK_DASKGPU__SIMULATE=1`` makes the workers and the client simulate. The job
script is tests/deploy/slurm_job.py. The last test runs deploy/slurm/jobqueue_example.py
where its jobs cannot start. About a minute on two cores.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SBATCH = REPO / "deploy" / "slurm" / "daskgpu.sbatch"
JOB = pathlib.Path(__file__).with_name("slurm_job.py")

pytestmark = pytest.mark.slurm

# What a clean run never prints: a collision on a port, a worker that lost its
# scheduler, any Python traceback, srun's complaints. (It does print slurmstepd's
# "*** STEP ... CANCELLED ***" line when the batch script stops the workers' step.)
NOISE = ("Address already in use", "CommClosedError", "Traceback", "srun: error")


@pytest.fixture(scope="module")
def job_env(tmp_path_factory):
    """The environment jobs run in: this interpreter and this checkout first on PATH."""
    tmp = tmp_path_factory.mktemp("jobs")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, argv in (("python", ""), ("dask", "-m dask"), ("daskgpu", "-m daskgpu")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {argv} "$@"\n')
        shim.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return tmp, {"PATH": path, "PYTHONPATH": pythonpath, "TMPDIR": str(tmp),
                 "DASK_DASKGPU__SIMULATE": "1"}


def submit(slurm, tmp, name, env, *job_args):
    """``sbatch daskgpu.sbatch slurm_job.py ...`` as one simulated node; return the job id."""
    env = {**env, "DASKGPU_SCHEDULER_FILE": str(tmp / f"{name}.scheduler.json")}
    return slurm.sbatch(
        "--gres=none", "--nodes=1", "--cpus-per-task=1", "--time=5", f"--job-name={name}",
        f"--chdir={tmp}", f"--output={tmp / name}.out",
        str(SBATCH), str(JOB), *map(str, job_args), env=env)


def _seconds(runtime: str) -> int:
    """``scontrol``'s RunTime, ``[D-]HH:MM:SS``, in seconds."""
    days, _, hms = runtime.rpartition("-")
    h, m, s = map(int, hms.split(":"))
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


def test_two_jobs_on_one_node_map_a_kernel_and_clean_up_quietly(slurm, job_env):
    tmp, env = job_env
    meet = tmp / "meet"
    meet.mkdir()
    t0 = time.monotonic()
    ids = {name: submit(slurm, tmp, name, env, tmp / f"{name}.json", meet, 2)
           for name in ("job-a", "job-b")}
    jobs = slurm.wait(list(ids.values()))
    wall = time.monotonic() - t0
    results = {}
    for name, job_id in ids.items():
        job, log = jobs[job_id], (tmp / f"{name}.out").read_text()
        print(f"{name}: job {job_id} {job['JobState']} exit {job['ExitCode']} "
              f"run {job['RunTime']} on {job['NodeList']}")
        assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", log
        assert "slurm_job: map_kernel result checked" in log
        assert "daskgpu worker: daskgpu.simulate is on; 1 simulated worker" in log
        for noise in NOISE:
            assert noise not in log, f"{name} printed {noise!r}:\n{log}"
        # The workers stop first, the scheduler last.
        assert 0 < log.rindex("distributed.nanny - INFO - Nanny at") \
            < log.index("Closing scheduler"), log
        results[name] = json.loads((tmp / f"{name}.json").read_text())
    print(f"both jobs done {wall:.1f}s after submission ({slurm.how})")
    a, b = results["job-a"], results["job-b"]
    # One node, two schedulers at once (the jobs met while both were up): the
    # ports differ, nothing collided.
    assert jobs[ids["job-a"]]["NodeList"] == jobs[ids["job-b"]]["NodeList"]
    assert a["scheduler"] != b["scheduler"]
    assert len(list(meet.iterdir())) == 2
    for r in (a, b):
        assert [w["simulated"] for w in r["workers"].values()] == [True]
        assert r["resources"] == [{"GPU": 1}]
    # The scheduler file is gone with the job.
    assert not list(tmp.glob("*.scheduler.json"))


def test_job_fails_at_once_when_the_workers_die_at_start(slurm, job_env):
    tmp, env = job_env
    # Not simulated, and no GPU to serve: every `daskgpu worker` exits 2 as it starts
    # (a command this machine cannot run),
    # while the job script would wait 90 s for a worker.
    env = {**env, "DASK_DASKGPU__SIMULATE": "0", "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    job_id = submit(slurm, tmp, "job-dies", env, tmp / "job-dies.json")
    job = slurm.wait([job_id])[job_id]
    wall = time.monotonic() - t0
    log = (tmp / "job-dies.out").read_text()
    print(f"job-dies: job {job_id} {job['JobState']} exit {job['ExitCode']} "
          f"run {job['RunTime']}; done {wall:.1f}s after submission")
    assert job["JobState"] == "FAILED" and job["ExitCode"] == "1:0", log
    assert "no CUDA GPU to run workers on" in log
    assert "daskgpu.sbatch: the workers exited (status 2) while" in log
    assert not (tmp / "job-dies.json").exists()
    assert _seconds(job["RunTime"]) < 45, log  # not the client's 90 s, nor the time limit


def test_jobqueue_example_ends_with_a_message_when_its_jobs_cannot_start(slurm, job_env):
    # deploy/slurm/jobqueue_example.py used to wait for a worker forever. Here sbatch
    # refuses its jobs (no node has a GPU), and the example gives up at its timeout.
    pytest.importorskip("dask_jobqueue")
    if not slurm.private:
        pytest.skip("on a site's SLURM the example's GPU jobs might well start")
    tmp, env = job_env
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "slurm" / "jobqueue_example.py"), "--jobs", "1",
         "--queue", "debug", "--start-timeout", "5"],
        env={**slurm.env, **env}, cwd=tmp, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    print(f"jobqueue_example: exit {proc.returncode} after {wall:.1f}s")
    assert proc.returncode == 1, proc.stderr
    assert "no worker joined in 5 s" in proc.stderr and "squeue" in proc.stderr
    assert "sbatch: error: Invalid generic resource" in proc.stderr  # why, from dask-jobqueue
    assert "AssertionError" not in proc.stderr
    assert wall < 60


BATCH_SCRIPT = """\
#!/bin/sh
# daskgpu batch as the job script's last line, on the local cluster it starts for itself.
# exec: at the time limit the shell would die at once, and SLURM then kills what is
# left of the job before the run has said how far it got.
exec daskgpu batch slowkern.py:scale --sig 'void(float32[::1], float32[::1])' \\
    --input x.zarr --output z.zarr:float32 --simulate
"""

SLOW_KERNEL = """\
from numba import cuda

def scale(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i]
"""


def test_a_batch_stopped_by_its_time_limit_says_how_to_resume(slurm, job_env):
    # SLURM's time limit sends SIGTERM to every process of the job (SIGKILL after
    # KillWait, 30 s): the run stops as on Ctrl-C, its lock released, its chunks kept.
    import numpy as np
    zarr = pytest.importorskip("zarr")
    from daskgpu._dask.batch.ledger import done_chunks
    from daskgpu._dask.batch.lock import lock_path

    tmp, env = job_env
    folder = tmp / "timed"
    folder.mkdir()
    # Simulated chunks of 500 elements: minutes of work, where the limit is one minute.
    x = zarr.open_array(str(folder / "x.zarr"), mode="w", shape=(2_500_000,), chunks=(500,),
                        dtype="f4")
    x[...] = np.arange(2_500_000, dtype="f4")
    (folder / "slowkern.py").write_text(SLOW_KERNEL)
    script = folder / "batch.sh"
    script.write_text(BATCH_SCRIPT)
    t0 = time.monotonic()
    job_id = slurm.sbatch("--nodes=1", "--cpus-per-task=2", "--time=1",
                          "--job-name=batch-timed", f"--chdir={folder}",
                          f"--output={folder / 'batch.out'}", str(script), env=env)
    job = slurm.wait([job_id], timeout=300)[job_id]
    wall = time.monotonic() - t0
    log = (folder / "batch.out").read_text()
    written = len(done_chunks(str(folder / "z.zarr")))
    print(f"batch-timed: job {job_id} {job['JobState']} after {job['RunTime']} "
          f"({wall:.0f}s after submission), {written}/5000 chunks written")
    assert job["JobState"] == "TIMEOUT", log
    assert "daskgpu batch interrupted:" in log and "run the same job again" in log, log
    assert f"daskgpu batch interrupted: {written}/5000 chunks written" in log, log
    assert "Traceback" not in log, log
    assert 0 < written < 5000
    assert not os.path.exists(lock_path(str(folder / "z.zarr")))
