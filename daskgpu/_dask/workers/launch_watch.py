"""The launch tasks running on one worker, and what to do about them, as plain data.

:class:`LaunchWatch` keeps, for each task running a launch, when its launch
began its own run, its time limit and its cancellation. As distributed's
``worker_state_machine`` returns instructions that its worker carries out,
:func:`decide` turns what a look sees of the worker (:class:`Seen`) into
small decision records (:class:`FailLaunch`, :class:`StopLaunch`), and
:func:`replacement` into :class:`ReplaceWorker`; the worker's launch guard
(:class:`~daskgpu._dask.workers.watchdog.LaunchGuard`) reads the worker and
carries them out. Nothing here touches a worker, so tests drive it directly.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from daskgpu import _config

__all__ = ["STARTUP", "FailLaunch", "LaunchWatch", "ReplaceWorker", "Seen", "StopLaunch",
           "decide", "replacement"]

#: Seconds a launch task may take to begin its launch's own run (its worker's start,
#: the image's link, a wait for the simulator's lock) before its time limit counts
#: anyway.
STARTUP = 120.0


class LaunchWatch:
    """The launch tasks running on one worker, each with its start and time limit.

    Examples
    --------
    >>> watch = LaunchWatch(default_limit=None, grace=2.0)
    >>> watch.started("k", 1.0, now=10.0, kernel="spin")
    >>> watch.launched("k", 12.0)  # its own run: after its worker's start and its link
    >>> watch.overdue(now=12.5), watch.overdue(now=13.5)
    ([], [('k', 1.0)])
    >>> watch.kernel("k")
    'spin'
    >>> watch.cancelled("k", now=13.6)
    >>> watch.stuck(now=14.0), watch.stuck(now=15.7)
    ([], ['k'])
    """

    def __init__(self, default_limit: float | None, grace: float):
        self.default_limit = default_limit
        self.grace = grace
        self._running = {}  # key -> [start, limit or None, start of the launch's own run]
        self._kernels = {}  # key -> the kernel's name
        self._cancelled = {}  # key -> when it was cancelled

    def started(self, key, limit: float | None, now: float | None = None,
                kernel: str | None = None) -> None:
        """The task ``key`` started; its limit counts from its launch's own run
        (:meth:`launched`), or from :data:`STARTUP` seconds on if that never comes."""
        limit = self.default_limit if limit is None else limit
        self._running[key] = [time.monotonic() if now is None else now, limit, None]
        if kernel is not None:
            self._kernels[key] = kernel

    def launched(self, key, when: float) -> None:
        """The launch of task ``key`` began its own run at ``when`` (its latest launch's,
        for a task of several); a mark from before the task started is another task's."""
        running = self._running.get(key)
        if running is not None and when >= running[0]:
            running[2] = when

    def keys(self) -> list:
        """The keys of the tasks watched."""
        return list(self._running)

    def kernel(self, key) -> str | None:
        """The name of the kernel the task ``key`` launches, where it was given."""
        return self._kernels.get(key)

    def cancelled(self, key, now: float | None = None) -> None:
        if key in self._running:
            self._cancelled[key] = time.monotonic() if now is None else now

    def resumed(self, key) -> None:
        """The cancelled task ``key`` is wanted again while its thread still runs (the same
        key submitted anew): the same run goes on, under its time limit, no longer
        cancelled."""
        self._cancelled.pop(key, None)

    def ended(self, key) -> None:
        self._running.pop(key, None)
        self._kernels.pop(key, None)
        self._cancelled.pop(key, None)

    def overdue(self, now: float | None = None) -> list:
        """``(key, limit)`` of each task over its limit, not yet cancelled."""
        now = time.monotonic() if now is None else now
        return [(key, limit) for key, (start, limit, run) in self._running.items()
                if limit is not None and key not in self._cancelled
                and now - (start + STARTUP if run is None else run) > limit]

    def stuck(self, now: float | None = None) -> list:
        """Keys of cancelled tasks still running ``grace`` seconds after they were cancelled."""
        now = time.monotonic() if now is None else now
        return [key for key, when in self._cancelled.items() if now - when > self.grace]

    def __bool__(self):
        return bool(self._running)

    @classmethod
    def from_config(cls) -> LaunchWatch:
        return cls(_config.get("launch-timeout"), _config.get("cancel-grace"))


class Seen(NamedTuple):
    """What one look of the guard reads off its worker, as plain data.

    Attributes
    ----------
    threads : dict
        ``{key: thread id}`` of the tasks running in the worker's threads.
    runs : dict
        ``{key: when}``: when the launch of each watched task began its own run.
    states : dict
        ``{key: the worker's state of the task}`` of each watched task (None: gone).
    cancelled_running : frozenset
        The watched tasks cancelled while their thread runs on.
    alone : bool
        The worker has no nanny: it cannot be replaced, but a simulated launch can
        be stopped.
    """

    threads: dict
    runs: dict
    states: dict
    cancelled_running: frozenset
    alone: bool


class FailLaunch(NamedTuple):
    """Fail the task ``key`` over its time ``limit`` with a LaunchTimeoutError naming
    ``kernel``; first stop its simulated launch in ``thread``, where that is given."""

    key: Any
    limit: float
    kernel: str | None
    thread: int | None


class StopLaunch(NamedTuple):
    """Stop the launch of the cancelled task ``key`` running on in ``thread`` (a worker
    without a nanny); once stopped, it is no longer watched."""

    key: Any
    thread: int


class ReplaceWorker(NamedTuple):
    """Close the worker at once so that its nanny starts a fresh process: the cancelled
    launch tasks ``keys`` still run ``grace`` seconds after they were cancelled."""

    keys: tuple
    grace: float


def decide(watch: LaunchWatch, seen: Seen, now: float | None = None) -> list:
    """What to do about the watched launches, given what the worker shows: a
    :class:`FailLaunch` for each task over its limit, a :class:`StopLaunch` for each
    cancelled one still running past the grace on a worker without a nanny.

    The watch keeps its books as it goes: a failed task is no longer watched, nor a
    cancelled one whose thread returned; one wanted again is timed again.

    Examples
    --------
    >>> watch = LaunchWatch(default_limit=None, grace=2.0)
    >>> watch.started("k", 1.0, now=0.0, kernel="spin")
    >>> seen = Seen(threads={"k": 7}, runs={"k": 1.0}, states={"k": "executing"},
    ...             cancelled_running=frozenset(), alone=False)
    >>> decide(watch, seen, now=1.5), decide(watch, seen, now=2.5)
    ([], [FailLaunch(key='k', limit=1.0, kernel='spin', thread=None)])
    >>> watch.keys()
    []
    """
    for key, when in seen.runs.items():
        watch.launched(key, when)
    decisions: list = []
    for key, limit in watch.overdue(now):
        kernel = watch.kernel(key)
        watch.ended(key)
        if seen.states.get(key) == "executing":
            thread = seen.threads.get(key) if seen.alone else None
            decisions.append(FailLaunch(key, limit, kernel, thread))
    for key in watch.stuck(now):
        if seen.states.get(key) == "executing":
            watch.resumed(key)  # wanted again: its time limit holds as before
        elif key not in seen.cancelled_running:
            watch.ended(key)  # its thread returned within the grace after all
        elif seen.alone and key in seen.threads:
            decisions.append(StopLaunch(key, seen.threads[key]))
    return decisions


def replacement(watch: LaunchWatch, now: float | None = None) -> ReplaceWorker | None:
    """A :class:`ReplaceWorker` while cancelled launches still run after the grace (those
    :func:`decide` had stopped are no longer watched); else None.

    Examples
    --------
    >>> watch = LaunchWatch(default_limit=None, grace=2.0)
    >>> watch.started("k", None, now=0.0)
    >>> watch.cancelled("k", now=1.0)
    >>> replacement(watch, now=2.0), replacement(watch, now=3.5)
    (None, ReplaceWorker(keys=('k',), grace=2.0))
    """
    stuck = watch.stuck(now)
    return ReplaceWorker(tuple(stuck), watch.grace) if stuck else None
