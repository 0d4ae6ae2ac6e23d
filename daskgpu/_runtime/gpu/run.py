"""Run one launch of a :class:`KernelImage` on this thread's GPU: the general path.

Every launch can take this path: host arrays (staged by
:class:`~daskgpu._runtime.gpu.host_staging.HostStaging`), records and tuples,
streams, debug and cooperative kernels. Repeats on device arrays take the
generated :mod:`~daskgpu._runtime.gpu.fast_path` once this path has run.

A sticky CUDA error comes out as a :class:`~daskgpu._errors.ContextLostError`;
the runtime does nothing else about it.
"""

from __future__ import annotations

import math
import os

from cuda.bindings import driver

from daskgpu._errors import CUDAError
from daskgpu._image.argspec import passed_value
from daskgpu._image.array_info import CAI_READERS, READERS, array_info
from daskgpu._image.launch_config import task_counts
from daskgpu._runtime.gpu import device as _device
from daskgpu._runtime.gpu.driver import (
    DEFAULT_STREAM,
    SUCCESS,
    check,
    cuda_error,
    launch_kernel,
)
from daskgpu._runtime.gpu.host_staging import HostStaging
from daskgpu._runtime.gpu.linked_kernel import linked
from daskgpu._runtime.gpu.marshal import flatten


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


def run(image, config, args, infos):
    """Launch ``image`` with ``config`` on ``args``, whose :func:`array_info` are ``infos``.

    Host arrays are copied in, and those the kernel writes copied back, before
    this returns; launches on device arrays only are asynchronous, as in Numba.
    """
    if config.ntasks is not None and 0 in task_counts(config):
        return  # forall over no tasks launches nothing, as in Numba
    state = _device.current()
    kernel = linked(image, state)
    griddim, blockdim = kernel.dims(config, state, image.name)
    if config.stream:
        stream = driver.CUstream(stream_handle(config.stream))
    elif _host_only(infos):
        stream = _device.thread_stream()
    else:
        stream = DEFAULT_STREAM
    writes = image.writes
    staging = None
    values = []
    try:
        for i, spec in enumerate(image.args):
            info = infos[i]
            if info is None:
                if spec.kind == "record":  # by value: a pointer to a device copy
                    staging = staging or HostStaging(stream)
                    flatten(spec, staging.stage_record(args[i], i in writes), values)
                elif spec.kind == "tuple":
                    staging = staging or HostStaging(stream)
                    _flatten_tuple(spec, args[i], staging, i in writes, values)
                else:
                    flatten(spec, args[i], values)
            elif info.on_host:
                staging = staging or HostStaging(stream)
                flatten(spec, staging.stage(args[i], i in writes), values)
            else:
                dtype, shape, strides, ptr = info
                values += (0, 0, math.prod(shape), dtype.itemsize, ptr)
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
            err = launch_kernel(
                kernel.function, *griddim, *blockdim, config.sharedmem, stream, params, 0
            )[0]
        if err != SUCCESS:  # the message is only formatted when needed
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
                values += (0, 0, math.prod(shape), dtype.itemsize, ptr, *shape, *strides)
        else:
            flatten(member, item, values)


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
