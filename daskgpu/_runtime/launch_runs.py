"""When each thread's launch began its own run, and how to stop it where it can be stopped.

A worker's time limit counts a launch's own run: not the task's wait for its
worker's start, the image's link (seconds on a cold worker under load), the
simulator's first import of Numba, nor the wait for the simulator's
process-wide launch lock. The runtime marks, per thread, the moment a launch
begins its own run (:func:`began`, after linking); the worker's launch guard
reads it for the thread running a task (:func:`started`).

A simulated launch runs Python in threads, so it can be stopped: it hands
:func:`began` a ``stop`` callable, which :func:`stop` calls. A kernel on a GPU
cannot be stopped; only tearing down its process's context frees the GPU.

The marks cost a launch nothing until a host asks for them (:func:`watch`):
the worker's plugin does, at setup.

Examples
--------
>>> import threading
>>> watch()
>>> began(stop=lambda: None)
>>> started(threading.get_ident()) is not None, stop(threading.get_ident())
(True, True)
>>> ended()
>>> stop(threading.get_ident())
False
"""

from __future__ import annotations

import threading
import time

__all__ = ["began", "ended", "started", "stop", "watch", "watching"]

#: Whether launches mark their runs: set once a host reads them (:func:`watch`).
watching = False

#: Marks kept before those of threads that have ended are dropped.
KEPT = 1024

_runs = {}  # thread id -> [monotonic start of its latest launch's run, stop or None]


def watch() -> None:
    """Have launches in this process mark their runs from now on."""
    global watching
    watching = True


def began(stop=None) -> None:
    """This thread's launch begins its own run now; ``stop()`` stops it, where it can be."""
    if len(_runs) >= KEPT:
        alive = {t.ident for t in threading.enumerate()}
        for ident in [i for i in _runs if i not in alive]:
            _runs.pop(ident, None)
    _runs[threading.get_ident()] = [time.monotonic(), stop]


def ended() -> None:
    """This thread's launch has ended: nothing is left to stop (its start is kept)."""
    run = _runs.get(threading.get_ident())
    if run is not None:
        run[1] = None


def started(thread: int) -> float | None:
    """When the latest launch of ``thread`` (a thread id) began its own run, in
    ``time.monotonic()`` seconds; None if it has launched nothing."""
    run = _runs.get(thread)
    return None if run is None else run[0]


def stop(thread: int) -> bool:
    """Stop the launch ``thread`` runs now; whether there was one that can be stopped."""
    run = _runs.get(thread)
    halt = None if run is None else run[1]
    if halt is None:
        return False
    halt()
    return True
