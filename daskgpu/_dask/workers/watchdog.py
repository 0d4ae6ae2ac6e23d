"""Launches that will not end, and lost contexts: time limits, cancellation, replacement.

A Dask task cannot be interrupted once it runs, and a thread waiting for a
CUDA kernel cannot be made to stop; only tearing down the process's CUDA
context frees the GPU. :class:`~.launch_watch.LaunchWatch` keeps, for each task running a
launch on its worker, when its launch began its own run and its limit: the
launch's own ``timeout`` (``map_kernel(timeout=)``, ``kernel.configure(...,
timeout=)``), else the worker's ``daskgpu.launch-timeout``. The runtime marks
when a launch's own run begins, after its worker's start, its image's link and
any wait for the simulator's lock (:mod:`daskgpu._runtime.launch_runs`), so a
limit means the same on a cold worker. Four times a second (:data:`PERIOD`) it
is asked what is overdue:

- a task over its limit fails at once, with one line naming the kernel, the
  chunk and the limit (:class:`~daskgpu.LaunchTimeoutError`, raised into the task's
  state, not its thread), and the worker's process is replaced;
- a running launch task that was cancelled (``future.cancel()``,
  ``client.cancel``) and is still running ``daskgpu.cancel-grace`` later has
  its worker's process replaced;
- a worker that closes while a launch runs (it lost its scheduler, say) watches
  it on from a thread (:func:`outlast`): past the grace, or its limit, the
  process ends.

The process is replaced as after a lost CUDA context: the worker closes, its
nanny starts a fresh one on the same GPU with the same plugin, and the other
tasks that were running on it run again, as after a lost worker. A worker
without a nanny (``processes=False``) cannot be replaced: there a simulated
launch, which runs Python, is stopped instead, and the worker goes on; a GPU
kernel cannot be stopped, and that worker closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from dask.utils import key_split
from distributed.protocol import pickle

from daskgpu._dask.launch_core.walk import held_in, launch_of, place_of
from daskgpu._dask.workers.launch_watch import (
    FailLaunch,
    LaunchWatch,
    ReplaceWorker,
    Seen,
    StopLaunch,
    decide,
    replacement,
)
from daskgpu._errors import ContextLostError, LaunchTimeoutError
from daskgpu._runtime import launch_runs

__all__ = ["GRACE", "PERIOD", "TOLD", "WATCH_CALLBACK", "LaunchGuard", "close_worker",
           "lost_context", "outlast", "timeout_message"]

logger = logging.getLogger("daskgpu")

#: The worker's periodic callback that looks at running launches (:meth:`LaunchGuard.look`).
WATCH_CALLBACK = "daskgpu-launch-watch"

#: Seconds the worker keeps running after a task lost the CUDA context, so that the
#: task's error reaches the scheduler before the process goes.
GRACE = 0.5

#: Seconds between two looks at the running launches.
PERIOD = 0.25

def timeout_message(key, limit: float, kernel: str | None = None,
                    stopped: bool = False, place=None) -> str:
    """The one line of a task that outlived its limit: the kernel, the chunk, the limit.

    ``kernel`` is the launch's own name (its ``LaunchTask.kernel_name``);
    without it, the task's name stands in. ``stopped``: the launch was stopped
    (simulated, on a worker without a nanny), and the worker goes on. ``place``,
    the task's :class:`~daskgpu._dask.launch_core.task.ChunkPlace`, names the user's
    chunks of a grouped launch.

    Examples
    --------
    >>> timeout_message(("array-sum", 2), 1.0, kernel="spin_chunk")[:41]
    "kernel 'spin_chunk' on chunk (2,) did not"
    >>> from daskgpu._dask.launch_core.task import ChunkPlace
    >>> place = ChunkPlace((1,), (400,), (400,), ((4, 400, (100,) * 4),))
    >>> timeout_message(("saxpy", 1), 8.0, "saxpy", place=place)[:96]
    "kernel 'saxpy' on chunks (4,) to (7,) (one grouped launch; map_kernel(group=False) launches \
each"
    """
    kernel = kernel or key_split(key)
    chunk = f" on chunk {tuple(key[1:])}" if isinstance(key, tuple) and len(key) > 1 else ""
    if place is not None and place.members is not None:
        first = tuple(index for index, _, _ in place.members)
        last = tuple(index + len(sizes) - 1 for index, _, sizes in place.members)
        chunk = (f" on chunks {first} to {last} (one grouped launch; map_kernel(group=False) "
                 "launches each alone)")
    then = ("the simulated launch was stopped, and the worker goes on" if stopped else
            "the worker's process is replaced to free its GPU, and its other tasks run again")
    return (f"kernel {kernel!r}{chunk} did not finish within its time limit of {limit:g} s "
            f"(timeout=, or daskgpu.launch-timeout); {then}")


class LaunchGuard:
    """The part of :class:`~daskgpu.GPUWorkerPlugin` that replaces a worker whose GPU is
    stuck: a task over its time limit, a cancelled launch still running after
    ``daskgpu.cancel-grace``, a task that lost the CUDA context.

    It watches the launch tasks (:class:`LaunchWatch`) from the worker's task
    transitions and looks at them every :data:`PERIOD` seconds; the worker is
    closed (:func:`close_worker`) once, after the failing task's error has
    reached the scheduler.
    """

    def __init__(self):
        self.worker = None
        #: Whether the worker is being closed.
        self.closing = False
        #: The running launches' time limits and cancellations.
        self.watch = None
        # Tasks failed over their limit whose simulated launch was stopped: their worker
        # is not wedged, and is not closed.
        self._stopped = set()

    def setup(self, worker) -> None:
        self.worker = worker
        self.watch = LaunchWatch.from_config()
        launch_runs.watch()  # launches mark when their own run begins
        callbacks = getattr(worker, "periodic_callbacks", None)
        if isinstance(callbacks, dict) and WATCH_CALLBACK not in callbacks:
            from tornado.ioloop import PeriodicCallback

            callbacks[WATCH_CALLBACK] = watching = PeriodicCallback(self.look, PERIOD * 1000)
            watching.start()

    def teardown(self, worker) -> None:
        """Stop looking from the event loop; a launch still running as the worker closes
        (it lost its scheduler, say) is watched on from a thread (:func:`outlast`)."""
        callbacks = getattr(worker, "periodic_callbacks", None)
        if isinstance(callbacks, dict) and WATCH_CALLBACK in callbacks:
            callbacks.pop(WATCH_CALLBACK).stop()
        watch, self.watch = self.watch, None
        if watch:
            import threading

            threading.Thread(target=outlast, args=(watch, worker), daemon=True,
                             name="daskgpu-launch-watch").start()

    def transition(self, key, start, finish) -> None:
        """Watch a running launch's time and its cancellation; close the worker after a
        task failed with a lost CUDA context (or over its time limit)."""
        if "executing" in (start, finish) or start == "cancelled":
            self._watch_task(key, start, finish)
        if finish != "error" or self.worker is None or self.closing:
            return
        if key in self._stopped:  # its launch stopped, its worker not wedged
            self._stopped.discard(key)
            return
        task = self.worker.state.tasks.get(key)
        if task is None or not lost_context(task):
            return
        self.closing = True
        worker = self.worker
        logger.error("daskgpu: task %r lost the CUDA context (%s); closing worker %s so "
                     "its nanny restarts it", key, task.exception_text, worker.address)
        # A task it started now would meet the lost context and fail for another's fault:
        # it starts none until it closes, and the tasks it holds then run elsewhere, on
        # its fresh process among others. (As a paused worker does. Its status is left
        # alone: telling the scheduler it was closing made the failed task's error go
        # missing, and the task ran again on the fresh worker.)
        worker.state.running = False
        # A kernel over its time limit still runs: the process must end, not close.
        hung = "LaunchTimeoutError" in (task.exception_text or "")
        worker.loop.call_later(GRACE, close_worker, worker, hung, key)

    def _watch_task(self, key, start, finish) -> None:
        watch, worker = self.watch, self.worker
        if watch is None or worker is None:
            return
        task = worker.state.tasks.get(key)
        if finish == "executing":
            launch = launch_of(task.run_spec, held_in(worker.data)) if task is not None else None
            if launch is not None:
                watch.started(key, launch.timeout, kernel=launch.kernel_name)
        elif getattr(task, "state", None) == "executing":
            # Cancelled, then wanted again before its thread returned (the same key
            # submitted anew): distributed resumes the running task, seen as "cancelled"
            # to "waiting". The launch still runs, and is watched as before.
            watch.resumed(key)
        elif _still_running(task):  # cancelled while it runs (seen as "released")
            watch.cancelled(key)
        else:
            watch.ended(key)

    def look(self) -> None:
        """Fail the launch tasks over their time limit; replace the process whose cancelled
        launch is still running after the grace period.

        What the worker shows is read once (:meth:`seen`), :func:`decide` turns it into
        decisions, and the guard carries them out (:meth:`carry_out`); whether a
        cancelled launch is still running once the stops are done decides last
        (:func:`replacement`).
        """
        watch, worker = self.watch, self.worker
        if not watch or worker is None or self.closing:
            return
        for decision in decide(watch, self.seen()):
            self.carry_out(decision)
        decision = replacement(watch)
        if decision is not None:
            self.carry_out(decision)

    def seen(self) -> Seen:
        """What the worker shows of the watched tasks now, as plain data."""
        worker, keys = self.worker, self.watch.keys()
        threads = {key: ident for ident, key in
                   dict(getattr(worker, "active_threads", None) or {}).items()}
        runs = {key: when for key in keys if key in threads
                and (when := launch_runs.started(threads[key])) is not None}
        tasks = {key: worker.state.tasks.get(key) for key in keys}
        return Seen(threads=threads, runs=runs,
                    states={key: getattr(task, "state", None) for key, task in tasks.items()},
                    cancelled_running=frozenset(k for k, t in tasks.items()
                                                if _still_running(t)),
                    alone=not getattr(worker, "nanny", None))

    def carry_out(self, decision) -> None:
        """Do what a decision of :func:`decide` or :func:`replacement` says."""
        worker = self.worker
        match decision:
            case FailLaunch(key, limit, kernel, thread):
                task = worker.state.tasks.get(key)
                if task is None:
                    return
                stopped = thread is not None and launch_runs.stop(thread)
                if stopped:
                    self._stopped.add(key)
                # Raised into the task's state, not its thread, which may never return;
                # the error's transition then closes the worker, as for a lost context.
                from distributed.worker_state_machine import ExecuteFailureEvent

                worker.handle_stimulus(ExecuteFailureEvent.from_exception(
                    LaunchTimeoutError(timeout_message(key, limit, kernel, stopped,
                                                       place_of(task.run_spec))),
                    key=key, run_id=task.run_id, start=task.start_time, stop=time.time(),
                    stimulus_id=f"daskgpu-launch-timeout-{time.time()}"))
            case StopLaunch(key, thread):
                if launch_runs.stop(thread):
                    self.watch.ended(key)  # stopped: its thread returns now
            case ReplaceWorker(keys, grace):
                if self.closing:
                    return
                self.closing = True
                logger.error("daskgpu: cancelled launch task(s) %s still run %.3g s after "
                             "being cancelled (daskgpu.cancel-grace); closing worker %s so "
                             "its nanny starts a fresh process and the GPU is free",
                             list(keys), grace, worker.address)
                worker.loop.call_later(0, close_worker, worker, True)


def outlast(watch: LaunchWatch, worker, now=time.monotonic, sleep=time.sleep) -> None:
    """Watch the launches still running on a closing worker until they end.

    A closing worker waits for its running tasks (up to distributed's close
    timeout, 30 s), and its event loop no longer looks at them. A launch that has
    not ended ``watch.grace`` seconds after the close began, or that outruns its
    time limit first, has its worker's process ended at once, which frees the
    GPU (a worker without a nanny has a simulated launch stopped instead).
    """
    closing = now()
    while True:
        sleep(PERIOD)
        running = {key: ident for ident, key in
                   dict(getattr(worker, "active_threads", None) or {}).items()}
        for key in watch.keys():
            when = launch_runs.started(running[key]) if key in running else None
            if key not in running:
                watch.ended(key)
            elif when is not None:
                watch.launched(key, when)
        if not watch:
            return
        if now() - closing <= watch.grace and not watch.overdue(now()):
            continue
        if getattr(worker, "nanny", None):
            logger.error("daskgpu: launch task(s) %s still run as worker %s closes; ending "
                         "its process to free the GPU", watch.keys(), worker.address)
            logging.shutdown()
            os._exit(1)
        for key in watch.keys():
            launch_runs.stop(running[key])
            watch.ended(key)


def lost_context(task) -> bool:
    """Whether the worker's failed task state ``task`` failed with a ContextLostError.

    Distributed keeps a failed task's exception pickled (``task.exception``)
    and its ``repr`` (``task.exception_text``). The exception is read back,
    with the ones it was raised from; one that could not be pickled travels as
    ``Exception(repr(exc))``, so the repr's class name counts too.
    """
    exc = getattr(task.exception, "data", task.exception)
    if isinstance(exc, bytes | bytearray):
        try:
            exc = pickle.loads(exc)
        except Exception:
            exc = None
    seen = set()
    while isinstance(exc, BaseException) and id(exc) not in seen:
        if isinstance(exc, ContextLostError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return (task.exception_text or "").startswith(f"{ContextLostError.__name__}(")


def close_worker(worker, hung: bool = False, failed=None):
    """End the worker so that its nanny starts a fresh process.

    ``hung``: a kernel is still running. A process that closes normally then
    waits for it as it exits (the CUDA driver finishes a context's work before it
    destroys it); one that ends at once has its context torn down by the driver,
    which frees the GPU. Only a worker with a nanny is ended so: one without
    shares its process with others (threaded workers, a client's). It ends once
    the scheduler has the error of the task ``failed`` (its key), if one did, or
    :data:`TOLD` seconds on.
    """
    if hung and getattr(worker, "nanny", None):
        return asyncio.ensure_future(_end_once_told(worker, failed))
    # nanny=False: the nanny sees its worker process exit and starts a new one.
    return asyncio.ensure_future(
        worker.close(nanny=False, executor_wait=False, reason="daskgpu: CUDA context lost")
    )


#: Seconds a worker ending at once waits for the scheduler to have its failed task's error.
TOLD = 10.0


async def _end_once_told(worker, failed) -> None:
    """End the process at once, after the scheduler has the error of the task ``failed``.

    The error left on the worker's stream to the scheduler, but a process that
    ends at once resets its connections, and the scheduler may drop what it had
    not read yet: the task would then run again, on the fresh worker, as if its
    worker had died, rather than fail. (Seen with a simulated kernel spinning
    beside the event loop.) Asking the scheduler for the task's state, on
    another connection, tells when it has read the error.
    """
    deadline = time.monotonic() + TOLD
    while failed is not None and time.monotonic() < deadline:
        try:
            states = await asyncio.wait_for(
                worker.scheduler.get_task_status(keys=[failed]), PERIOD * 4)
        except Exception:  # the scheduler is away or slow: ask again, until TOLD
            states = None
        if states is not None and states.get(failed) != "processing":
            break
        await asyncio.sleep(PERIOD / 5)
    logger.error("daskgpu: ending worker process %s at once to free its GPU", worker.address)
    logging.shutdown()
    os._exit(1)


def _still_running(task) -> bool:
    """Whether a worker's task was cancelled while its thread runs on."""
    return (getattr(task, "state", None) == "cancelled"
            and getattr(task, "previous", None) == "executing")
