"""Launches that will not end: time limits and cancellation on a GPU worker.

A Dask task cannot be interrupted once it runs, and a thread waiting for a
CUDA kernel cannot be made to stop; only tearing down the process's CUDA
context frees the GPU. :class:`LaunchWatch` keeps, for each task running a
launch on its worker, when it started and its limit: the launch's own
``timeout`` (``map_kernel(timeout=)``, ``kernel.configure(..., timeout=)``),
else the worker's ``daskgpu.launch-timeout``. Four times a second
(:data:`PERIOD`) it is asked what is overdue:

- a task over its limit fails at once, with one line naming the kernel, the
  chunk and the limit (:class:`~daskgpu.LaunchTimeoutError`, raised into the task's
  state, not its thread), and the worker's process is replaced;
- a running launch task that was cancelled (``future.cancel()``,
  ``client.cancel``) and is still running ``daskgpu.cancel-grace`` later has
  its worker's process replaced.

The process is replaced as after a lost CUDA context: the worker closes, its
nanny starts a fresh one on the same GPU with the same plugin, and the other
tasks that were running on it run again, as after a lost worker.
"""

from __future__ import annotations

import time

from dask.utils import key_split

from daskgpu import _config
from daskgpu._dask.placement import launches_in

__all__ = ["PERIOD", "LaunchWatch", "launch_of", "timeout_message"]

#: Seconds between two looks at the running launches.
PERIOD = 0.25


class LaunchWatch:
    """The launch tasks running on one worker, each with its start and time limit.

    Examples
    --------
    >>> watch = LaunchWatch(default_limit=None, grace=2.0)
    >>> watch.started("k", 1.0, now=10.0, kernel="spin")
    >>> watch.overdue(now=10.5), watch.overdue(now=11.5)
    ([], [('k', 1.0)])
    >>> watch.kernel("k")
    'spin'
    >>> watch.cancelled("k", now=11.6)
    >>> watch.stuck(now=12.0), watch.stuck(now=13.7)
    ([], ['k'])
    """

    def __init__(self, default_limit: float | None, grace: float):
        self.default_limit = default_limit
        self.grace = grace
        self._running = {}  # key -> (start, limit or None)
        self._kernels = {}  # key -> the kernel's name
        self._cancelled = {}  # key -> when it was cancelled

    def started(self, key, limit: float | None, now: float | None = None,
                kernel: str | None = None) -> None:
        limit = self.default_limit if limit is None else limit
        self._running[key] = (time.monotonic() if now is None else now, limit)
        if kernel is not None:
            self._kernels[key] = kernel

    def kernel(self, key) -> str | None:
        """The name of the kernel the task ``key`` launches, where it was given."""
        return self._kernels.get(key)

    def cancelled(self, key, now: float | None = None) -> None:
        if key in self._running:
            self._cancelled[key] = time.monotonic() if now is None else now

    def ended(self, key) -> None:
        self._running.pop(key, None)
        self._kernels.pop(key, None)
        self._cancelled.pop(key, None)

    def overdue(self, now: float | None = None) -> list:
        """``(key, limit)`` of each task over its limit, not yet cancelled."""
        now = time.monotonic() if now is None else now
        return [(key, limit) for key, (start, limit) in self._running.items()
                if limit is not None and now - start > limit and key not in self._cancelled]

    def stuck(self, now: float | None = None) -> list:
        """Keys of cancelled tasks still running ``grace`` seconds after they were cancelled."""
        now = time.monotonic() if now is None else now
        return [key for key, when in self._cancelled.items() if now - when > self.grace]

    def __bool__(self):
        return bool(self._running)

    @classmethod
    def from_config(cls) -> LaunchWatch:
        return cls(_config.get("launch-timeout"), _config.get("cancel-grace"))


def launch_of(run_spec, data) -> object | None:
    """The :class:`~daskgpu._runtime.launch_task.LaunchTask` a task's spec runs (a
    ``Launch``, ``ChunkLaunch`` or fused pair), read through references to keys held in
    ``data`` (a map's launch is a key of its own); None when the task runs none."""
    def held(key):
        return data[key] if key in data else None

    return next((launch for _, launch, _ in launches_in(run_spec, held)
                 if launch is not None), None)


def timeout_message(key, limit: float, kernel: str | None = None) -> str:
    """The one line of a task that outlived its limit: the kernel, the chunk, the limit.

    ``kernel`` is the launch's own name (its ``LaunchTask.kernel_name``);
    without it, the task's name stands in.

    Examples
    --------
    >>> timeout_message(("array-sum", 2), 1.0, kernel="spin_chunk")[:41]
    "kernel 'spin_chunk' on chunk (2,) did not"
    """
    kernel = kernel or key_split(key)
    chunk = f" on chunk {tuple(key[1:])}" if isinstance(key, tuple) and len(key) > 1 else ""
    return (f"kernel {kernel!r}{chunk} did not finish within its time limit of {limit:g} s "
            "(timeout=, or daskgpu.launch-timeout); the worker's process is replaced to free "
            "its GPU, and its other tasks run again")
