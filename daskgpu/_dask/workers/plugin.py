"""``GPUWorkerPlugin``: readies a Dask worker for daskgpu launches, and keeps it usable.

The plugin is plain data on the client; its ``setup`` runs on the worker. It
is made of three parts, each one thing, set up, fed task transitions and torn
down in turn:

- :class:`~daskgpu._dask.workers.device_facts.DeviceFacts`: the device's
  context and facts, the heartbeat metrics clients read, the ``GPU-memory``
  offer;
- :class:`~daskgpu._dask.workers.watchdog.LaunchGuard`: time limits,
  cancellation, and replacing the worker after a lost CUDA context;
- :class:`~daskgpu._dask.workers.gpu_time.TaskTimes`: launches' GPU time in
  distributed's fine performance metrics and Prometheus, NVTX ranges.

:func:`device_info` reads the facts back. Nothing here imports numba.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin

from daskgpu import _config
from daskgpu._dask.workers.device_facts import DEVICE_METRIC, SIMULATED_METRIC, DeviceFacts, probe
from daskgpu._dask.workers.gpu_time import TaskTimes
from daskgpu._dask.workers.watchdog import (
    GRACE,
    WATCH_CALLBACK,
    LaunchGuard,
    close_worker,
    lost_context,
)

__all__ = ["DEVICE_METRIC", "GRACE", "PLUGIN_NAME", "SIMULATED_METRIC", "WATCH_CALLBACK",
           "GPUWorkerPlugin", "close_worker", "device_info", "lost_context"]

#: The name the plugin registers under on every worker.
PLUGIN_NAME = "daskgpu-gpu"


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
    half a second later, after the task's error has gone to the scheduler,
    starting no other task meanwhile; its nanny then starts a fresh process,
    and the launch tasks that were running beside the failed one run again
    (:class:`~daskgpu._dask.placement.GPUPlacement`). It does the same for a launch
    task over its time limit, which it fails with a
    :class:`~daskgpu.LaunchTimeoutError`, and for a cancelled launch task
    still running ``daskgpu.cancel-grace`` seconds later
    (:mod:`~daskgpu._dask.workers.watchdog`): a kernel that will not end
    holds its GPU until its context is torn down. A time limit counts the
    launch's own run, from when its kernel starts. On a worker without a
    nanny, which cannot be replaced, a simulated launch is stopped instead.

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

    def __init__(self):
        self._facts = DeviceFacts()
        self._guard = LaunchGuard()  # on the worker only: never pickled
        self._times = TaskTimes()

    @property
    def info(self) -> dict | None:
        """The device facts recorded by :meth:`setup`; None until it has run."""
        return self._facts.info

    def setup(self, worker):
        """Check the settings, then set up the device's facts, the launch guard and the
        GPU time report on the worker."""
        _config.check()  # a bad daskgpu.* value fails the worker's start, named
        self._facts.setup(worker)
        self._times.setup(worker)
        self._guard.setup(worker)

    def teardown(self, worker):
        """Stop watching launches and sending their time; close open NVTX ranges."""
        self._guard.teardown(worker)
        self._times.teardown(worker)

    def transition(self, key, start, finish, **kwargs):
        """Hand a task's state change to the parts that follow tasks.

        Distributed calls this on the worker's event loop for every state
        change of every task; the parts look only at changes to and from
        ``"executing"`` and to ``"error"``.
        """
        self._times.transition(key, start, finish)
        self._guard.transition(key, start, finish)

    def __reduce__(self):
        return _restored, (self._facts.info,)

    def __repr__(self):
        return "GPUWorkerPlugin()"


def _restored(info):
    plugin = GPUWorkerPlugin()
    plugin._facts.info = info
    return plugin


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
    return probe(warm=False)
