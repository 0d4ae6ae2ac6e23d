"""The Dask layer's tests, run again on the graph layer this process does not use.

Dask chooses between its HighLevelGraph and its array expressions once per
process (``array.query-planning``, read when ``dask.array`` is first imported),
so the other layer runs in a pytest process of its own: the fast tests of
``tests/dask`` and the doctests of ``daskgpu/_dask``. A test that reads what
only one layer has says so (``tests/layers.py``).
"""

import os
import pathlib
import subprocess
import sys

import pytest
from layers import EXPRESSIONS

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dask_layer_passes_on_the_other_graph_layer():
    other = not EXPRESSIONS
    env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING=str(other))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-m", "not slow and not gpu",
         "tests/dask", "daskgpu/_dask"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"with array.query-planning={other}:\n{tail}"


@pytest.mark.slow
def test_a_chain_of_two_maps_optimizes_to_no_more_tasks_on_expressions():
    from layers import chain_task_count

    env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING=str(not EXPRESSIONS))
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); "
         "from layers import chain_task_count; print(chain_task_count())"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    here, other = chain_task_count(), int(done.stdout.split()[-1])
    expressions, hlg = (here, other) if EXPRESSIONS else (other, here)
    assert expressions <= hlg == 16  # 8 reads and 8 tasks that run both launches
