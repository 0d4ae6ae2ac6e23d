"""Run kernels in Numba's CUDA simulator, for machines without a GPU.

Opt-in through ``dask.config`` key ``daskgpu.simulate``. Numba reads
``NUMBA_ENABLE_CUDASIM`` only when ``numba.cuda`` is first imported, which in a
Dask worker has already happened, so this module drives the simulator's
``FakeCUDAKernel`` directly on the kernel's Python function instead.
"""

from __future__ import annotations

import threading
import types as pytypes

import cloudpickle
import numpy as np

from daskgpu._image.argspec import Zeroed

# The simulator keeps its kernel context in a module global and supports one
# launch at a time per process.
_launch_lock = threading.Lock()

# Simulated blocks run their threads as Python threads: keep forall blocks small.
_FORALL_BLOCK = 64


def run(image, config, args):
    """Simulate ``image``'s shipped Python function; arrays are updated in place."""
    run_function(cloudpickle.loads(image.py_func), config, args)


def run_function(py_func, config, args):
    """Simulate ``py_func`` as a kernel launched with ``config`` on ``args``."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    args = [_fresh(a) if type(a) is Zeroed else a for a in args]
    for a in args:
        if hasattr(a, "__cuda_array_interface__") and not hasattr(a, "__array_interface__"):
            raise TypeError(
                "the CUDA simulator runs on host arrays only; pass numpy arrays, or "
                "turn simulation off (dask.config.set({'daskgpu.simulate': False})) on a GPU"
            )
    if config.ntasks is not None:
        ntasks = config.ntasks if isinstance(config.ntasks, tuple) else (config.ntasks,)
        if 0 in ntasks:
            return  # forall over no tasks launches nothing, as in Numba
        tpb = config.tpb or _FORALL_BLOCK
        block = (min(tpb, max(ntasks[0], 1)),) + (1,) * (len(ntasks) - 1)
        grid = tuple(max(1, -(-n // b)) for n, b in zip(ntasks, block))
    else:
        grid, block = config.griddim, config.blockdim
    # The simulator, like Numba, copies only contiguous host arrays; the GPU
    # launcher stages strided ones through contiguous copies, and so does this.
    staged = [
        (a, np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
        and not (a.flags.c_contiguous or a.flags.f_contiguous) else (a, a)
        for a in args
    ]
    kernel = FakeCUDAKernel(_simulable(py_func, {}), device=False)
    with _launch_lock:
        kernel[grid, block, 0, config.sharedmem](*(copy for _, copy in staged))
    for a, copy in staged:
        if copy is not a and a.flags.writeable:
            a[...] = copy


def _fresh(arg: Zeroed):
    # A launch zero-fills a Zeroed output on the device; here the host is the device.
    arg.array.fill(0)
    return arg.array


def _simulable(fn, done: dict):
    """A copy of ``fn`` whose global device functions are simulator functions.

    A real ``@cuda.jit(device=True)`` dispatcher cannot be called inside a
    simulated kernel; its Python function can. The copy gets its own globals,
    since the simulator swaps the ``cuda`` module inside them during a launch.
    """
    from numba.cuda.dispatcher import CUDADispatcher
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    if fn in done:
        return done[fn]
    new_globals = dict(fn.__globals__)
    copy = pytypes.FunctionType(fn.__code__, new_globals, fn.__name__,
                                fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    done[fn] = copy
    for name in fn.__code__.co_names:
        value = new_globals.get(name)
        if isinstance(value, CUDADispatcher):
            new_globals[name] = FakeCUDAKernel(_simulable(value.py_func, done), device=True)
        elif _is_cpu_dispatcher(value):
            # numba.jit functions that kernels call (numba.cuda.random's) would
            # be compiled for the CPU, which cannot take the simulator's arrays.
            new_globals[name] = _simulable(value.py_func, done)
    return copy


def _is_cpu_dispatcher(value) -> bool:
    cls = type(value)
    return cls.__module__.startswith("numba.core") and hasattr(value, "py_func") and hasattr(
        value, "overloads")
