"""Run kernels in Numba's CUDA simulator, for machines without a GPU.

Opt-in through ``dask.config`` key ``daskgpu.simulate``. Numba reads
``NUMBA_ENABLE_CUDASIM`` only when ``numba.cuda`` is first imported, which in a
Dask worker has already happened, so this module drives the simulator's
``FakeCUDAKernel`` directly on the kernel's Python function instead.

Simulated launches get their random states built on the host
(:func:`host_random_states`).

A simulated launch is held to the limits of a real device of the target
compute capability (:func:`device_limits`): threads per block and per axis,
blocks per grid axis, and shared memory per block, static and dynamic. What a
GPU refuses, the simulator refuses too, with the same
:class:`~daskgpu.LaunchConfigError`, so tests without a GPU catch it.
"""

from __future__ import annotations

import contextlib
import threading
import types as pytypes
import warnings

import cloudpickle
import numpy as np

from daskgpu._errors import LaunchConfigError
from daskgpu._image.array_info import Zeroed
from daskgpu._image.launch_config import DeviceLimits, pad3, task_counts
from daskgpu._image.random_states import host_states

# The simulator keeps its kernel context in a module global and supports one
# launch at a time per process.
_launch_lock = threading.Lock()

# Simulated blocks run their threads as Python threads: keep forall blocks small.
_FORALL_BLOCK = 64


# Shared memory per block that a kernel may use (the driver's opt-in maximum,
# as a GPU launch checks it on a device), by compute capability; a cc not
# listed takes the entry of the nearest one below.
_SHARED_PER_BLOCK = {
    (5, 0): 49152, (6, 0): 49152, (7, 0): 98304, (7, 2): 98304, (7, 5): 65536,
    (8, 0): 166912, (8, 6): 101376, (8, 7): 166912, (8, 9): 101376, (9, 0): 232448,
    (10, 0): 232448, (10, 3): 232448, (11, 0): 232448, (12, 0): 101376, (12, 1): 101376,
}


def device_limits(cc):
    """The launch limits of a real device of compute capability ``cc``, e.g. ``(7, 5)``.

    Examples
    --------
    >>> device_limits((9, 0)).max_shared_memory_per_block
    232448
    """
    cc = tuple(cc)
    shared = _SHARED_PER_BLOCK[max((k for k in _SHARED_PER_BLOCK if k <= cc),
                                   default=(5, 0))]
    return DeviceLimits(max_threads_per_block=1024, max_block_dim=(1024, 1024, 64),
                        max_grid_dim=(2**31 - 1, 65535, 65535),
                        max_shared_memory_per_block=shared)


def _check(limits, grid, block, sharedmem, cc, name):
    grid, block = pad3(grid), pad3(block)
    try:
        limits.check(grid, block, sharedmem, limits.max_threads_per_block, name)
    except LaunchConfigError as exc:
        raise LaunchConfigError(
            f"{exc} (simulated: the simulator holds launches to the limits of a compute "
            f"capability {cc[0]}.{cc[1]} GPU, which refuses this one)") from None


def _target_cc(image=None):
    if image is not None and getattr(image, "ptx", None):
        return tuple(min(cc for cc, _ in image.ptx))
    from daskgpu import _config

    major, minor = _config.get("target-cc").split(".")
    return int(major), int(minor)


def run(image, config, args):
    """Simulate ``image``'s shipped Python function; arrays are updated in place."""
    run_function(cloudpickle.loads(image.py_func), config, args, cc=_target_cc(image))


def run_function(py_func, config, args, cc=None):
    """Simulate ``py_func`` as a kernel launched with ``config`` on ``args``.

    The launch is held to the limits of a device of compute capability ``cc``
    (default: the ``daskgpu.target-cc`` setting).
    """
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    args = [_fresh(a) if type(a) is Zeroed else a for a in args]
    for a in args:
        if hasattr(a, "__cuda_array_interface__") and not hasattr(a, "__array_interface__"):
            raise TypeError(
                "the CUDA simulator runs on host arrays only; pass numpy arrays, or "
                "turn simulation off (dask.config.set({'daskgpu.simulate': False})) on a GPU"
            )
    ntasks = task_counts(config)
    if ntasks is not None:
        if 0 in ntasks:
            return  # forall over no tasks launches nothing, as in Numba
        tpb = config.tpb or _FORALL_BLOCK
        block = (min(tpb, max(ntasks[0], 1)),) + (1,) * (len(ntasks) - 1)
        grid = tuple(max(1, -(-n // b)) for n, b in zip(ntasks, block))
    else:
        grid, block = config.griddim, config.blockdim
    cc = tuple(cc) if cc is not None else _target_cc()
    limits = device_limits(cc)
    name = getattr(py_func, "__name__", "kernel")
    if config.ntasks is not None and config.tpb:
        _check(limits, (1,), (config.tpb,), config.sharedmem, cc, name)
    _check(limits, grid, block, config.sharedmem, cc, name)
    # The simulator, like Numba, copies only contiguous host arrays; the GPU
    # launch stages strided ones through contiguous copies, and so does this.
    staged = [
        (a, np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
        and not (a.flags.c_contiguous or a.flags.f_contiguous) else (a, a)
        for a in args
    ]
    kernel = FakeCUDAKernel(_simulable(py_func, {}), device=False)
    with _launch_lock, _shared_limit(limits, cc, config.sharedmem, name), \
            warnings.catch_warnings():
        # A GPU's integer arithmetic wraps silently, and kernels rely on it
        # (numba's xoroshiro128+ adds uint64s); numpy's scalars would warn. The
        # filter is process-wide, but simulated launches hold the lock anyway.
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
        kernel[grid, block, 0, config.sharedmem](*(copy for _, copy in staged))
    for a, copy in staged:
        if copy is not a and a.flags.writeable:
            a[...] = copy


@contextlib.contextmanager
def _shared_limit(limits, cc, dynamic, name):
    """Count ``cuda.shared.array`` allocations against the per-block limit, during a launch.

    The simulator allocates static shared arrays as its threads reach them;
    this checks each one's size first, so a 1 GB shared array fails as on a
    GPU (where it would not link) instead of allocating host memory.
    """
    import sys
    import traceback

    from numba import types
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support

    original = FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        if shape == 0:  # the dynamic shared array, counted at launch
            return original(self, shape, dtype)
        # As the simulator does: one allocation per source line of the kernel.
        caller = traceback.extract_stack(sys._getframe())[-2][0:2]
        res = self._allocations.get(caller)
        if res is None:
            count = np.prod(shape if isinstance(shape, tuple) else (shape,), dtype=np.int64)
            static = sum(a.nbytes for a in self._allocations.values())
            total = dynamic + static + int(count) * np.dtype(dtype).itemsize
            if total > limits.max_shared_memory_per_block:
                raise LaunchConfigError(
                    f"kernel {name!r} asks for {total} bytes of shared memory per block "
                    f"(static and dynamic), but a compute capability {cc[0]}.{cc[1]} GPU "
                    f"allows {limits.max_shared_memory_per_block}; use smaller shared arrays")
            res = np.empty(shape, dtype)
            self._allocations[caller] = res
        return res

    FakeCUDAShared.array = array
    try:
        yield
    finally:
        FakeCUDAShared.array = original


def host_random_states(seed: int, base: int, shape: tuple, strides: tuple):
    """The random states of a simulated launch of ``shape``, on the host by the jump table.

    Element ``i`` gets state ``base + i . strides``, as on a GPU.

    Examples
    --------
    >>> host_random_states(7, 10, (2, 3), (100, 1)).shape
    (6,)
    """
    return host_states(seed, _indices(base, shape, strides))


def _indices(base, shape, strides):
    """Global state indices of a launch of ``shape`` (row-major), as uint64."""
    g = np.full(shape, np.uint64(base), dtype=np.uint64)
    for axis, (n, st) in enumerate(zip(shape, strides)):
        step = np.arange(n, dtype=np.uint64) * np.uint64(st)
        g += step.reshape((n,) + (1,) * (len(shape) - axis - 1))
    return g.ravel()


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
