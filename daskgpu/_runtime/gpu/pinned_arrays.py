"""Page-locked numpy arrays for launch outputs, recycled when the arrays die.

A kernel's output chunk that lives in page-locked memory comes back from the
GPU by DMA alone: no pinned slot, no CPU copy and no first touch of fresh
pages, which together cost a 64 MiB output three times its DMA on the H200
host. Page-locking is slow (about 13 ms for 64 MiB there), so buffers are kept
and handed out again once every array viewing them has been freed, as happens
to Dask's chunks when their keys are released.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np
from cuda.bindings import driver

from daskgpu._runtime.gpu.driver import SUCCESS, check

_MEMORY_TYPE = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
_HOST = int(driver.CUmemorytype.CU_MEMORYTYPE_HOST)


def is_page_locked(array: np.ndarray) -> bool:
    """Whether the driver can DMA ``array``'s bytes directly (first and last byte pinned)."""
    start = array.ctypes.data
    for address in (start, start + array.nbytes - 1):
        err, kind = driver.cuPointerGetAttribute(_MEMORY_TYPE, address)
        if err != SUCCESS or int(kind) != _HOST:
            return False
    return True


class PageLockedBuffer:
    """``nbytes`` of host memory, page-locked in place for every context."""

    __slots__ = ("array",)

    def __init__(self, nbytes: int):
        # Locking numpy's pages in place takes a third of cuMemHostAlloc's time
        # for fresh memory (13 against 35 ms for 64 MiB on the H200 host).
        self.array = np.empty(nbytes, np.uint8)
        check(driver.cuMemHostRegister(self.array.ctypes.data, nbytes,
                                       driver.CU_MEMHOSTREGISTER_PORTABLE),
              "cuMemHostRegister")

    def free(self) -> None:
        driver.cuMemHostUnregister(self.array.ctypes.data)
        self.array = None


class _Lease:
    """Owner of one handed-out buffer: the base of the arrays viewing it.

    When the last view dies, numpy drops its base and the buffer goes back to
    the pool. The return is an append to a deque, safe from any thread and
    from a finalizer, so that no lock is taken there.
    """

    __slots__ = ("buffer", "returned", "__array_interface__")

    def __init__(self, buffer, returned: deque):
        self.buffer = buffer
        self.returned = returned
        self.__array_interface__ = buffer.array.__array_interface__

    def __del__(self):
        self.returned.append(self.buffer)


class PinnedArrays:
    """Recycled page-locked host arrays, at most ``max_bytes`` of them in all.

    Buffers are keyed by size, rounded up to ``granule`` bytes. Those in use
    count against the bound; idle ones are freed, least recently used first,
    when a new size needs the room. When the arrays in use alone fill the
    bound, :meth:`empty` returns None and the caller uses pageable memory.

    Parameters
    ----------
    max_bytes : int
        Bound on page-locked bytes, in use and idle (``daskgpu.pinned-output-bytes``).
    granule : int
        Sizes are rounded up to a multiple of this, so that chunks differing
        by a little share buffers.
    new_buffer : callable
        ``new_buffer(nbytes)`` gives an object with a uint8 ``array`` of
        ``nbytes`` and a ``free()`` method.
    """

    def __init__(self, max_bytes: int, granule: int = 2 << 20, new_buffer=PageLockedBuffer):
        self.max_bytes = max_bytes
        self.granule = granule
        self.new_buffer = new_buffer
        self.made = 0  # buffers ever made, to tell recycling from making in tests and benches
        self._held_bytes = 0  # in use and idle
        self._idle: dict = {}  # nbytes -> [buffer]; dicts keep insertion order, oldest first
        self._returned = deque()
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """Page-locked bytes held, in use and idle."""
        return self._held_bytes

    def empty(self, shape, dtype, order: str = "C"):
        """A page-locked array like ``np.empty(shape, dtype, order=order)``, or None when full."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        size = -(-max(nbytes, 1) // self.granule) * self.granule
        buffer = self._take(size)
        if buffer is None:
            return None
        flat = np.asarray(_Lease(buffer, self._returned))
        return flat[:nbytes].view(dtype).reshape(shape, order=order)

    def _take(self, size: int):
        with self._lock:
            self._collect_returned()
            idle = self._idle.get(size)
            if idle:
                buffer = idle.pop()
                if not idle:
                    del self._idle[size]
                return buffer
            if not self._make_room(size):
                return None
            self._held_bytes += size
        try:  # locking pages is slow: outside the lock, other threads may take idle ones
            buffer = self.new_buffer(size)
        except BaseException:
            with self._lock:
                self._held_bytes -= size
            raise
        with self._lock:
            self.made += 1
        return buffer

    def _collect_returned(self) -> None:
        while self._returned:
            buffer = self._returned.popleft()
            size = buffer.array.nbytes
            self._idle.setdefault(size, []).append(buffer)
            self._idle[size] = self._idle.pop(size)  # most recently used last

    def _make_room(self, size: int) -> bool:
        """Free idle buffers, oldest size first, until ``size`` more fits."""
        while self._held_bytes + size > self.max_bytes and self._idle:
            oldest = next(iter(self._idle))
            buffers = self._idle[oldest]
            buffers.pop().free()
            self._held_bytes -= oldest
            if not buffers:
                del self._idle[oldest]
        return self._held_bytes + size <= self.max_bytes

    def clear(self) -> None:
        """Free the idle buffers; those in use are kept until their arrays die."""
        with self._lock:
            self._collect_returned()
            for size, buffers in self._idle.items():
                for buffer in buffers:
                    buffer.free()
                    self._held_bytes -= size
            self._idle.clear()
