"""The sections cold and first-task without a GPU: the task the first-task section times."""

import pickle
import sys

import dask
import numpy as np

import daskgpu as dg
from daskgpu._cli.bench.kernels import ADD_SIG, add_constant
from daskgpu._cli.bench.startup import first_task_run


def test_first_task_run_launches_on_the_worker_arrays(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", np)  # the task allocates with CuPy
    with dask.config.set({"daskgpu.simulate": True}):
        kernel = dg.jit(ADD_SIG)(add_constant(5.0))
        shipped = pickle.loads(pickle.dumps(kernel))
        assert first_task_run(shipped, 64) == 7.0
