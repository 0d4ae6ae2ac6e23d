"""``GPUWorkerPlugin``: readies a Dask worker for daskgpu launches; closes it after a lost context.

The plugin is plain data on the client; its ``setup`` runs on the worker, where
it makes the worker's GPU current (creating its context), imports the runtime,
and records the device's facts. :func:`device_info` reads those facts back.

After a sticky CUDA error (an illegal address, say) every later CUDA call in
the process fails. The runtime raises :class:`~daskgpu._errors.ContextLostError`
and nothing else; the plugin sees the task fail with it (its ``transition``
hook) and closes the worker process once the error has reached the scheduler,
so that the nanny starts a fresh one and later tasks (and retries, with
``retries=``) run on a working context. Nothing here imports numba.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from dask.utils import key_split
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol import pickle

from daskgpu import _config
from daskgpu._dask.placement import GPU_MEMORY, memory_offer
from daskgpu._dask.workers import prometheus
from daskgpu._dask.workers.gpu_time import digest_gpu_time
from daskgpu._dask.workers.watchdog import (
    PERIOD,
    LaunchWatch,
    launch_of,
    timeout_message,
)
from daskgpu._errors import ContextLostError, LaunchTimeoutError
from daskgpu._runtime import backends, metrics

logger = logging.getLogger("daskgpu")

#: The name the plugin registers under on every worker.
PLUGIN_NAME = "daskgpu-gpu"

#: The worker metric (sent with every heartbeat, read by clients from the
#: scheduler's worker info) that says the worker runs kernels in the simulator.
SIMULATED_METRIC = "daskgpu-simulated"

#: The worker metric that says what PTX the worker's GPU can run: ``{"cc": [9, 0],
#: "driver": [13, 0], "linker": [13, 0] or None}`` (None when simulated), so that a
#: client refuses a map its workers cannot link when it builds the graph.
DEVICE_METRIC = "daskgpu-device"

#: The worker's periodic callback that looks at running launches (:meth:`GPUWorkerPlugin._look`).
WATCH_CALLBACK = "daskgpu-launch-watch"

# Seconds the worker keeps running after a task lost the CUDA context, so
# that the task's error reaches the scheduler before the process goes.
_GRACE = 0.5


class GPUWorkerPlugin(WorkerPlugin):
    """Set up a Dask worker's GPU for daskgpu: context, runtime imports, device facts.

    :class:`~daskgpu.LocalGPUCluster` installs it on each of its workers. On
    any other cluster (dask-cuda's ``LocalCUDACluster``, ``dask worker
    --resources GPU=1``, SLURM, Kubernetes) register it from the client; it
    then also runs on workers that join or restart later.

    On setup the worker makes device 0 current, the first GPU in its
    ``CUDA_VISIBLE_DEVICES`` and so the one it is pinned to, which creates its
    CUDA context. It imports the launch runtime, so that the first task pays
    neither, and records the device's facts for :func:`device_info`. While
    ``daskgpu.simulate`` is on in the worker's ``dask.config``, setup makes no
    GPU call and records simulated facts. A worker without a usable GPU, not
    simulating, fails setup with a :class:`~daskgpu.DeviceError`.

    When a task on the worker fails with a
    :class:`~daskgpu.ContextLostError` (a sticky CUDA error: the
    process's context is unusable), the plugin closes the worker process
    half a second later, after the task's error has gone to the scheduler;
    its nanny then starts a fresh process. It does the same for a launch
    task over its time limit, which it fails with a
    :class:`~daskgpu.LaunchTimeoutError`, and for a cancelled launch task
    still running ``daskgpu.cancel-grace`` seconds later
    (:mod:`~daskgpu._dask.workers.watchdog`): a kernel that will not end
    holds its GPU until its context is torn down.

    From setup to teardown, each launch in a task reports its time by
    activity (``link``, ``copy-in``, ``launch``, ``kernel``, ``copy-out``; see
    :mod:`daskgpu._runtime.metrics`) to distributed's fine performance
    metrics (:mod:`~daskgpu._dask.workers.gpu_time`): in seconds as
    ``"daskgpu <activity>"``, beside the task's own ``thread-cpu`` and
    ``thread-noncpu``, which they are taken out of, and in the unit
    ``"kernel-seconds"`` as ``"<kernel> <activity>"``, so that the dashboard's
    Fine Performance Metrics page, a ``Span``'s ``cumulative_worker_metrics``
    and the scheduler's show both the total by activity and each kernel's
    share. With ``prometheus_client`` installed, the worker's ``/metrics``
    endpoint carries daskgpu's figures too
    (:mod:`~daskgpu._dask.workers.prometheus`). While a profiler reads NVTX
    (the ``nvtx`` package installed), every task the worker runs is also an
    NVTX range named after its key's prefix.

    Examples
    --------
    >>> import daskgpu as dg
    >>> plugin = dg.GPUWorkerPlugin()
    >>> plugin.name
    'daskgpu-gpu'
    >>> client.register_plugin(dg.GPUWorkerPlugin())  # doctest: +SKIP
    >>> client.run(dg.device_info)  # doctest: +SKIP
    {'tcp://10.0.0.5:40331': {'simulated': False, 'name': 'NVIDIA H200', ...}}
    """

    name = PLUGIN_NAME
    # Setup is the same every time: registering it again changes nothing.
    idempotent = True

    #: The worker set up, on the worker only (never pickled).
    _worker = None
    #: Whether the worker is being closed after a lost context.
    _closing = False
    #: The NVTX ranges of running tasks by key, from setup to teardown (on the worker only).
    _ranges = None
    #: The running launches' time limits and cancellations (on the worker only).
    _watch = None

    def __init__(self):
        #: The device facts recorded by :meth:`setup`; None until it has run.
        self.info = None

    def setup(self, worker):
        """Check the settings, make the worker's GPU current, import the runtime, record
        its facts, and send launches' time to distributed's fine performance metrics."""
        _config.check()  # a bad daskgpu.* value fails the worker's start, named
        self._worker = worker
        self.info = _probe(warm=True)
        heartbeat = getattr(worker, "metrics", None)
        if isinstance(heartbeat, dict):  # clients learn from it that they must ship Python
            heartbeat[SIMULATED_METRIC] = _simulated
            heartbeat[DEVICE_METRIC] = _device_versions
        if self._ranges is None:  # set up once: one recorder to remove on teardown
            prometheus.install(digest_gpu_time)  # before the first launch makes its sinks
            metrics.add_recorder(digest_gpu_time)
        self._ranges = {}  # key -> NVTX range of the task running it
        self._watch = LaunchWatch.from_config()
        self._offer_memory(worker)
        callbacks = getattr(worker, "periodic_callbacks", None)
        if isinstance(callbacks, dict) and WATCH_CALLBACK not in callbacks:
            from tornado.ioloop import PeriodicCallback

            callbacks[WATCH_CALLBACK] = watching = PeriodicCallback(self._look, PERIOD * 1000)
            watching.start()

    def _offer_memory(self, worker) -> None:
        """Offer the device's memory as the ``GPU-memory`` resource, so that launches running
        at once never ask for more than the device has; done once the facts are known."""
        offer = memory_offer(self.info["total_memory"], self.info["simulated"])
        if offer is None or not hasattr(worker, "set_resources"):
            return
        state = worker.state
        if state.total_resources.get(GPU_MEMORY) == offer:
            return
        if getattr(worker, "contact_address", None) is None:
            # Not registered yet (a plugin the worker was made with): its registration
            # tells the scheduler its resources, this one included.
            state.available_resources[GPU_MEMORY] = offer
            state.total_resources[GPU_MEMORY] = offer
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # set up outside the worker's event loop (a test)
            return
        asyncio.ensure_future(worker.set_resources(**{GPU_MEMORY: offer}))

    def teardown(self, worker):
        """Stop sending launches' time and watching them; close the NVTX ranges still open."""
        callbacks = getattr(worker, "periodic_callbacks", None)
        if isinstance(callbacks, dict) and WATCH_CALLBACK in callbacks:
            callbacks.pop(WATCH_CALLBACK).stop()
        self._watch = None
        if self._ranges is None:
            return
        metrics.remove_recorder(digest_gpu_time)
        for range_id in self._ranges.values():
            metrics.end_range(range_id)
        self._ranges = None

    def transition(self, key, start, finish, **kwargs):
        """Open and close a task's NVTX range; watch a running launch's time and its
        cancellation; close the worker after a task failed with a lost CUDA context.

        Distributed calls this on the worker's event loop for every state
        change of every task; only changes to and from ``"executing"`` and
        to ``"error"`` are looked at.
        """
        if finish == "executing" or start == "executing":
            self._task_range(key, finish == "executing")
            self._watch_task(key, start, finish)
        if finish != "error" or self._worker is None or self._closing:
            return
        task = self._worker.state.tasks.get(key)
        if task is None or not lost_context(task):
            return
        self._closing = True
        worker = self._worker
        logger.error("daskgpu: task %r lost the CUDA context (%s); closing worker %s so "
                     "its nanny restarts it", key, task.exception_text, worker.address)
        # A kernel over its time limit still runs: the process must end, not close.
        hung = "LaunchTimeoutError" in (task.exception_text or "")
        worker.loop.call_later(_GRACE, _close, worker, hung)

    def _watch_task(self, key, start, finish) -> None:
        watch, worker = self._watch, self._worker
        if watch is None or worker is None:
            return
        task = worker.state.tasks.get(key)
        if finish == "executing":
            launch = launch_of(task.run_spec, worker.data) if task is not None else None
            if launch is not None:
                watch.started(key, launch.timeout, kernel=launch.kernel_name)
        elif _still_running(task):  # cancelled while it runs (seen as "released")
            watch.cancelled(key)
        else:
            watch.ended(key)

    def _look(self) -> None:
        """Fail the launch tasks over their time limit; replace the process whose cancelled
        launch is still running after the grace period."""
        watch, worker = self._watch, self._worker
        if not watch or worker is None or self._closing:
            return
        for key, limit in watch.overdue():
            kernel = watch.kernel(key)
            watch.ended(key)
            task = worker.state.tasks.get(key)
            if task is None or task.state != "executing":
                continue
            # Raised into the task's state, not its thread, which may never return; the
            # error's transition then closes the worker, as for a lost context.
            from distributed.worker_state_machine import ExecuteFailureEvent

            worker.handle_stimulus(ExecuteFailureEvent.from_exception(
                LaunchTimeoutError(timeout_message(key, limit, kernel)), key=key,
                run_id=task.run_id, start=task.start_time, stop=time.time(),
                stimulus_id=f"daskgpu-launch-timeout-{time.time()}"))
        for key in watch.stuck():
            if not _still_running(worker.state.tasks.get(key)):
                watch.ended(key)  # its thread returned within the grace after all
        stuck = watch.stuck()
        if stuck and not self._closing:
            self._closing = True
            logger.error("daskgpu: cancelled launch task(s) %s still run %.3g s after being "
                         "cancelled (daskgpu.cancel-grace); closing worker %s so its nanny "
                         "starts a fresh process and the GPU is free", stuck, watch.grace,
                         worker.address)
            worker.loop.call_later(0, _close, worker, True)

    def _task_range(self, key, started: bool) -> None:
        """An NVTX range over a task's run, named after its key's prefix (a bounded set
        of names: NVTX registers each one). Opened here, closed on another thread."""
        ranges = self._ranges
        if ranges is None:
            return
        if started:
            range_id = metrics.start_range(key_split(key))
            if range_id is not None:
                ranges[key] = range_id
        elif key in ranges:
            metrics.end_range(ranges.pop(key))

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_worker", None)  # the worker stays where it is
        state.pop("_closing", None)
        state.pop("_ranges", None)
        state.pop("_watch", None)
        return state

    def __repr__(self):
        return "GPUWorkerPlugin()"


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


def _close(worker, hung: bool = False):
    """End the worker so that its nanny starts a fresh process.

    ``hung``: a kernel is still running. A process that closes normally then
    waits for it as it exits (the CUDA driver finishes a context's work before it
    destroys it); one that ends at once has its context torn down by the driver,
    which frees the GPU. Only a worker with a nanny is ended so: one without
    shares its process with others (threaded workers, a client's).
    """
    if hung and getattr(worker, "nanny", None):
        logger.error("daskgpu: ending worker process %s at once to free its GPU", worker.address)
        logging.shutdown()
        os._exit(1)
    # nanny=False: the nanny sees its worker process exit and starts a new one.
    asyncio.ensure_future(
        worker.close(nanny=False, executor_wait=False, reason="daskgpu: CUDA context lost")
    )


def device_info(dask_worker=None) -> dict:
    """The GPU facts of a Dask worker, or of this process outside a worker.

    On a worker that runs :class:`GPUWorkerPlugin`, these are the facts its
    setup recorded; elsewhere they are read now (making device 0 current).

    Parameters
    ----------
    dask_worker : distributed.Worker, optional
        Passed by ``client.run``; inside a task the running worker is found
        without it.

    Returns
    -------
    dict
        ``simulated`` (bool), ``device_id`` (the ordinal within the process's
        ``CUDA_VISIBLE_DEVICES``, always 0 on a pinned worker), ``name``,
        ``cc`` (``(major, minor)``), ``total_memory`` (bytes), ``uuid``
        (``"GPU-..."``, as ``CUDA_VISIBLE_DEVICES`` takes it), ``pci_bus_id``,
        ``driver_version`` and ``nvjitlink_version`` (each ``(major, minor)``;
        nvJitLink None when not installed) and
        ``cuda_visible_devices`` (the environment variable, or None).
        Simulated facts carry None for everything a GPU would tell.

    Raises
    ------
    DeviceError
        Outside simulation, when this process has no usable GPU.

    Examples
    --------
    >>> import dask, daskgpu as dg
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.device_info()["simulated"]
    True
    >>> client.run(dg.device_info)  # doctest: +SKIP
    {'tcp://127.0.0.1:40331': {'simulated': False, 'name': 'NVIDIA H200', ...}}
    """
    if dask_worker is None:
        from distributed import get_worker

        try:
            dask_worker = get_worker()
        except ValueError:  # not inside a task
            dask_worker = None
    if dask_worker is not None:
        plugin = getattr(dask_worker, "plugins", {}).get(PLUGIN_NAME)
        if isinstance(plugin, GPUWorkerPlugin) and plugin.info is not None:
            return dict(plugin.info)
    return _probe(warm=False)


def _still_running(task) -> bool:
    """Whether a worker's task was cancelled while its thread runs on."""
    return (getattr(task, "state", None) == "cancelled"
            and getattr(task, "previous", None) == "executing")


def _device_versions(worker) -> dict | None:
    plugin = worker.plugins.get(PLUGIN_NAME)
    info = plugin.info if plugin is not None else None
    if not info or info["simulated"]:
        return None
    linker = info["nvjitlink_version"]
    return {"cc": list(info["cc"]), "driver": list(info["driver_version"]),
            "linker": list(linker) if linker else None}


def _simulated(worker) -> bool:
    plugin = worker.plugins.get(PLUGIN_NAME)
    return bool(plugin is not None and plugin.info and plugin.info["simulated"])


def _probe(warm: bool) -> dict:
    """This process's device facts, from its backend; with ``warm``, also load the launch
    paths."""
    return backends.current().device_facts(warm=warm)
