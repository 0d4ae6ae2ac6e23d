"""What the bench runs in fresh processes: real module code, run without numba where it must."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from daskgpu._cli.bench import fresh
from daskgpu._image.random_states import host_states


def test_the_cold_start_command_starts_the_clock_then_calls_a_function_of_the_module():
    for program in ("daskgpu_first_result", "numba_first_result", "cuda_context_floor"):
        command = fresh.cold_start_command(program)
        assert command[:2] == [sys.executable, "-c"]
        code = command[2]
        assert code.index("perf_counter") < code.index("from daskgpu")
        assert callable(getattr(fresh, program))


@pytest.mark.slow
def test_the_fresh_module_imports_no_numba():
    # The daskgpu cold start imports this module first: numba must stay out of it.
    code = "import sys; import daskgpu._cli.bench.fresh; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_numba_states_run_as_a_module_and_match_the_jump_table():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")  # Numba's simulator: no GPU here
    out = subprocess.run([sys.executable, "-m", "daskgpu._cli.bench.fresh", "4", "2024", "16",
                          "16"], capture_output=True, text=True, env=env, check=True,
                         timeout=300)
    numba = json.loads(out.stdout)
    want = host_states(2024, np.array([16, 19], np.uint64))
    assert numba["ends"] == [[int(w["s0"]), int(w["s1"])] for w in want]
    assert numba["seconds"] > 0 and numba["per_jump"] > 0
