"""Where a launch's time goes: the runtime's meter, which whoever hosts the runtime reads.

The runtime knows nothing of Dask. It reports each launch's time by activity
to :data:`hook`, which is None while nobody looks, and then costs one module
attribute read and one ``is None`` test per launch. A host installs a
*recorder*, ``recorder(kernel, activity, seconds)``, with :func:`add_recorder`
(the Dask layer's ``GPUWorkerPlugin`` forwards to distributed's fine
performance metrics) and takes it out again with :func:`remove_recorder`.

Activities, as wall-clock seconds of the thread that launched, never
overlapping, so that they add up within a task:

============  =================================================================
``link``      linking and loading an image for a device: its first launch there
``copy-in``   host arrays to the device: allocation, marshalling and copies,
              pageable arrays through the pinned pipeline; with the part of the
              wait after the launch that the input copies still took
``launch``    a launch on device arrays only (CuPy, Numba, ``DeviceView``): the
              host's time to match, pack and call ``cuLaunchKernel``. The
              kernel then runs asynchronously, unmeasured: nothing waits for it
``kernel``    the kernel's own run, where the launch waits for it anyway (host
              arrays to copy back): from CUDA events, bounded by the wait. In
              the simulator, the whole simulated run
``copy-out``  the rest of that wait: written arrays back to the host, through
              the pinned pipeline for pageable ones
============  =================================================================

When the ``nvtx`` package is installed and a profiler that reads NVTX (Nsight
Systems, Nsight Compute) runs the process, launches are also NVTX ranges named
after their kernel, in the domain ``daskgpu``; without one, nvtx is not even
imported.
"""

from __future__ import annotations

import os
import threading
from functools import partial
from time import perf_counter

__all__ = [
    "ACTIVITIES", "Meter", "add_recorder", "clock", "end_range", "hook", "kernel_name",
    "record", "remove_recorder", "start_range",
]

ACTIVITIES = ("link", "copy-in", "launch", "kernel", "copy-out")

#: The clock every activity is timed with.
clock = perf_counter


def kernel_name(name: str) -> str:
    """The kernel's own name from an image's qualified one: ``"module.saxpy"`` -> ``"saxpy"``."""
    return name.rpartition(".")[2]


class Meter:
    """What launches report to: a recorder of seconds by activity, NVTX ranges, or both.

    Parameters
    ----------
    recorder : callable or None
        ``recorder(kernel, activity, seconds)``, ``kernel`` the kernel's own name.
        A recorder with a ``sink(kernel, activity)`` method, returning a
        callable of the seconds alone, saves the fast path's launches the
        general call: the sinks are made once per image and kept here.
    domain : nvtx Domain or None
        Where launches push their NVTX ranges; None for none.
    """

    __slots__ = ("recorder", "domain", "_names", "_attributes", "_launch_sinks")

    #: Images whose kernel names and launch sinks are kept made; each emptied when full.
    KEPT = 1024

    def __init__(self, recorder, domain=None):
        self.recorder = recorder
        self.domain = domain
        self._names = {}  # image name -> kernel name, read per report
        self._attributes = {}  # range name -> nvtx event attributes
        self._launch_sinks = {}  # image name -> seconds of its "launch" to the recorder

    def record(self, name: str, activity: str, seconds: float) -> None:
        """Report ``seconds`` of ``activity`` for the image named ``name``."""
        recorder = self.recorder
        if recorder is not None:
            recorder(self._names.get(name) or self._name(name), activity, seconds)

    def _name(self, name: str) -> str:
        if len(self._names) >= self.KEPT:
            self._names.clear()
        return self._names.setdefault(name, kernel_name(name))

    def push(self, name: str) -> None:
        """Open this thread's NVTX range ``name``: none without a profiler."""
        if self.domain is not None:
            self.domain.push_range(self._range_attributes(name))

    def pop(self) -> None:
        """Close this thread's innermost NVTX range opened by :meth:`push`."""
        if self.domain is not None:
            self.domain.pop_range()

    def start_range(self, name: str):
        """Open an NVTX range that another thread may close; its id, or None."""
        if self.domain is None:
            return None
        return self.domain.start_range(self._range_attributes(name))

    def end_range(self, range_id) -> None:
        if range_id is not None and self.domain is not None:
            self.domain.end_range(range_id)

    def _range_attributes(self, name: str):
        attributes = self._attributes.get(name)
        if attributes is None:
            attributes = self.domain.get_event_attributes(message=kernel_name(name))
            self._attributes[name] = attributes
        return attributes

    def launched(self, name: str, start: float) -> None:
        """Close the range of :meth:`push` and report ``launch`` time since ``start``:
        the end of a launch on device arrays, which nothing waits for."""
        seconds = clock() - start
        if self.domain is not None:
            self.domain.pop_range()
        sink = self._launch_sinks.get(name)
        if sink is None:
            sink = self._launch_sink(name)
        sink(seconds)

    def _launch_sink(self, name: str):
        recorder, kernel = self.recorder, kernel_name(name)
        make = getattr(recorder, "sink", None)
        if recorder is None:
            sink = _ignore
        elif make is not None:
            sink = make(kernel, "launch")
        else:
            sink = partial(recorder, kernel, "launch")
        if len(self._launch_sinks) >= self.KEPT:
            self._launch_sinks.clear()  # racing threads at worst both make a sink
        self._launch_sinks[name] = sink
        return sink

    def __repr__(self):
        return f"Meter(recorder={self.recorder!r}, nvtx={self.domain is not None})"


def _ignore(seconds: float) -> None:
    """The sink while no recorder is installed: NVTX ranges only."""


def _nvtx_domain():
    """The ``daskgpu`` NVTX domain while a profiler injects NVTX into this process, else None.

    Profilers hand NVTX their library in ``NVTX_INJECTION64_PATH``; without
    it every range is a no-op, so nvtx (0.4 s to import) is left alone.
    """
    if not os.environ.get("NVTX_INJECTION64_PATH"):
        return None
    try:
        import nvtx
    except ImportError:
        return None
    domain = nvtx.get_domain("daskgpu")
    return domain if hasattr(domain, "handle") else None  # a DummyDomain: no tool


_lock = threading.Lock()
_recorders = []  # installed recorders; the last one installed is in use
_domain = _nvtx_domain()

#: What launches report to: None while no recorder is installed and no profiler
#: reads NVTX, else a :class:`Meter`. Read once per launch; replaced, never changed.
hook = Meter(None, _domain) if _domain is not None else None


def _rebuild() -> None:
    global hook
    recorder = _recorders[-1] if _recorders else None
    hook = Meter(recorder, _domain) if recorder is not None or _domain is not None else None


def add_recorder(recorder) -> None:
    """Send launches' time to ``recorder(kernel, activity, seconds)``, until removed.

    Installed several times (by several hosts of one process), it stays until
    removed as often; the last recorder installed is the one in use.

    Examples
    --------
    >>> seen = []
    >>> def note(kernel, activity, seconds):
    ...     seen.append((kernel, activity))
    >>> add_recorder(note)
    >>> record("tests.saxpy", "kernel", 0.001)
    >>> remove_recorder(note)
    >>> record("tests.saxpy", "kernel", 0.001)
    >>> seen
    [('saxpy', 'kernel')]
    """
    if not callable(recorder):
        raise TypeError(f"a recorder is called as recorder(kernel, activity, seconds); "
                        f"got {type(recorder).__name__} {recorder!r}")
    with _lock:
        _recorders.append(recorder)
        _rebuild()


def remove_recorder(recorder) -> None:
    """Take one installation of ``recorder`` out; not installed, nothing happens."""
    with _lock:
        for i in range(len(_recorders) - 1, -1, -1):
            if _recorders[i] is recorder:
                del _recorders[i]
                break
        _rebuild()


def record(name: str, activity: str, seconds: float) -> None:
    """Report ``seconds`` of ``activity`` of the image named ``name``, when someone looks."""
    meter = hook
    if meter is not None:
        meter.record(name, activity, seconds)


def start_range(name: str):
    """An NVTX range over threads (a task's), while a profiler reads NVTX; else None."""
    meter = hook
    return meter.start_range(name) if meter is not None else None


def end_range(range_id) -> None:
    """Close a range from :func:`start_range`."""
    meter = hook
    if meter is not None:
        meter.end_range(range_id)
