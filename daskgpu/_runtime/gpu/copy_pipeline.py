"""Host <-> device copies at pinned-memory speed for pageable numpy arrays.

The DMA engines read only page-locked memory at full speed; a pageable numpy
array goes through the driver's own small bounce buffer at a fraction of it.
Large copies here are cut into pieces that several threads copy into a ring of
pinned slots while the DMA engine drains the slots already filled, so CPU
copies and transfers overlap. Slots come from a :class:`PinnedPool` bounded by
``daskgpu.pinned-pool-bytes``; nothing is allocated per launch.

A slot goes back to the pool as soon as its transfer is queued, with the event
of that transfer: whoever takes it next waits for the event before touching
it, so a launch's next input starts while the last one is still in flight.

A fused task's device arrays are :mod:`daskgpu._runtime.gpu.chains`'s.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
from cuda.bindings import driver

from daskgpu._runtime.gpu.driver import check


class PinnedSlot:
    """One page-locked host buffer and the event of its last transfer."""

    __slots__ = ("ptr", "nbytes", "array", "event")

    def __init__(self, nbytes: int):
        self.ptr = check(driver.cuMemHostAlloc(nbytes, driver.CU_MEMHOSTALLOC_PORTABLE),
                         "cuMemHostAlloc")
        self.nbytes = nbytes
        self.array = np.ctypeslib.as_array(_byte_pointer(self.ptr), shape=(nbytes,))
        self.event = check(
            driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate"
        )

    def free(self):
        driver.cuEventSynchronize(self.event)  # its last transfer may still read it
        driver.cuEventDestroy(self.event)
        driver.cuMemFreeHost(self.ptr)


def _byte_pointer(address: int):
    import ctypes

    return ctypes.cast(ctypes.c_void_p(int(address)), ctypes.POINTER(ctypes.c_ubyte))


class PinnedPool:
    """Pinned slots of ``slot_bytes`` each, at most ``max_bytes`` in total.

    A transfer takes a ring of slots for its duration and gives them back;
    when the pool is exhausted, :meth:`acquire` waits for a ring to return.
    """

    def __init__(self, slot_bytes: int, max_bytes: int):
        if slot_bytes <= 0 or max_bytes < slot_bytes:
            raise ValueError(
                f"pinned pool needs 0 < slot_bytes <= max_bytes, got {slot_bytes} and {max_bytes}"
            )
        self.slot_bytes = slot_bytes
        self.max_slots = max_bytes // slot_bytes
        # Oldest given back first: their last transfers are the likeliest to
        # be done, so a launch's next input need not wait on its previous one.
        self._free = deque()
        self._made = 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> list:
        """``n`` slots (capped at the pool's size), blocking until available."""
        n = max(1, min(n, self.max_slots))
        with self._cond:
            while len(self._free) + (self.max_slots - self._made) < n:
                self._cond.wait()
            slots = [self._free.popleft() for _ in range(min(n, len(self._free)))]
            while len(slots) < n:
                slots.append(PinnedSlot(self.slot_bytes))
                self._made += 1
            return slots

    def release(self, slots) -> None:
        with self._cond:
            self._free.extend(slots)
            self._cond.notify_all()

    @property
    def allocated_bytes(self) -> int:
        return self._made * self.slot_bytes

    def clear(self) -> None:
        """Free the idle slots (slots in use are freed when given back later)."""
        with self._cond:
            for slot in self._free:
                slot.free()
            self._made -= len(self._free)
            self._free.clear()


class Stager:
    """Pipelined copies between pageable host arrays and device memory.

    Parameters
    ----------
    pool : PinnedPool
    threads : int
        CPU threads copying between pageable memory and pinned slots.
    ring : int
        Slots one transfer keeps in flight.
    """

    def __init__(self, pool: PinnedPool, threads: int, ring: int = 8):
        self.pool = pool
        self.ring = ring
        self.threads = max(1, threads)
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="daskgpu-copy")
        self._busy = 0.0
        self._busy_lock = threading.Lock()

    @property
    def busy_seconds(self) -> float:
        """Seconds the copy threads have spent copying, summed over the threads.

        Against ``threads`` times a job's wall time it says whether host
        copies bound the job (near 1) or the pipeline leaves them idle.
        """
        return self._busy

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        t0 = time.perf_counter()
        np.copyto(dst, src)
        took = time.perf_counter() - t0
        with self._busy_lock:  # += from several threads would lose updates
            self._busy += took

    #: The smallest piece a copy is cut into, where a DMA still runs at full speed.
    MIN_PIECE = 1 << 20

    def _pieces(self, nbytes):
        """``(offset, size)`` pieces of a copy: at most a slot each, and enough for every thread.

        A 16 MiB chunk in 8 MiB slots would keep two of eight threads busy;
        cut in eight pieces of 2 MiB, it keeps them all busy. Pieces are whole
        pages, but the last.
        """
        share = -(-nbytes // min(self.threads, self.ring))
        step = min(self.pool.slot_bytes, max(self.MIN_PIECE, -(-share // 4096) * 4096))
        return [(off, min(step, nbytes - off)) for off in range(0, nbytes, step)]

    def to_device(self, dptr: int, host: np.ndarray, stream) -> None:
        """Queue a copy of contiguous ``host`` to ``dptr`` on ``stream``.

        Returns once every byte has left ``host`` (it sits in pinned slots or on
        the device), without waiting for the last transfers; the device side
        completes in stream order.
        """
        src = host.ravel(order="K").view(np.uint8)  # a view: host is contiguous
        pieces = self._pieces(src.nbytes)
        slots = self.pool.acquire(min(self.ring, len(pieces)))
        pending = deque()
        try:
            for k, (off, size) in enumerate(pieces):
                slot = slots[k % len(slots)]
                if len(pending) == len(slots):
                    self._send(pending.popleft(), dptr, stream)
                # The slot's previous piece must have left it before it is refilled.
                check(driver.cuEventSynchronize(slot.event), "cuEventSynchronize")
                job = self._executor.submit(self._copy, slot.array[:size], src[off:off + size])
                pending.append((job, slot, off, size))
            while pending:
                self._send(pending.popleft(), dptr, stream)
        finally:
            # After an error, copies still filling slots must end before others reuse them.
            wait([job for job, *_ in pending])
            self.pool.release(slots)

    @staticmethod
    def _send(item, dptr, stream):
        job, slot, off, size = item
        job.result()
        check(driver.cuMemcpyHtoDAsync(int(dptr) + off, slot.ptr, size, stream),
              "cuMemcpyHtoDAsync")
        check(driver.cuEventRecord(slot.event, stream), "cuEventRecord")

    def to_host(self, host: np.ndarray, dptr: int, stream) -> None:
        """Copy ``dptr`` into contiguous ``host`` after the work queued on ``stream``."""
        dst = host.ravel(order="K").view(np.uint8)
        pieces = self._pieces(dst.nbytes)
        slots = self.pool.acquire(min(self.ring, len(pieces)))
        pending = deque()
        try:
            for k, (off, size) in enumerate(pieces):
                slot = slots[k % len(slots)]
                if len(pending) == len(slots):
                    pending.popleft().result()  # the slot's previous piece is copied out
                # A transfer queued by the slot's last user may still be reading it.
                check(driver.cuStreamWaitEvent(stream, slot.event, 0), "cuStreamWaitEvent")
                check(driver.cuMemcpyDtoHAsync(slot.ptr, int(dptr) + off, size, stream),
                      "cuMemcpyDtoHAsync")
                check(driver.cuEventRecord(slot.event, stream), "cuEventRecord")
                pending.append(self._executor.submit(
                    self._drain, slot, dst[off:off + size], size))
            while pending:
                pending.popleft().result()
        finally:
            self.pool.release(slots)

    def _drain(self, slot, dst, size):
        check(driver.cuEventSynchronize(slot.event), "cuEventSynchronize")
        self._copy(dst, slot.array[:size])


def memory_order(array) -> str:
    """``"F"`` for an array contiguous in Fortran order only, else ``"C"``."""
    return "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
