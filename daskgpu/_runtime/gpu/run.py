"""Run one launch of a :class:`KernelImage` on this thread's GPU: the general path.

Every launch can take this path: host arrays (staged by
:class:`~daskgpu._runtime.gpu.host_staging.HostStaging`), records and tuples,
streams, debug and cooperative kernels. Repeats on device arrays take the
generated :mod:`~daskgpu._runtime.gpu.fast_path` once this path has run.

A sticky CUDA error comes out as a :class:`~daskgpu._errors.ContextLostError`,
naming the launch it was met after (:func:`~daskgpu._runtime.faults.launch_site`);
the runtime does nothing else about it.
"""

from __future__ import annotations

import math
import os
import threading

from cuda.bindings import driver

from daskgpu._errors import CUDAError
from daskgpu._image.argspec import passed_value
from daskgpu._image.array_info import CAI_READERS, READERS, array_info
from daskgpu._image.launch_config import task_counts
from daskgpu._runtime import metrics
from daskgpu._runtime.faults import launch_site
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
    While someone looks (:data:`daskgpu._runtime.metrics.hook`), the launch is
    an NVTX range and reports its time by activity (see :class:`LaunchTimes`).
    """
    if config.ntasks is not None and 0 in task_counts(config):
        return  # forall over no tasks launches nothing, as in Numba
    meter = metrics.hook
    if meter is None:
        _run(image, config, args, infos, UNTIMED)
        return
    meter.push(image.name)
    try:
        _run(image, config, args, infos, LaunchTimes(meter, image.name))
    finally:
        meter.pop()


def _run(image, config, args, infos, times):
    state = _device.current()
    kernel = linked(image, state)  # reports its own link time
    griddim, blockdim = kernel.dims(config, state, image.name)
    if config.stream:
        stream = driver.CUstream(stream_handle(config.stream))
    elif _host_only(infos):
        stream = _device.thread_stream()
    else:
        stream = DEFAULT_STREAM
    times.linked(stream, state)
    writes = image.writes
    staging = None
    launched = False
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
        times.launching(stream)
        if kernel.cooperative:
            err = driver.cuLaunchCooperativeKernel(
                kernel.function, *griddim, *blockdim, config.sharedmem, stream, params
            )[0]
        else:
            err = launch_kernel(
                kernel.function, *griddim, *blockdim, config.sharedmem, stream, params, 0
            )[0]
        if err != SUCCESS:  # the message is only formatted when needed
            raise cuda_error(err, f"launching {launch_site(image.name, griddim, blockdim)}")
        launched = True
        times.launched(stream, staging is not None)
        if staging is not None:
            staging.finish()
            times.waited()
        if kernel.errcode is not None:
            exc = kernel.raised(image, stream, (griddim, blockdim))
            if exc is not None:
                raise exc
    except CUDAError as exc:
        if exc.sticky:
            staging = None  # the context is gone: nothing can be freed any more
            if launched:
                raise _kernel_fault(exc, image, griddim, blockdim) from None
        raise
    finally:
        if staging is not None:
            staging.free()


def _kernel_fault(exc, image, griddim, blockdim):
    """The sticky error ``exc``, met while waiting for a launch, saying which launch.

    The driver names no thread (compute-sanitizer does), and the fault may be
    that of work queued on the device before this launch.
    """
    site = launch_site(image.name, griddim, blockdim)
    fault = type(exc)(exc.code, (
        f"{site} failed: {exc} The driver does not say which thread; the fault is this "
        "launch's, or that of asynchronous work queued before it on the device. Run the "
        "program under compute-sanitizer to find the thread and the line."))
    return fault.with_traceback(exc.__traceback__)


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


class LaunchTimes:
    """The activities of one general-path launch, reported to a meter as it goes.

    From the end of linking (which :func:`~daskgpu._runtime.gpu.linked_kernel.linked`
    reports) to the launch, the host stages: ``copy-in`` when the launch has
    host arrays to copy back, else that and the launch itself are ``launch``,
    and the kernel runs unmeasured, as nothing waits for it. A launch with host
    arrays waits for its copies back anyway; that wait is split by CUDA events,
    read once it is over (no wait is added): first what the input copies still
    took on the device after the host had queued them (``copy-in``), then the
    kernel's own time (``kernel``), and the rest (``copy-out``). Work queued on
    the stream before this launch (another launch of a fused task) falls in the
    rest too. The parts add up to the host's wall time, so that distributed's
    fine performance metrics stay additive.
    """

    __slots__ = ("meter", "name", "mark", "launch_at", "events")

    def __init__(self, meter, name: str):
        self.meter, self.name = meter, name
        self.mark = self.launch_at = metrics.clock()
        self.events = ()

    def linked(self, stream, state) -> None:
        """The kernel is linked: staging starts."""
        self.events = _thread_events(state)
        driver.cuEventRecord(self.events[0], stream)
        self.mark = metrics.clock()

    def launching(self, stream) -> None:
        """The kernel is about to be launched."""
        self.launch_at = metrics.clock()
        driver.cuEventRecord(self.events[1], stream)

    def launched(self, stream, staged: bool) -> None:
        """The launch is queued; ``staged``: host arrays are to come back, else it is done."""
        if staged:
            driver.cuEventRecord(self.events[2], stream)
        else:
            self.meter.record(self.name, "launch", metrics.clock() - self.mark)

    def waited(self) -> None:
        """The host arrays are back: split the wait since the launch."""
        end = metrics.clock()
        staged, wait = self.launch_at - self.mark, end - self.launch_at
        inputs, kernel = _elapsed(*self.events[:2]), _elapsed(*self.events[1:])
        # The device cannot have started the copies before the host queued them.
        tail = min(max(inputs - staged, 0.0), wait)
        kernel = min(kernel, wait - tail)
        record = self.meter.record
        record(self.name, "copy-in", staged + tail)
        record(self.name, "kernel", kernel)
        record(self.name, "copy-out", wait - tail - kernel)


class Untimed:
    """The :class:`LaunchTimes` of a launch that nobody looks at: it does nothing."""

    __slots__ = ()

    def linked(self, stream, state) -> None:
        pass

    def launching(self, stream) -> None:
        pass

    def launched(self, stream, staged: bool) -> None:
        pass

    def waited(self) -> None:
        pass


UNTIMED = Untimed()

_events = threading.local()  # per thread: {device id: three timing events}


def _thread_events(state) -> tuple:
    """This thread's three timing events on ``state``'s device, made on first use."""
    made = getattr(_events, "by_device", None)
    if made is None:
        made = _events.by_device = {}
    events = made.get(state.id)
    if events is None:
        events = made[state.id] = tuple(
            check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
            for _ in range(3))
    return events


def _elapsed(start, stop) -> float:
    """Seconds between two completed events; 0 where the driver cannot tell."""
    err, ms = driver.cuEventElapsedTime(start, stop)
    return ms / 1000.0 if err == SUCCESS else 0.0
