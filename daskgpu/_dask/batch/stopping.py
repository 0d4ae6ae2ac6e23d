"""How a batch run stops: SIGTERM taken as SIGINT is, and both held while a cluster starts.

SLURM ends a job at its time limit with SIGTERM (and SIGKILL after its
``KillWait``), so SIGTERM is how most cluster batch runs end. Under
:func:`terminate_as_interrupt` it raises :class:`Terminated`, a
:class:`KeyboardInterrupt`, in the main thread: the run stops as it does on
Ctrl-C, its outputs' locks released, its written chunks kept, and one line
says how to resume.

:func:`held_signals` covers the start of a local cluster: SIGINT and SIGTERM
that come meanwhile are held, and raised again once the cluster is up, to
whatever handlers were in place before, so that the cluster is closed
properly. Ctrl-C reaches the terminal's whole process group, and a worker that
took it would die under its running chunks, with a traceback: the batch's
workers load this module as a preload (:data:`WORKER_PRELOAD`), whose
:func:`dask_setup` makes them ignore SIGINT, and until then
(:func:`spawned_without_sigint`) they are spawned with SIGINT blocked, by
threads that inherit the block from the thread that starts the cluster.
(Ignoring SIGINT in this process while they start, as they would inherit it,
would throw away a Ctrl-C.)
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["WORKER_PRELOAD", "Terminated", "dask_setup", "held_signals",
           "spawned_without_sigint", "terminate_as_interrupt"]

#: The signals a run stops on.
STOPS = (signal.SIGINT, signal.SIGTERM)

#: The ``preload=`` that makes a batch's worker processes ignore Ctrl-C.
WORKER_PRELOAD = __name__


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises :class:`KeyboardInterrupt`; exit status 143.

    Examples
    --------
    >>> issubclass(Terminated, KeyboardInterrupt)
    True
    """

    signum = signal.SIGTERM


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def terminate_as_interrupt():
    """While inside, SIGTERM raises :class:`Terminated` in the main thread.

    Only the first SIGTERM raises: another, while the run is stopping, does
    not cut the clean-up short (SIGKILL still does). Outside the main thread,
    where Python cannot set handlers, nothing changes.

    Examples
    --------
    >>> import signal
    >>> with terminate_as_interrupt():
    ...     try:
    ...         signal.raise_signal(signal.SIGTERM)
    ...     except Terminated:
    ...         print("stopping")
    stopping
    """
    if not _on_main_thread():
        yield
        return
    raised = False

    def stop(signum, frame):
        nonlocal raised
        if not raised:
            raised = True
            raise Terminated(f"received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def dask_setup(worker) -> None:
    """Worker preload: this worker process ignores SIGINT; its nanny closes it.

    Only where the worker runs on its process's main thread (a process of
    its own): a threaded worker leaves its host process's Ctrl-C alone.
    """
    if _on_main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def spawned_without_sigint():
    """While inside, SIGINT is blocked in this thread, so in the threads started inside
    (a cluster's event loop, the threads that spawn its workers) and in the processes
    they spawn, which keep it blocked through exec.

    A worker process still importing, before its preload (:func:`dask_setup`)
    ignores SIGINT, is then not killed with a ``KeyboardInterrupt`` traceback by a
    Ctrl-C to the whole process group. This process still takes the signal: in a
    thread started before, or, held pending, on leaving. Outside the main thread
    nothing changes.
    """
    if not _on_main_thread():
        yield
        return
    from multiprocessing import resource_tracker

    # Started now, before the block: it blocks SIGINT around its own spawn and then
    # unblocks it, which would undo this block in whichever thread started it.
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def held_signals():
    """Hold SIGINT and SIGTERM while inside; raise them again when leaving.

    A signal that arrives meanwhile reaches the handler that was in place
    before only on leaving, so that what is started inside (a local cluster)
    is complete, and closed properly, when the run stops. Outside the main
    thread nothing is held.

    Examples
    --------
    >>> import signal
    >>> try:
    ...     with held_signals():
    ...         signal.raise_signal(signal.SIGINT)
    ...         print("started")
    ... except KeyboardInterrupt:
    ...     print("then interrupted")
    started
    then interrupted
    """
    if not _on_main_thread():
        yield
        return
    caught = []

    def hold(signum, frame):
        caught.append(signum)

    previous = {s: signal.signal(s, hold) for s in STOPS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            signal.raise_signal(caught[0])
