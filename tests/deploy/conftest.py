"""The deploy tests' SLURM: the ``slurm`` fixture that tests/deploy/test_slurm.py submits to.

Where it comes from, in this order:

1. ``DASKGPU_TEST_SLURM=system``: the SLURM this machine is configured for (``sinfo``
   answers); jobs go to ``DASKGPU_TEST_SLURM_PARTITION``, else the default partition,
   and must start within a minute. Opt-in, so that the suite never queues jobs on a
   site's cluster unasked.
2. Otherwise, where ``slurmctld``, ``slurmd`` and ``munged`` are installed and the tests
   run as root: a private one-node SLURM for this host, started in a temporary
   directory (its own munge key and socket, free ports, nothing written to /etc) and
   stopped when the session ends. It takes about three seconds. Debian and Ubuntu:
   ``apt-get install -y slurm-wlm munge``.
3. Otherwise the tests skip, saying what is missing (``sbatch`` not on PATH, ...).

To start the same one-node SLURM by hand (as root), write the ``slurm.conf`` that
:func:`write_slurm_conf` writes, then::

    munged --force --socket=$D/munge.sock --key-file=$D/munge.key ...
    export SLURM_CONF=$D/slurm.conf
    slurmctld -i && slurmd && sinfo          # the node shows "idle"
    DASKGPU_TEST_SLURM=system python -m pytest tests/deploy/test_slurm.py
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

#: The states of a job that has ended.
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
        "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: submits jobs to a real SLURM (skipped without)")


class Slurm:
    """A SLURM to submit to: ``env`` carries its ``SLURM_CONF``, if any."""

    def __init__(self, env, partition=None, how="", private=False):
        self.env, self.partition, self.how = env, partition, how
        self.private = private  # started by the fixture: one node, no GPUs, partition "debug"

    def run(self, *argv, timeout=30, **kw):
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=timeout, **kw)

    def sbatch(self, *argv, env=None) -> int:
        """Submit; return the job id."""
        options = ["--parsable"] + ([f"--partition={self.partition}"] if self.partition else [])
        proc = subprocess.run(["sbatch", *options, *argv], env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id) -> dict:
        """``scontrol show job``'s fields of one job."""
        proc = self.run("scontrol", "show", "job", "--oneliner", str(job_id))
        assert proc.returncode == 0, proc.stderr
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait(self, job_ids, timeout=150, start_timeout=60) -> dict:
        """Wait until every job has ended; return their fields. Cancels them on timeout."""
        start = time.monotonic()
        jobs = {}
        while True:
            jobs = {j: self.job(j) for j in job_ids}
            if all(job["JobState"] in DONE for job in jobs.values()):
                return jobs
            elapsed = time.monotonic() - start
            pending = [j for j, job in jobs.items() if job["JobState"] == "PENDING"]
            if elapsed > timeout or (pending and elapsed > start_timeout):
                self.run("scancel", *map(str, job_ids))
                states = {j: (job["JobState"], job.get("Reason")) for j, job in jobs.items()}
                pytest.fail(f"SLURM jobs did not end in {timeout:.0f}s "
                            f"(or start in {start_timeout:.0f}s): {states}")
            time.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_slurm_conf(directory: pathlib.Path, host: str, munge_socket) -> pathlib.Path:
    """A ``slurm.conf`` for one node, this host, everything kept under ``directory``.

    No cgroups (``proctrack/linuxproc``, ``task/none``: containers rarely allow
    them), no accounting, consumable cores with more CPUs declared than the host
    may have, so that several small jobs run at once.
    """
    for sub in ("state", "spool", "log"):
        (directory / sub).mkdir(exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(f"""\
ClusterName=daskgpu-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd.pid
SlurmctldLogFile={directory}/log/slurmctld.log
SlurmdLogFile={directory}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=15 State=UP
""")
    return conf


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def private_slurm(directory: pathlib.Path):
    """Start munged, slurmctld and slurmd in ``directory``; yield a :class:`Slurm`."""
    directory.mkdir(parents=True, exist_ok=True)
    munge = directory / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = munge / "munge.sock"
    host = socket.gethostname().split(".")[0]
    conf = write_slurm_conf(directory, host, sock)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = []
    try:
        procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--log-file={directory}/log/munged.log", f"--pid-file={munge}/munged.pid",
             f"--seed-file={munge}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for argv in (["slurmctld", "-D", "-i", "-f", str(conf)],
                     ["slurmd", "-D", "-f", str(conf)]):
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        slurm = Slurm(env, how=f"a private SLURM in {directory} (slurm.conf there)",
                      private=True)
        deadline = time.monotonic() + 30
        state = ""
        while "idle" not in state:
            dead = [p.args[0] for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f.read_text()[-2000:] for f in (directory / "log").iterdir())
                pytest.fail(f"the private SLURM did not start ({dead or 'no idle node'}); "
                            f"logs:\n{logs}")
            time.sleep(0.3)
            proc = slurm.run("sinfo", "--noheader", "--format=%T")
            state = proc.stdout
        yield slurm
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    if shutil.which("sbatch") is None:
        pytest.skip("no SLURM: sbatch is not on PATH (Debian: apt-get install slurm-wlm munge)")
    if os.environ.get("DASKGPU_TEST_SLURM") == "system":
        proc = subprocess.run(["sinfo", "--noheader"], capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0:
            pytest.fail(f"DASKGPU_TEST_SLURM=system, but sinfo fails: {proc.stderr.strip()}")
        yield Slurm(dict(os.environ), os.environ.get("DASKGPU_TEST_SLURM_PARTITION"),
                    how="this machine's SLURM")
        return
    missing = [d for d in ("slurmctld", "slurmd", "munged") if shutil.which(d) is None]
    if missing:
        pytest.skip(f"no SLURM to run: {', '.join(missing)} not installed, and "
                    "DASKGPU_TEST_SLURM=system not set")
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("starting a private SLURM needs root; or set DASKGPU_TEST_SLURM=system "
                    "to use this machine's")
    # A short path: munge's socket path must fit in sun_path.
    with private_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
