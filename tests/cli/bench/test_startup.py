"""The sections cold and first-task without a GPU: the task the first-task section times."""

import pickle
import sys

import dask
import numpy as np
import pytest

import daskgpu as dg
from daskgpu._cli.bench.kernels import ADD_SIG, add_constant
from daskgpu._cli.bench.startup import first_task_run


def test_first_task_run_launches_on_the_worker_arrays(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", np)  # the task allocates with CuPy
    with dask.config.set({"daskgpu.simulate": True}):
        kernel = dg.jit(ADD_SIG)(add_constant(5.0))
        shipped = pickle.loads(pickle.dumps(kernel))
        assert first_task_run(shipped, 64) == 7.0


@pytest.mark.slow
def test_cold_start_children_cache_bytecode_where_the_environment_forbids_it(
        monkeypatch, tmp_path):
    import subprocess

    from daskgpu._cli.bench.startup import bytecode_cached_env

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    cache = tmp_path / "pyc"
    probe = "import sys, daskgpu._cli.bench.fresh; print(sys.dont_write_bytecode, sys.pycache_prefix)"
    out = subprocess.run([sys.executable, "-c", probe], env=bytecode_cached_env(str(cache)),
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", str(cache)]
    assert any(p.name.startswith("fresh.") for p in cache.rglob("*.pyc"))
