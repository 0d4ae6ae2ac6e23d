"""Host arrays of one launch staged on the device, and the process's page-locked pools.

:class:`HostStaging` copies a launch's host arrays in and the written ones
back; :func:`stager` and :func:`pinned_outputs` are the one copy pipeline and
the one pool of page-locked outputs of the process, made on first use.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
from cuda.bindings import driver

from daskgpu import _config
from daskgpu._errors import DeviceError
from daskgpu._image.array_info import Zeroed
from daskgpu._runtime.gpu.copy_pipeline import PinnedPool, Stager, memory_order
from daskgpu._runtime.gpu.driver import SUCCESS, check, cuda_error
from daskgpu._runtime.gpu.pinned_arrays import PinnedArrays, is_page_locked


class HostStaging:
    """Device copies of the host arrays of one launch, freed on exit.

    Arrays of at least ``daskgpu.pipeline-min-bytes`` go through the pinned
    pipeline of :class:`~daskgpu._runtime.gpu.copy_pipeline.Stager`; smaller ones are
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
            locked = pinned_outputs().empty(host.shape, host.dtype, memory_order(host))
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
        if err == SUCCESS:
            return dptr
        if err == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
            raise DeviceError(out_of_memory_message(nbytes, self.allocated_bytes, free, total))
        raise cuda_error(err, "cuMemAllocAsync")

    def finish(self):
        """Copy written arrays back and wait for them."""
        for _array, host, dptr, direct in self.copy_back:
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
        """Free the device copies, in stream order (unchecked: also after a failed launch)."""
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


def one_per_process(make):
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


@one_per_process
def stager() -> Stager:
    """The process's pinned copy pipeline, made on first large host copy."""
    pool = PinnedPool(int(_config.get("pinned-slot-bytes")), int(_config.get("pinned-pool-bytes")))
    return Stager(pool, threads=int(_config.get("copy-threads")))


@one_per_process
def pinned_outputs() -> PinnedArrays:
    """The process's recycled page-locked memory for large fresh outputs."""
    return PinnedArrays(int(_config.get("pinned-output-bytes")))
