"""A fused task's arrays on the device: :class:`DeviceChain` and its :class:`DeviceView`.

When ``map_kernel`` fuses consecutive launches over the same chunks into one
task, :class:`DeviceChain` keeps their inputs and intermediates on the device
as :class:`DeviceView` arrays, freed when the task ends.
"""

from __future__ import annotations

import math

import numpy as np
from cuda.bindings import driver

from daskgpu import _config
from daskgpu._image.array_info import c_strides
from daskgpu._runtime import metrics
from daskgpu._runtime.gpu import device as _device
from daskgpu._runtime.gpu.copy_pipeline import memory_order
from daskgpu._runtime.gpu.driver import check
from daskgpu._runtime.gpu.pinned_arrays import is_page_locked

__all__ = ["DeviceChain", "DeviceView", "zeroed"]


class DeviceView:
    """A device allocation seen as an array through ``__cuda_array_interface__``.

    It does not own its memory: the :class:`DeviceChain` that made it frees
    it, after the last launch queued on it; or ``owner``, which the view keeps
    alive (a :class:`~daskgpu._runtime.gpu.random_states.DeviceStates`
    allocation, say), frees it once no view is left.
    """

    __slots__ = ("ptr", "shape", "dtype", "strides", "owner", "__weakref__")

    def __init__(self, ptr: int, shape: tuple, dtype, order: str = "C", owner=None):
        self.ptr, self.shape, self.dtype = int(ptr), tuple(shape), np.dtype(dtype)
        itemsize = self.dtype.itemsize
        # Fortran order: the C strides of the reversed shape, reversed.
        self.strides = (c_strides(self.shape[::-1], itemsize)[::-1] if order == "F"
                        else c_strides(self.shape, itemsize))
        self.owner = owner

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        # No stream: the owner queues every use on the one stream that made it.
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr,
                "data": (self.ptr, False), "strides": self.strides, "version": 3,
                "stream": None}

    def __repr__(self):
        return f"<DeviceView {self.dtype} {self.shape} at {self.ptr:#x}>"


def zeroed(allocate, stream, shape, dtype, order: str = "C") -> DeviceView:
    """A device array of ``shape`` and ``dtype``, its memory from ``allocate(nbytes)``,
    zero-filled in order on ``stream`` (for a chain's intermediate outputs)."""
    view = DeviceView(0, shape, dtype, order)
    view.ptr = allocate(view.nbytes)
    if view.nbytes:
        check(driver.cuMemsetD8Async(view.ptr, 0, view.nbytes, stream), "cuMemsetD8Async")
    return view


class DeviceChain:
    """The device copies and intermediates of one fused task, freed by :meth:`free`.

    When ``map_kernel`` fuses consecutive launches over the same chunks, the
    intermediate chunks never leave the GPU: each host input is copied there
    once, each intermediate output is allocated there, and all of it is freed
    when the task ends. Everything runs on the calling thread's own stream, so
    that two worker threads copy and compute concurrently, as unfused launches
    on host chunks do.

    Host arrays are copied to the device once each however many launches of
    the chain read them (looked up by identity; the chain holds them, so an
    identity cannot be reused while it lives). While someone looks, the host's
    time queuing them is reported as ``copy-in`` under ``name`` to
    :mod:`~daskgpu._runtime.metrics`; what the device still spends on them
    falls in the wait of the chain's last launch.
    """

    def __init__(self, pipeline, name: str = "fused"):
        # pipeline() gives the process's Stager, made on first use
        # (daskgpu._runtime.gpu.host_staging.stager).
        self.pipeline = pipeline
        self.name = name
        _device.current()
        self.stream = _device.thread_stream()
        self.handle = int(self.stream)
        self.min_pipelined = int(_config.get("pipeline-min-bytes"))
        self._copies = {}  # id(host array) -> (host array, DeviceView)
        self._allocations = []

    def _allocate(self, nbytes: int) -> int:
        dptr = check(driver.cuMemAllocAsync(max(nbytes, 1), self.stream), "cuMemAllocAsync")
        self._allocations.append(dptr)
        return int(dptr)

    def to_device(self, host: np.ndarray) -> DeviceView:
        """The device copy of contiguous host array ``host``, queued once per chain."""
        known = self._copies.get(id(host))
        if known is not None:
            return known[1]
        meter = metrics.hook
        start = metrics.clock() if meter is not None else 0.0
        view = DeviceView(self._allocate(host.nbytes), host.shape, host.dtype,
                          memory_order(host))
        if host.nbytes:
            if host.nbytes < self.min_pipelined or is_page_locked(host):
                check(driver.cuMemcpyHtoDAsync(view.ptr, host.ctypes.data, host.nbytes,
                                               self.stream), "cuMemcpyHtoDAsync")
            else:
                self.pipeline().to_device(view.ptr, host, self.stream)
        self._copies[id(host)] = (host, view)
        if meter is not None:
            meter.record(self.name, "copy-in", metrics.clock() - start)
        return view

    def to_host(self, view: DeviceView) -> np.ndarray:
        """A host copy of ``view`` (a C-ordered array of the chain), after every launch
        queued before it: what a task that kept its arrays on the device returns."""
        meter = metrics.hook
        start = metrics.clock() if meter is not None else 0.0
        host = np.empty(view.shape, dtype=view.dtype)
        if view.nbytes:
            check(driver.cuMemcpyDtoHAsync(host.ctypes.data, view.ptr, view.nbytes,
                                           self.stream), "cuMemcpyDtoHAsync")
            check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        if meter is not None:
            meter.record(self.name, "copy-out", metrics.clock() - start)
        return host

    def zeros(self, shape, dtype, order: str = "C") -> DeviceView:
        """A zero-filled device array: an intermediate output of the chain."""
        return zeroed(self._allocate, self.stream, shape, dtype, order)

    def free(self) -> None:
        """Free the chain's device memory, in stream order after its last launch."""
        # Unchecked: after a failed launch this runs while its error propagates,
        # and a context that is gone has nothing left to free.
        for dptr in self._allocations:
            driver.cuMemFreeAsync(dptr, self.stream)
        self._allocations.clear()
        # The host sources of asynchronous copies may go once the copies are done.
        driver.cuStreamSynchronize(self.stream)
        self._copies.clear()
