"""The bench's kernels: first-task kernels are new code, and travel as the section needs."""

from distributed.protocol import pickle as dask_pickle
from numba import cuda

import daskgpu as dg
from daskgpu._cli.bench.kernels import add_constant

ADD_SIG = "void(float32[::1], float32[::1], float32[::1])"


def test_each_first_task_kernel_is_new_code():
    # A distinct constant per kernel: distinct PTX, so no cache of linked images can serve it.
    a, b = (dg.jit(ADD_SIG)(add_constant(c)) for c in (7.0, 8.0))
    assert a.images[0].hash != b.images[0].hash
    assert a.images[0].ptx[0][1] != b.images[0].ptx[0][1]


def test_numba_baseline_travels_by_value_without_compiled_code():
    dispatcher = cuda.jit(add_constant(9.0))
    back = dask_pickle.loads(dask_pickle.dumps(dispatcher))
    assert back is not dispatcher and back.py_func.__globals__["C"] == 9.0
    assert not back.overloads  # compiles on the worker
