"""Commands the README and the guide show, run as a reader would run them.

Both pages mark a command that needs a GPU with a ``# needs a GPU`` comment,
and a command that joins a running cluster with :data:`SCHEDULER`; the tests
of each page run their commands through these helpers.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEEDS_GPU = "needs a GPU"
SCHEDULER = "tcp://scheduler:8786"


def has_gpu() -> bool:
    from daskgpu._runtime.gpu.driver import device_count

    return device_count()[0] > 0


def shell_lines(code: str) -> list:
    """A bash block's commands, continuations joined, as ``(argv, comment)``."""
    return [(shlex.split(line, comments=True), line.partition("  #")[2].strip())
            for line in code.replace("\\\n", " ").splitlines() if line.strip()]


def run(argv, cwd, timeout=300):
    """``argv`` as a reader runs it (``VAR=value`` prefixes, ``daskgpu``, ``python``),
    with this checkout importable."""
    assignments = {}
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # VAR=value command
        name, _, value = argv[0].partition("=")
        assignments[name], argv = value, argv[1:]
    if argv[0] == "daskgpu":
        argv = [sys.executable, "-m", "daskgpu", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    env = {**os.environ, **assignments, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def on_a_simulated_cluster(argv, address) -> list:
    """``argv`` joined to the simulated cluster at ``address`` in place of :data:`SCHEDULER`;
    a simulating cluster needs the batch client to ship the Python function too."""
    argv = [address if a == SCHEDULER else a for a in argv]
    return argv + (["--simulate"] if argv[:2] == ["daskgpu", "batch"] else [])


def check_outcome(argv, proc, comment) -> None:
    """No traceback; a command that needs a GPU fails in at most two lines, others pass."""
    what = (f"{shlex.join(argv)}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n"
            f"{proc.stderr[-3000:]}")
    assert "Traceback" not in proc.stderr, what
    if NEEDS_GPU in comment:
        assert proc.returncode != 0, what
        assert len(proc.stderr.strip().splitlines()) <= 2, what
    else:
        assert proc.returncode == 0, what
