"""Run one launch of a :class:`KernelImage` on this thread's GPU."""

from __future__ import annotations

import functools
import math
import os
import threading

import numpy as np
from cuda.bindings import driver
from cuda.core import ObjectCode

from daskgpu import _config
from daskgpu._errors import DeviceError, LaunchConfigError
from daskgpu._image.argspec import passed_value
from daskgpu._image.array_info import CAI_READERS, READERS, Zeroed, array_info, read_cupy
from daskgpu._runtime import device as _device
from daskgpu._runtime._cuda import (
    _SUCCESS,
    CUDAError,
    cuda_error,
    check,
    driver_version,
    nvjitlink_version,
)
from daskgpu._runtime.cache import DiskCache, ModuleCache
from daskgpu._runtime.faults import device_exception, replace_worker_process
from daskgpu._runtime.linking import link_cubin
from daskgpu._runtime.marshal import (
    FastFactories,
    ParamLayout,
    fast_constants,
    fast_source,
    fast_struct,
    flatten,
)
from daskgpu._runtime.pinned_arrays import PinnedArrays, is_page_locked
from daskgpu._runtime.staging import PinnedPool, Stager

#: The process-wide cache of linked kernels, keyed by (image hash, device id).
module_cache = ModuleCache(int(_config.get("module-cache-size", 256)))


class LinkedKernel:
    """An image linked and loaded for one device."""

    def __init__(self, image, state, cubin: bytes):
        self.object_code = ObjectCode.from_cubin(cubin, name=image.name)
        self.kernel = self.object_code.get_kernel(image.entry)
        self.handle = self.kernel.handle
        # Launching the context's CUfunction costs less host time than the
        # CUkernel (4.4 against 4.9-5.5 us a launch on the H200).
        self.function = check(
            driver.cuKernelGetFunction(self.handle), "cuKernelGetFunction"
        )
        self.max_threads = check(
            driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                self.function,
            ),
            "cuFuncGetAttribute",
        )
        self.layout = ParamLayout(image.args)
        # Grid-synchronising kernels are launched cooperatively, as numba-cuda does.
        self.cooperative = bool(image.option("cooperative"))
        carveout = image.option("shared_memory_carveout")
        if carveout is not None:
            check(driver.cuFuncSetAttribute(
                self.function,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                carveout,
            ), "cuFuncSetAttribute")
        # Debug kernels report a raised exception through these globals.
        self.errcode = self._global(image.entry + "__errcode__") if image.option("debug") else None
        self._block_size = {}
        self._dims = {}  # LaunchConfig -> (griddim, blockdim), validated

    def _global(self, name: str):
        library = check(driver.cuKernelGetLibrary(self.handle), "cuKernelGetLibrary")
        dptr, _ = check(driver.cuLibraryGetGlobal(library, name.encode()), f"cuLibraryGetGlobal({name})")
        return dptr

    def raised(self, image, stream):
        """The exception a debug kernel's thread raised in the last launch, else None."""
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        if _read_int(self.errcode) == 0:
            return None
        tid = [_read_int(self._global(f"{image.entry}__tid{a}__")) for a in "zyx"]
        ctaid = [_read_int(self._global(f"{image.entry}__ctaid{a}__")) for a in "zyx"]
        return device_exception(image, _read_int(self.errcode), tid, ctaid)

    def dims(self, config, state, name):
        """``(griddim, blockdim)`` for ``config``, checked against the device once."""
        dims = self._dims.get(config)
        if dims is None:
            dims = launch_dims(config, self, state.limits.max_grid_dim)
            state.limits.check(*dims, config.sharedmem, self.max_threads, name)
            if self.cooperative:
                self.check_cooperative(*dims, config.sharedmem, state, name)
            if len(self._dims) < 1024:
                self._dims[config] = dims
        return dims

    def check_cooperative(self, griddim, blockdim, sharedmem, state, name):
        """Refuse a cooperative grid larger than can be resident at once."""
        threads = blockdim[0] * blockdim[1] * blockdim[2]
        per_sm = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.function, threads, sharedmem), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        most = per_sm * state.device.properties.multiprocessor_count
        blocks = griddim[0] * griddim[1] * griddim[2]
        if blocks > most:
            raise LaunchConfigError(
                f"kernel {name!r} synchronises its whole grid (cooperative groups), so all "
                f"of its blocks must be resident at once: this device holds at most {most} "
                f"blocks of {threads} threads with {sharedmem} bytes of shared memory, and "
                f"the grid {griddim} has {blocks}. Launch at most {most} blocks (and loop "
                "over the data in the kernel), or use smaller blocks."
            )

    def block_size(self, sharedmem: int) -> int:
        """The occupancy API's block size for this kernel and shared memory."""
        size = self._block_size.get(sharedmem)
        if size is None:
            _, size = check(
                driver.cuOccupancyMaxPotentialBlockSize(self.function, None, sharedmem, 0),
                "cuOccupancyMaxPotentialBlockSize",
            )
            self._block_size[sharedmem] = size
        return size


def linked(image, state) -> LinkedKernel:
    """``image`` linked for ``state``'s device: from memory, disk, or the linker."""
    key = (image.hash, state.id)
    kernel = module_cache.lookup(key)
    if kernel is not None:
        return kernel

    def build():
        versions = (driver_version(), nvjitlink_version())
        cache_dir = _config.get("cache-dir")
        disk = DiskCache(cache_dir) if cache_dir else None
        cubin = disk.load(image.hash, state.cc, versions) if disk else None
        if cubin is not None:
            try:
                return LinkedKernel(image, state, cubin)
            except Exception:  # a damaged cache file: link afresh and replace it
                pass
        cubin = link_cubin(image, state.cc)
        if disk:
            disk.store(image.hash, state.cc, versions, cubin)
        return LinkedKernel(image, state, cubin)

    return module_cache.get(key, build)


def launch_dims(config, kernel: LinkedKernel, max_grid=(2**31 - 1, 65535, 65535)):
    """``(griddim, blockdim)`` as 3-tuples; forall configs get occupancy blocks."""
    if config.ntasks is None:
        return config.griddim, config.blockdim
    ntasks = config.ntasks if isinstance(config.ntasks, tuple) else (config.ntasks,)
    size = config.tpb or kernel.block_size(config.sharedmem)
    block = fit_grid(ntasks, block_shape(size, ntasks), max_grid)
    grid = tuple(max(1, -(-n // b)) for n, b in zip(ntasks, block))
    return _pad3(grid), _pad3(block)


_MAX_BLOCK = (1024, 1024, 64)


def fit_grid(ntasks: tuple, block: tuple, max_grid: tuple) -> tuple:
    """``block`` reshaped, its thread count kept, so that no grid axis exceeds its limit.

    The y and z grid axes take at most 65535 blocks: an axis of more tasks
    gets more threads of the block, taken from the axes that need them least.
    """
    block = list(block)
    total = math.prod(block)
    for axis, n in enumerate(ntasks):
        need = -(-n // max_grid[axis])
        while block[axis] < need:
            if block[axis] * 2 > _MAX_BLOCK[axis]:
                raise LaunchConfigError(
                    f"forall over {ntasks} tasks needs more than {max_grid[axis]} blocks "
                    f"along axis {axis} even with {block[axis]} threads of each block there; "
                    "the device cannot launch that grid. Put the longest axis first "
                    "(grid x allows 2**31 - 1 blocks) or split the launch."
                )
            block[axis] *= 2
            others = [a for a in range(len(block)) if a != axis and block[a] > 1]
            if math.prod(block) > total and others:
                widest = max(others, key=lambda a: block[a])
                block[widest] //= 2
    return tuple(block)


def block_shape(size: int, ntasks: tuple) -> tuple:
    """A block of at most ``size`` threads for an N-D forall over ``ntasks``.

    Kernels index ``a[i, j]`` with ``i, j = cuda.grid(2)``, so the last axis is
    the contiguous one of a C-ordered chunk. A warp is 32 consecutive threads
    in x-fastest order; blocks one thread wide in x (and y, for 3-D) make each
    warp run along the last axis, where its loads coalesce.
    """
    if len(ntasks) == 1:
        return (size,)
    inner_limit = 1024 if len(ntasks) == 2 else 64  # the device's block y / z limits
    last = _pow2_at_least(ntasks[-1])
    if last >= 32:  # a whole warp fits along the last axis: give it all of x (and y)
        return (1,) * (len(ntasks) - 1) + (min(size, inner_limit, last),)
    rest = max(1, size // last)
    if len(ntasks) == 2:
        return (rest, last)
    middle = min(rest, _pow2_at_least(ntasks[1]))
    return (max(1, rest // middle), middle, last)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _pad3(dims):
    return tuple(dims) + (1,) * (3 - len(dims))


def stream_handle(stream) -> int:
    """The ``CUstream`` address of a stream given as int or stream object."""
    if not stream:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("ptr", "handle", "cuda_stream"):
        h = getattr(stream, attr, None)
        if h is not None:
            return int(getattr(h, "value", h) or 0)
    raise TypeError(
        f"cannot use {type(stream).__name__} as a CUDA stream; pass an int handle "
        "or an object with __cuda_stream__ (cuda.core, CuPy) or .handle (Numba)"
    )


class _HostStaging:
    """Device copies of the host arrays of one launch, freed on exit.

    Arrays of at least ``daskgpu.pipeline-min-bytes`` go through the pinned
    pipeline of :class:`~daskgpu._runtime.staging.Stager`; smaller ones are
    copied directly, where a pipeline's set-up would cost more than it saves.
    (Page-locking inputs in place instead measured 25% slower on the H200
    host: 0.19-0.21 s against 0.15-0.17 s for the map-host bench; locking
    inner pieces on one more thread beside the copy threads, 13% slower.) Arrays
    already page-locked, such as the outputs made here, are copied directly
    at DMA speed, and large fresh outputs are given page-locked memory from
    :func:`pinned_outputs`.
    """

    def __init__(self, stream):
        self.stream = stream
        self.allocations = []
        self.allocated_bytes = 0
        self.copy_back = []
        self.keep = []  # host sources of asynchronous copies, alive until finish()
        self.min_pipelined = int(_config.get("pipeline-min-bytes"))

    def stage(self, arg, written: bool):
        """Copy host array ``arg`` to the device; return ``(ptr, shape, strides, itemsize)``.

        A :class:`~daskgpu._image.array_info.Zeroed` output is zero-filled on the device
        instead of copied.
        """
        hint = type(arg).__name__ if type(arg).__module__ == "numba.cuda.args" else None
        if hint is not None:
            # numba-cuda's cuda.In / Out / InOut name the copies: In copies in
            # only, Out copies back only, InOut both, whatever the kernel writes.
            written = hint != "In"
            arg = Zeroed(arg.value) if hint == "Out" else arg.value
        fresh = type(arg) is Zeroed
        array = arg.array if fresh else arg
        host = array
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            host = np.ascontiguousarray(array)
        if host.nbytes == 0:
            return (0, host.shape, host.strides, host.itemsize)
        # Small copies go directly: the driver's own staging is as fast there.
        direct = host.nbytes < self.min_pipelined
        if fresh and not direct and hint is None:  # the user's Out array must be filled
            locked = pinned_outputs().empty(host.shape, host.dtype,
                                            "F" if _is_f_only(host) else "C")
            if locked is not None:  # None: the pool is full of live outputs
                arg.array = array = host = locked
                direct = True
        elif not direct:
            direct = is_page_locked(host)
        dptr = self._allocate(host.nbytes)
        self.allocations.append(dptr)
        self.allocated_bytes += host.nbytes
        if fresh:
            check(driver.cuMemsetD8Async(dptr, 0, host.nbytes, self.stream), "cuMemsetD8Async")
        elif direct:
            check(
                driver.cuMemcpyHtoDAsync(dptr, host.ctypes.data, host.nbytes, self.stream),
                "cuMemcpyHtoDAsync",
            )
        else:
            stager().to_device(dptr, host, self.stream)
        if written:
            self.copy_back.append((array, host, dptr, direct))
        return (int(dptr), host.shape, host.strides, host.itemsize)

    def stage_record(self, record, written: bool) -> int:
        """Copy record scalar ``record`` to the device; return its device address.

        Numba passes a record by reference to a device copy and copies it back
        after the launch (``cuda.InOut``): a written record comes back in
        place, into the array it is an element of when it is one.
        """
        host = np.empty(1, record.dtype)
        host[0] = record
        dptr = self._allocate(host.nbytes)
        self.allocations.append(dptr)
        self.allocated_bytes += host.nbytes
        check(
            driver.cuMemcpyHtoDAsync(dptr, host.ctypes.data, host.nbytes, self.stream),
            "cuMemcpyHtoDAsync",
        )
        self.keep.append(host)
        if written:
            self.copy_back.append((record, host, dptr, True))
        return int(dptr)

    def _allocate(self, nbytes: int):
        err, dptr = driver.cuMemAllocAsync(nbytes, self.stream)
        if err == _SUCCESS:
            return dptr
        if err == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
            raise DeviceError(out_of_memory_message(nbytes, self.allocated_bytes, free, total))
        raise cuda_error(err, "cuMemAllocAsync")

    def finish(self):
        """Copy written arrays back and wait for them."""
        for array, host, dptr, direct in self.copy_back:
            if direct:
                check(
                    driver.cuMemcpyDtoHAsync(host.ctypes.data, dptr, host.nbytes, self.stream),
                    "cuMemcpyDtoHAsync",
                )
            else:
                stager().to_host(host, dptr, self.stream)
        check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        for array, host, *_ in self.copy_back:
            if type(array) is np.void or isinstance(array, np.void):
                # A record scalar cannot take a[...] = ...; its fields can,
                # and write through to the array it views.
                for name in array.dtype.names:
                    array[name] = host[0][name]
            elif host is not array:
                array[...] = host
        self.keep.clear()

    def free(self):
        for dptr in self.allocations:
            driver.cuMemFreeAsync(dptr, self.stream)
        self.allocations.clear()


def out_of_memory_message(nbytes: int, staged: int, free: int, total: int) -> str:
    """What to say when a host array's device copy does not fit."""
    gib = 1 << 30
    return (
        f"a host array of {nbytes / gib:.2f} GiB does not fit on the GPU: "
        f"{free / gib:.2f} GiB of {total / gib:.2f} GiB are free"
        + (f", with {staged / gib:.2f} GiB of this launch's arrays already there" if staged else "")
        + ". Nothing was launched and the arrays are unchanged. Use smaller chunks "
        "(rechunk the dask arrays given to map_kernel), pass device arrays that are "
        "already on the GPU, or free device memory held elsewhere."
    )


def _one_per_process(make):
    """``make()`` once, also when several threads ask first at the same moment.

    ``functools.cache`` would let each of them make its own, and a second
    copy pipeline or output pool would hold page-locked memory past its bound.
    """
    made = []
    lock = threading.Lock()

    @functools.wraps(make)
    def get():
        if not made:
            with lock:
                if not made:
                    made.append(make())
        return made[0]

    return get


@_one_per_process
def stager() -> Stager:
    """The process's pinned copy pipeline, made on first large host copy."""
    pool = PinnedPool(int(_config.get("pinned-slot-bytes")), int(_config.get("pinned-pool-bytes")))
    return Stager(pool, threads=int(_config.get("copy-threads")))


@_one_per_process
def pinned_outputs() -> PinnedArrays:
    """The process's recycled page-locked memory for large fresh outputs."""
    return PinnedArrays(int(_config.get("pinned-output-bytes")))


def _is_f_only(array) -> bool:
    return array.flags.f_contiguous and not array.flags.c_contiguous


_DEFAULT_STREAM = driver.CUstream(0)
_cuLaunchKernel = driver.cuLaunchKernel  # looked up once: it is on every launch


def run(image, config, args, infos):
    """Launch ``image`` with ``config`` on ``args``, whose :func:`array_info` are ``infos``.

    Host arrays are copied in, and those the kernel writes copied back, before
    this returns; launches on device arrays only are asynchronous, as in Numba.
    """
    if config.ntasks is not None and 0 in (
            config.ntasks if isinstance(config.ntasks, tuple) else (config.ntasks,)):
        return  # forall over no tasks launches nothing, as in Numba
    state = _device.current()
    kernel = linked(image, state)
    griddim, blockdim = kernel.dims(config, state, image.name)
    if config.stream:
        stream = driver.CUstream(stream_handle(config.stream))
    elif _host_only(infos):
        stream = _device.thread_stream()
    else:
        stream = _DEFAULT_STREAM
    writes = image.writes
    staging = None
    values = []
    try:
        for i, spec in enumerate(image.args):
            info = infos[i]
            if info is None:
                if spec.kind == "record":  # by value: a pointer to a device copy
                    staging = staging or _HostStaging(stream)
                    flatten(spec, staging.stage_record(args[i], i in writes), values)
                elif spec.kind == "tuple":
                    staging = staging or _HostStaging(stream)
                    _flatten_tuple(spec, args[i], staging, i in writes, values)
                else:
                    flatten(spec, args[i], values)
            elif info.on_host:
                staging = staging or _HostStaging(stream)
                flatten(spec, staging.stage(args[i], i in writes), values)
            else:
                dtype, shape, strides, ptr = info
                values += (0, 0, _nitems(shape), dtype.itemsize, ptr)
                values += shape
                values += strides
                if READERS.get(type(args[i])) in CAI_READERS:
                    sync_producer_stream(args[i], stream)
        params = kernel.layout.pack(values)
        if kernel.errcode is not None:
            check(driver.cuMemsetD32Async(kernel.errcode, 0, 1, stream), "cuMemsetD32Async")
        if kernel.cooperative:
            err = driver.cuLaunchCooperativeKernel(
                kernel.function, *griddim, *blockdim, config.sharedmem, stream, params
            )[0]
        else:
            err = _cuLaunchKernel(
                kernel.function, *griddim, *blockdim, config.sharedmem, stream, params, 0
            )[0]
        if err != _SUCCESS:  # the message is only formatted when needed
            raise cuda_error(err, f"launching kernel {image.name!r}")
        if staging is not None:
            staging.finish()
        if kernel.errcode is not None:
            exc = kernel.raised(image, stream)
            if exc is not None:
                raise exc
    except CUDAError as exc:
        if exc.sticky:
            staging = None  # the context is gone: nothing can be freed any more
            replace_worker_process(exc)
        raise
    finally:
        if staging is not None:
            staging.free()


# As numba-cuda's NUMBA_CUDA_ARRAY_INTERFACE_SYNC: wait for the stream that an
# array's producer names in its CUDA array interface before launching on it.
_CAI_SYNC = os.environ.get("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "1") not in ("0", "")


def sync_producer_stream(value, stream) -> bool:
    """Synchronise the ``stream`` of ``value``'s CUDA array interface, as Numba does.

    The legacy default stream (1) needs nothing when the launch is on it too:
    it orders itself after every blocking stream's work. Returns whether it waited.
    """
    if not _CAI_SYNC:
        return False
    handle = value.__cuda_array_interface__.get("stream")
    if not isinstance(handle, int) or handle == 0:
        return False  # None: the producer says no synchronisation is needed
    launch = int(stream)
    if handle == launch or (handle == 1 and launch == 0):
        return False
    check(driver.cuStreamSynchronize(driver.CUstream(handle)), "cuStreamSynchronize")
    return True


def _flatten_tuple(spec, value, staging, written, values):
    """A tuple's members as numba flattens them; host arrays in it are staged."""
    for member, item in zip(spec.members, passed_value(value)):
        if member.kind == "tuple":
            _flatten_tuple(member, item, staging, written, values)
        elif member.kind == "record":
            flatten(member, staging.stage_record(item, written), values)
        elif member.is_array:
            info = array_info(item)
            if info.on_host:
                flatten(member, staging.stage(item, written), values)
            else:
                dtype, shape, strides, ptr = info
                values += (0, 0, _nitems(shape), dtype.itemsize, ptr, *shape, *strides)
        else:
            flatten(member, item, values)


#: Factories of the repeat-launch functions, one per shape of signature.
fast_factories = FastFactories()


def device_launch(image, config, infos, args=(), images=()):
    """A function repeating this launch on new arguments, or None when it would not apply.

    It applies to launches on the legacy default stream whose arrays are all
    on the device, of kernels compiled without ``debug``; call it after
    :func:`run` succeeded, so the configuration has been checked. It keeps
    what that launch looked up (the device, the linked kernel, the checked
    grid and block) and per call only matches and packs the arguments (see
    :func:`~daskgpu._runtime.marshal.fast_source`). Anything it does not cover
    (host arrays, another thread's device, arguments that do not match)
    returns ``NotImplemented``, and the caller takes the general path.
    ``args`` are this launch's: a CuPy or Numba device array among them makes
    the function read that type's attributes directly instead of its
    interface dictionary. ``images`` is the container of the kernel's images
    (it may grow as a client kernel compiles): with one, the function takes
    what ``image``'s specs match while there is one; else only arguments that
    need no conversion, for which select_image picks its first image, ``image``.
    """
    if config.stream or any(info is not None and info.on_host for info in infos):
        return None
    if any(spec.kind in ("record", "tuple") for spec in image.args):  # staged per launch
        return None
    if config.ntasks is not None and 0 in (
            config.ntasks if isinstance(config.ntasks, tuple) else (config.ntasks,)):
        return None
    state = _device.current()
    kernel = linked(image, state)
    if kernel.errcode is not None or kernel.cooperative:
        return None
    exact = len(images) != 1
    if exact and any(spec.is_array and spec.layout == "A" and spec.ndim > 1
                     for spec in image.args):
        return None  # select_image counts these as a conversion: another image may win
    griddim, blockdim = kernel.dims(config, state, image.name)
    make = fast_factories.get(fast_source(image.args, image.writes, exact))
    layout = kernel.layout
    return make(
        # Holding the LinkedKernel keeps its module loaded, even once evicted
        # from the module cache.
        kernel=kernel, state=state, device_thread=_device._thread,
        local=threading.local(), layout=layout, buffers=lambda: layout.buffers()[::2],
        pack_into=fast_struct(image.args).pack_into, launch=_cuLaunchKernel,
        function=kernel.function, stream=_DEFAULT_STREAM,
        g0=griddim[0], g1=griddim[1], g2=griddim[2],
        b0=blockdim[0], b1=blockdim[1], b2=blockdim[2], shm=config.sharedmem,
        name=image.name, images=images, CUPY=_cupy_type(args), NUMBA=_numba_type(args),
        device_info=_device_info, sync_producer=_sync_producer,
        failed=_launch_failed, SUCCESS=_SUCCESS, **fast_constants(image.args, exact),
    )


class _NoType:
    """The type of no argument: the CuPy branch of a function bound without CuPy."""


def _cupy_type(args):
    for a in args:
        if READERS.get(type(a)) is read_cupy:
            return type(a)
    return _NoType


def _numba_type(args):
    # Known by name: the worker half never imports numba. Subclasses (mapped,
    # managed arrays) go through their interface.
    for a in args:
        cls = type(a)
        if cls.__name__ == "DeviceNDArray" and cls.__module__ == "numba.cuda.cudadrv.devicearray":
            return cls
    return _NoType


def _sync_producer(value):
    sync_producer_stream(value, _DEFAULT_STREAM)


def _device_info(value):
    """``(dtype, shape, strides, pointer)`` of a device array, else None.

    The producer stream that the array's CUDA array interface names is waited
    for, as on the general path.
    """
    reader = READERS.get(type(value))
    if reader is None:  # numpy arrays, and types not seen yet: the general path
        return None
    info = reader(value)
    if info is None or info.on_host:
        return None
    if reader in CAI_READERS:
        sync_producer_stream(value, _DEFAULT_STREAM)
    return info


def _launch_failed(err, name):
    exc = cuda_error(err, f"launching kernel {name!r}")
    if exc.sticky:
        replace_worker_process(exc)
    raise exc


def _read_int(dptr) -> int:
    value = np.zeros(1, np.int32)
    check(driver.cuMemcpyDtoH(value.ctypes.data, dptr, 4), "cuMemcpyDtoH")
    return int(value[0])


def _host_only(infos) -> bool:
    # With device arrays in the mix, the legacy default stream keeps the launch
    # ordered after the caller's own work on them (as Numba's launches are).
    has_host = False
    for info in infos:
        if info is not None:
            if not info.on_host:
                return False
            has_host = True
    return has_host


def _nitems(shape):
    n = 1
    for d in shape:
        n *= d
    return n
