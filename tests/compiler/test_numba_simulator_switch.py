"""``NUMBA_ENABLE_CUDASIM=1``, Numba's switch to its simulator, set by a Numba user.

Library code gets one line naming daskgpu's own setting; the command line
reads the switch as "simulate" and runs.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(args, **kw):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env.pop("DASK_DASKGPU__SIMULATE", None)
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300, **kw)


@pytest.mark.slow
def test_compiling_under_numbas_switch_names_daskgpus_setting():
    code = ("import daskgpu as dg\n"
            "from numba import cuda\n"
            "try:\n"
            "    @dg.jit\n"
            "    def f(x):\n"
            "        x[cuda.grid(1)] = 1\n"
            "except dg.ConfigError as e:\n"
            "    print(str(e))\n")
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("NUMBA_ENABLE_CUDASIM=1 is set")
    assert "unset NUMBA_ENABLE_CUDASIM and set DASK_DASKGPU__SIMULATE=1" in line


@pytest.mark.slow
def test_the_demo_under_numbas_switch_runs_simulated():
    proc = _run([sys.executable, "-m", "daskgpu", "demo", "--size", "1000"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        "daskgpu demo: NUMBA_ENABLE_CUDASIM=1 is Numba's switch to its CUDA simulator; "
        "daskgpu simulates through daskgpu.simulate, which is on for this command")
    assert "(simulated)" in proc.stdout and "OK" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.nogpu
@pytest.mark.slow
def test_an_explicit_daskgpu_setting_wins_over_numbas_switch():
    # With simulation set off, a machine without a GPU cannot run workers: the switch
    # used to turn simulation on regardless, and start a simulated worker.
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", DASK_DASKGPU__SIMULATE="0",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "daskgpu", "worker", "tcp://127.0.0.1:1",
                           "--death-timeout", "5"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    lines = proc.stderr.splitlines()
    assert lines[0] == ("daskgpu worker: NUMBA_ENABLE_CUDASIM=1 is Numba's switch to its CUDA "
                        "simulator, and is ignored: daskgpu.simulate is set off, which wins")
    assert proc.returncode == 2, proc.stderr
    assert lines[1].startswith("daskgpu worker: error: no CUDA GPU to run workers on")
