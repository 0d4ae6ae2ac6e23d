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

import builtins
import contextlib
import functools
import threading
import types as pytypes
import warnings

import cloudpickle
import numpy as np

from daskgpu._errors import DaskGPUError, LaunchConfigError
from daskgpu._image.array_info import Zeroed
from daskgpu._image.launch_config import DeviceLimits, block_shape, pad3, task_counts
from daskgpu._image.random_states import host_states
from daskgpu._runtime import faults, launch_runs

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
        # Whole blocks, as a GPU launches them: the threads past ntasks run too, so a
        # kernel's missing (or off-by-one) bounds check fails here as it would there.
        # N-D blocks are shaped as on a GPU: a (64, 1) block over a small 2-D chunk
        # would run several times the threads the chunk has.
        block = block_shape(config.tpb or _FORALL_BLOCK, ntasks)
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
    copies = {}
    raised = []
    halt = _Halt()
    kernel = FakeCUDAKernel(_trapping(_simulable(py_func, copies), raised, halt), device=False)
    try:
        with _launch_lock, _shared_limit(limits, cc, config.sharedmem, name), \
                warnings.catch_warnings():
            # A GPU's integer arithmetic wraps silently, and kernels rely on it
            # (numba's xoroshiro128+ adds uint64s); numpy's scalars would warn. The
            # filter is process-wide, but simulated launches hold the lock anyway.
            warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
            if launch_runs.watching:  # its own run starts now, the lock held
                launch_runs.began(halt.stop)
            try:
                kernel[grid, block, 0, config.sharedmem](*(copy for _, copy in staged))
            finally:
                if launch_runs.watching:
                    launch_runs.ended()
            if halt.stopped:
                raise _Halted()
    except (_Raised, _Halted):
        if halt.stopped:
            raise DaskGPUError(
                f"simulated kernel {name!r} was stopped by its worker (over its time limit, "
                "or cancelled)") from None
        exc, thread, cta = raised[0]
        if isinstance(exc, LaunchConfigError):  # the launch refused (shared memory): no thread's
            raise exc from None
        line = _raising_line(exc, {f.__code__ for f in copies if callable(f)})
        site = faults.thread_site(name, grid, block, thread, cta, line)
        # Then the simulator's own words, which code written for Numba matches.
        raise faults.relocated(exc, f"{site}: tid={list(thread)} ctaid={list(cta)}") from None
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


class _Raised(Exception):
    """What a simulated thread raises in place of its kernel's exception, which
    :func:`_trapping` keeps: Numba's simulator rebuilds a thread's exception from
    its class and text alone, losing its arguments (or the exception itself, for
    a class whose constructor wants others)."""


class _Halted(Exception):
    """Raised in a simulated thread whose launch was stopped (:class:`_Halt`)."""


class _Halt:
    """Stops a simulated launch: its threads run Python, so an exception raised in each
    (at its next bytecode) ends it, and the simulator's process-wide launch lock is
    released, which a kernel that never ends would otherwise hold for good."""

    __slots__ = ("threads", "stopped", "lock")

    def __init__(self):
        self.threads = set()  # ids of the launch's simulated threads now running
        self.stopped = False
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            if self.stopped:
                raise _Halted()
            self.threads.add(threading.get_ident())

    def leave(self) -> None:
        with self.lock:
            self.threads.discard(threading.get_ident())

    def stop(self) -> None:
        import ctypes

        with self.lock:
            self.stopped = True
            for ident in self.threads:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                           ctypes.py_object(_Halted))


def _trapping(fn, raised: list, halt: _Halt | None = None):
    """``fn``, keeping the first exception a simulated thread raises in ``raised``,
    as ``(exception, threadIdx, blockIdx)``; a thread of a stopped launch (``halt``) ends."""
    def kernel(*args):
        try:
            if halt is not None:
                halt.enter()
            try:
                fn(*args)
            finally:
                if halt is not None:
                    halt.leave()
        except Exception as exc:
            thread = threading.current_thread()  # the simulator's BlockThread
            with _raised_lock:
                if not raised:  # others only abort, once the first one failed
                    raised.append((exc, tuple(thread.threadIdx), tuple(thread.blockIdx)))
            raise _Raised() from None

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


_raised_lock = threading.Lock()


def _raising_line(exc, codes):
    """``(file, line)`` of the innermost frame of ``exc`` in the kernel or a device function.

    A function shipped by value (an image's) has its code's file named
    :data:`_SHIPPED` by cloudpickle, which keeps its module's ``__file__`` among
    its globals: the user's file is that.
    """
    line = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code in codes:
            file = frame.f_code.co_filename
            if file == _SHIPPED:
                file = frame.f_globals.get("__file__") or file
            line = (file, tb.tb_lineno)
        tb = tb.tb_next
    return line


#: The file cloudpickle names for the code of a function it pickled by value.
_SHIPPED = "<dynamic-code>"


def _fresh(arg: Zeroed):
    # A launch zero-fills a Zeroed output on the device; here the host is the device.
    arg.array.fill(0)
    return arg.array


def _simulable(fn, done: dict):
    """A copy of ``fn`` that runs in the simulator wherever it reaches a device function.

    A real ``@cuda.jit(device=True)`` dispatcher cannot be called inside a
    simulated kernel; its Python function can. The copy swaps the device
    functions it reaches as globals, as module attributes (``core.helper``,
    as stumpy writes it) and through its closure, and imports the simulator's
    ``cuda`` where its body imports ``numba.cuda``, as Numba's own simulator
    would. It gets its own globals and builtins (for that import).
    """
    if fn in done:
        return done[fn]
    real_cuda = _simulator_cuda()[1]
    # Every global that is numba.cuda, also those only nested code reads: the
    # simulator swaps them in the globals of the function it runs, which is
    # _trapping's here.
    new_globals = {k: _CUDA_VIEW if v is real_cuda else v for k, v in fn.__globals__.items()}
    new_globals["__builtins__"] = _SIMULATED_BUILTINS
    closure = fn.__closure__
    if closure is not None:
        closure = tuple(_swapped_cell(cell, fn, done) for cell in closure)
    copy = pytypes.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    done[fn] = copy
    for name in fn.__code__.co_names:
        if name in new_globals:
            new_globals[name] = _swapped(new_globals[name], fn, done)
    return copy


def _swapped(value, fn, done):
    """``value`` as a simulated kernel reaches it: device functions as simulator functions,
    a module as a view whose device functions (among the names ``fn`` uses) are swapped."""
    from numba import cuda
    from numba.cuda.dispatcher import CUDADispatcher
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    if isinstance(value, CUDADispatcher):
        return FakeCUDAKernel(_simulable(value.py_func, done), device=True)
    if _is_cpu_dispatcher(value):
        # numba.jit functions that kernels call (numba.cuda.random's) would
        # be compiled for the CPU, which cannot take the simulator's arrays.
        return _simulable(value.py_func, done)
    if value is cuda:  # a global, or a closure's (``from numba import cuda`` in a factory)
        return _CUDA_VIEW
    if not isinstance(value, pytypes.ModuleType):
        return value
    if value.__name__ == "numba":
        return _NUMBA_VIEW  # ``numba.cuda.grid(1)``
    key = ("module", id(value))
    if key not in done:
        done[key] = value
        swaps = {}
        for attr in fn.__code__.co_names:
            member = getattr(value, attr, None)
            if member is not None and (isinstance(member, (CUDADispatcher, pytypes.ModuleType))
                                       or _is_cpu_dispatcher(member)):
                swapped = _swapped(member, fn, done)
                if swapped is not member:
                    swaps[attr] = swapped
        if swaps:
            done[key] = _ModuleView(value, swaps)
    return done[key]


class _ModuleView(pytypes.ModuleType):
    """A module as a simulated kernel sees it: some members replaced, the rest its own."""

    def __init__(self, module, swaps):
        super().__init__(module.__name__)
        self.__dict__.update(swaps)
        self._module = module

    def __getattr__(self, name):  # only for names not swapped
        return getattr(self._module, name)


class _CudaView(pytypes.ModuleType):
    """``numba.cuda`` inside a simulated kernel: the running launch's simulator module,
    looked up at each use, as Numba swaps a kernel's global ``cuda`` during a launch."""

    def __getattr__(self, name):
        context, cuda, _ = _simulator_cuda()
        return getattr(context() or cuda, name)


class _NumbaView(pytypes.ModuleType):
    """``numba`` inside a simulated kernel: its ``cuda`` is :data:`_CUDA_VIEW`."""

    def __getattr__(self, name):
        if name == "cuda":
            return _CUDA_VIEW
        return getattr(_simulator_cuda()[2], name)


@functools.cache
def _simulator_cuda():
    """The simulator's launch context getter, ``numba.cuda`` and ``numba``, imported once."""
    import numba
    from numba import cuda
    from numba.cuda.simulator.kernel import _get_kernel_context

    return _get_kernel_context, cuda, numba


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    # ``from numba import cuda``, ``import numba.cuda`` inside a simulated kernel's body.
    if level == 0 and name in ("numba", "numba.cuda"):
        builtins.__import__(name, globals, locals, fromlist, level)
        return _CUDA_VIEW if name == "numba.cuda" and fromlist else _NUMBA_VIEW
    return builtins.__import__(name, globals, locals, fromlist, level)


def _swapped_cell(cell, fn, done):
    try:
        value = cell.cell_contents
    except ValueError:  # not yet filled: a recursive closure
        return cell
    swapped = _swapped(value, fn, done)
    return cell if swapped is value else pytypes.CellType(swapped)


_CUDA_VIEW = _CudaView("numba.cuda")
_NUMBA_VIEW = _NumbaView("numba")
_SIMULATED_BUILTINS = {**vars(builtins), "__import__": _import}


def _is_cpu_dispatcher(value) -> bool:
    cls = type(value)
    return cls.__module__.startswith("numba.core") and hasattr(value, "py_func") and hasattr(
        value, "overloads")
