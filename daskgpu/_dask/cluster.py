"""``LocalGPUCluster``: one Dask worker per local GPU, the embedded default.

Like distributed's ``LocalCluster``, the class only turns its arguments into a
spec for ``SpecCluster``: a scheduler, and one worker per GPU whose
``CUDA_VISIBLE_DEVICES`` lists its own GPU first, with the resource ``GPU=1``
and :class:`~daskgpu.GPUWorkerPlugin`. Without a GPU it runs simulated.

One thing differs from ``SpecCluster``: a worker that left the scheduler (its
nanny restarting it after a lost CUDA context) is waited for as long as its
nanny waits for the new process (``death_timeout``), not only distributed's
``lost-worker-timeout``, since a restart re-imports the main module first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dask.config
from dask.utils import parse_timedelta
from distributed import Nanny, Scheduler, SpecCluster, Worker
from distributed.core import Status
from distributed.deploy.cluster import Cluster
from distributed.security import Security

from daskgpu import _config
from daskgpu._dask.placement import GPUPlacement
from daskgpu._dask.workers.gpu_worker import (
    WORKER_START_TIMEOUT,
    host_memory,
    local_devices,
    worker_options,
)
from daskgpu._runtime import backends

if TYPE_CHECKING:
    from tornado.ioloop import IOLoop

logger = logging.getLogger("daskgpu")

#: Workers a simulated cluster runs when no devices are given.
SIMULATED_WORKERS = 2



class LocalGPUCluster(SpecCluster):
    """A scheduler and one worker per local GPU, each pinned to its GPU.

    Each worker runs in its own process (a ``Nanny``) whose
    ``CUDA_VISIBLE_DEVICES`` lists its GPU first, followed by the others in
    turn, so that device 0 is its own and peers stay visible. Each offers the
    resource ``GPU=1`` and runs :class:`~daskgpu.GPUWorkerPlugin`, also after
    a restart.

    Without a GPU (or with ``simulate=True``) the cluster runs simulated:
    kernels run in Numba's CUDA simulator on the workers, slowly, for tests
    and examples. The dask.config setting ``daskgpu.simulate`` is then on in
    this process for the cluster's lifetime (and restored on close), so that
    kernels shipped from here carry their Python function, and on every
    worker. Simulated workers are pinned to no GPU; ``devices`` then only
    sets how many there are.

    Parameters
    ----------
    devices : int, str or sequence of int/str, optional
        The GPUs to run workers on, as ``CUDA_VISIBLE_DEVICES`` names them:
        ordinals, ``"GPU-<uuid>"`` or ``"MIG-<uuid>"`` strings, or one
        comma-separated string such as ``"0,1"``. An integer names one GPU by
        its ordinal; it is not a count: ``devices=1`` is GPU 1 (the second),
        and ``devices=[0]`` runs one worker, on GPU 0. Default: the GPUs this
        process sees (its ``CUDA_VISIBLE_DEVICES``, else all of them); when
        simulated, ``[0, 1]``.
    simulate : bool, optional
        True runs simulated workers, False requires a GPU. Default: simulated
        when ``daskgpu.simulate`` is already on or no GPU is found.
    threads_per_worker : int
        Threads per worker, at least 1; one keeps the GPU's launches in order.
    processes : bool
        True (default) runs each worker in its own process under a Nanny.
        False runs workers as threads of this process, which cannot be pinned
        to different GPUs and so is allowed only when simulated.
    security : Security or bool, optional
        Passed to distributed; with ``require_encryption`` the cluster uses
        ``tls://``. True makes temporary self-signed credentials.
    host, scheduler_port, dashboard_address, worker_dashboard_address, protocol, \
interface, silence_logs, memory_limit, asynchronous, loop, name, scheduler_kwargs
        As for ``distributed.LocalCluster``. ``dashboard_address=None`` starts
        no dashboard, and the scheduler's other HTTP routes listen on a free
        port, so nothing warns when 8787 is taken; ``":0"`` puts the dashboard
        on a free port.
    death_timeout : float or str
        Seconds (or a string such as ``"5 minutes"``) a worker process may
        take to start, each time: at the cluster's start, and when its nanny
        restarts it after a lost CUDA context or ``client.restart()``, which
        re-imports the main module of the script that started the cluster.
        Default :data:`WORKER_START_TIMEOUT` (120 s). The cluster waits that
        long for a restarting worker; a worker that does not start in time
        fails, is logged as such, and leaves the cluster, whose other workers
        go on. ``None`` waits only ``distributed.deploy.lost-worker-timeout``.
    **worker_kwargs
        Further options for each worker (or Nanny). Options that neither takes,
        and dask-cuda's (``n_workers``, ``CUDA_VISIBLE_DEVICES``,
        ``device_memory_limit``, ``rmm_pool_size``, ...), raise ``TypeError``
        before any process starts; for spilling, RMM and UCX use dask-cuda's
        ``LocalCUDACluster`` with :class:`~daskgpu.GPUWorkerPlugin`.

    Attributes
    ----------
    devices : tuple
        The device of each worker: worker ``i`` runs on ``devices[i]``.
    simulated : bool
        Whether kernels run in the CUDA simulator.

    Examples
    --------
    >>> import daskgpu as dg
    >>> from distributed import Client
    >>> cluster = dg.LocalGPUCluster()  # doctest: +SKIP
    >>> cluster.devices  # doctest: +SKIP
    (0, 1, 2, 3)
    >>> client = Client(cluster)  # doctest: +SKIP

    Without a GPU, or to test without one:

    >>> with dg.LocalGPUCluster(simulate=True) as cluster:  # doctest: +SKIP
    ...     with Client(cluster) as client:
    ...         client.run(dg.device_info)
    """

    devices: tuple[int | str, ...]
    simulated: bool

    def __init__(self, devices: int | str | Sequence[int | str] | None = None,
                 simulate: bool | None = None, threads_per_worker: int = 1, *,
                 processes: bool = True, host: str | None = None, scheduler_port: int = 0,
                 dashboard_address: str | None = ":8787",
                 worker_dashboard_address: str | None = None, protocol: str | None = None,
                 security: Security | bool | None = None, interface: str | None = None,
                 silence_logs: int | bool = logging.WARN,
                 memory_limit: str | float | None = "auto", asynchronous: bool = False,
                 loop: IOLoop | None = None, name: str | None = None,
                 scheduler_kwargs: dict[str, Any] | None = None,
                 death_timeout: float | str | None = WORKER_START_TIMEOUT,
                 **worker_kwargs: Any) -> None:
        # Refuse what no worker would take now, before any process starts.
        check_options(threads_per_worker, worker_kwargs, processes=processes)
        chosen, simulate = resolve_devices(devices, simulate)
        if not processes and not simulate:
            raise ValueError(
                "LocalGPUCluster(processes=False) runs every worker in this one "
                "process, so it cannot pin them to different GPUs; keep "
                "processes=True, or pass simulate=True for threaded test workers"
            )
        security, protocol, host = _transport(
            security, protocol, host, interface, processes, scheduler_port
        )
        worker_kwargs.update(
            host=host, protocol=protocol, interface=interface, security=security,
            silence_logs=silence_logs, death_timeout=death_timeout,
            dashboard_address=worker_dashboard_address,
            dashboard=worker_dashboard_address is not None,
            memory_limit=host_memory(memory_limit, len(chosen)),
        )
        scheduler: dict[str, Any] = {
            "cls": Scheduler,
            "options": {
                "host": host, "port": scheduler_port, "protocol": protocol,
                "interface": interface, "security": security,
                "dashboard": dashboard_address is not None,
                # The scheduler serves HTTP (health, metrics) even without a
                # dashboard, by default on 8787: a free port instead, so that
                # no dashboard means no "port 8787 is already in use" warning.
                "dashboard_address": ":0" if dashboard_address is None else dashboard_address,
                **(scheduler_kwargs or {}),
            },
        }
        # Launches stay on the GPU workers whatever the graph's optimization drops.
        plugins = scheduler["options"].setdefault("plugins", [])
        scheduler["options"]["plugins"] = [*plugins, GPUPlacement()]
        self.devices = chosen
        self.simulated = simulate
        if not processes and silence_logs:
            # Distributed silences its logs (silence_logs=) only while a cluster starts.
            # Closing, an in-process worker's stream to the scheduler may close mid-send,
            # and distributed.batched logs that at INFO with a traceback, after the
            # cluster's one line. It says nothing a user can act on; warnings still show.
            batched = logging.getLogger("distributed.batched")
            level = (logging.getLevelName(silence_logs.upper())
                     if isinstance(silence_logs, str) else silence_logs)
            level = level if isinstance(level, int) and level is not True else logging.WARNING
            batched.setLevel(max(batched.getEffectiveLevel(), level))
        self._departures: dict[Any, object] = {}  # worker name -> its latest departure
        self._gpu_specs = worker_specs(
            chosen, simulate=simulate, threads_per_worker=threads_per_worker,
            processes=processes, **worker_kwargs,
        )
        _config.check()  # a bad daskgpu.* setting stops the cluster here, named
        # Kernels pickled here carry their Python function while a simulated
        # cluster is open; each worker gets its own cluster's setting (specs).
        self._config_guard = _simulation.enter() if self.simulated else None
        try:
            super().__init__(
                scheduler=scheduler, workers=dict(self._gpu_specs),
                asynchronous=asynchronous, loop=loop, security=security,
                silence_logs=silence_logs, name=name,
            )
        except BaseException:
            self._restore_config()
            raise

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        """The spec of a GPU that has no worker, for ``scale``; there is one per GPU."""
        for worker_name, spec in self._gpu_specs.items():
            if worker_name not in self.worker_spec:
                return {worker_name: spec}
        raise ValueError(
            f"LocalGPUCluster runs one worker per GPU and all {len(self.devices)} "
            f"devices {list(self.devices)} have one; to run more workers, give more "
            "devices: LocalGPUCluster(devices=[...])"
        )

    @property
    def _supports_scaling(self) -> bool:  # type: ignore[override]  # as SpecCluster's
        return True

    def _update_worker_status(self, op, msg):
        # SpecCluster (distributed 2026.8) closes for good the nanny of a worker
        # that left the scheduler if no worker of that name is there
        # distributed.deploy.lost-worker-timeout (15 s) later. Meant for a lost
        # job, it also ends a nanny restarting its worker after a lost CUDA context
        # or client.restart(): the new process first re-imports the main module,
        # 21 s once on a loaded machine. Its timer also outlives the worker's
        # return, ending the nanny in the middle of a second restart. Instead the
        # nanny, which bounds each start of its process (death_timeout), decides:
        # a worker is given up lost-worker-timeout after its nanny's bound, and
        # only for its latest departure.
        if op != "remove":
            return super()._update_worker_status(op, msg)
        name = self.scheduler_info["workers"][msg]["name"]
        start = _start_timeout(self.worker_spec.get(name))
        wait = start + parse_timedelta(
            dask.config.get("distributed.deploy.lost-worker-timeout"))
        self._departures[name] = departure = object()
        asyncio.get_running_loop().call_later(wait, self._give_up, name, departure, start,
                                              wait)
        Cluster._update_worker_status(self, op, msg)  # not SpecCluster's timer

    def _give_up(self, name, departure, start, wait):
        """Close the nanny of a worker that left and did not come back, as SpecCluster does."""
        if self._departures.get(name) is not departure:
            return  # it left again since: that departure's timer decides
        del self._departures[name]
        if (self.status != Status.running or name not in self.worker_spec
                or name not in self.workers):
            return  # closing, or scaled down on purpose
        if any(w["name"] == name for w in self.scheduler_info["workers"].values()):
            return
        device = self.devices[name] if isinstance(name, int) and name < len(self.devices) \
            else name
        logger.error(
            "LocalGPUCluster: worker %r (device %s) left and did not come back in %.0f s%s; "
            "the cluster goes on without it. cluster.scale(%d) starts it again; a longer "
            "death_timeout= gives a slow worker start more time",
            name, device, wait,
            f": its process did not start within death_timeout={start:g} s" if start else "",
            len(self.worker_spec),
        )
        self._futures.add(asyncio.ensure_future(_close_nanny(self.workers.pop(name))))

    async def _close(self):
        try:
            await super()._close()
        finally:
            self._restore_config()

    def _restore_config(self):
        guard, self._config_guard = getattr(self, "_config_guard", None), None
        if guard is not None:
            _simulation.exit()


class _SimulationScope:
    """``daskgpu.simulate`` on in this process while any simulated cluster is open.

    One count for the process: closing one of two simulated clusters leaves the
    other simulating (a ``dask.config.set`` per cluster, undone at its close,
    would turn simulation off under the other). The setting before the first
    one opened comes back when the last one closes.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._open = 0
        self._guards = []

    def enter(self):
        with self._lock:
            self._open += 1
            if not backends.current().simulated:
                self._guards.append(dask.config.set({"daskgpu.simulate": True}))
            return self

    def exit(self):
        with self._lock:
            self._open -= 1
            if self._open == 0:
                while self._guards:
                    self._guards.pop().__exit__(None, None, None)


_simulation = _SimulationScope()


#: dask-cuda's ``LocalCUDACluster`` options: what daskgpu offers instead.
_DASK_CUDA_OPTIONS = {
    "CUDA_VISIBLE_DEVICES": "devices=, e.g. devices=[0, 1] or devices=\"0,1\"",
    "n_workers": "devices=: one worker runs per GPU, e.g. devices=[0, 1] for two",
    "nthreads": "threads_per_worker=",
}
#: dask-cuda features LocalGPUCluster leaves to dask-cuda.
_DASK_CUDA_ONLY = frozenset({
    "device_memory_limit", "enable_cudf_spill", "cudf_spill_stats", "jit_unspill",
    "log_spilling", "rmm_pool_size", "rmm_maximum_pool_size", "rmm_managed_memory",
    "rmm_async", "rmm_allocator_external_lib_list", "rmm_release_threshold",
    "rmm_log_directory", "rmm_track_allocations", "enable_tcp_over_ucx",
    "enable_infiniband", "enable_nvlink", "enable_rdmacm", "ucx_net_devices", "pre_import",
})


def check_options(threads_per_worker, worker_kwargs, *, processes=True) -> None:
    """Refuse options that no worker would take, before any process starts.

    Raises ``TypeError`` for an option ``LocalGPUCluster`` does not take: one
    of dask-cuda's gets the daskgpu equivalent, or for spilling, RMM and UCX
    points to dask-cuda's ``LocalCUDACluster`` with
    :class:`~daskgpu.GPUWorkerPlugin`; anything else that neither
    ``distributed.Worker`` nor ``Nanny`` takes is named too. Raises
    ``ValueError`` when ``threads_per_worker`` is not an integer of at least 1.

    Examples
    --------
    >>> check_options(1, {"death_timeout": 10})
    >>> check_options(1, {"n_workers": 2})
    Traceback (most recent call last):
    ...
    TypeError: LocalGPUCluster takes no n_workers=; use devices=: one worker runs per GPU, ...
    >>> check_options(0, {})
    Traceback (most recent call last):
    ...
    ValueError: LocalGPUCluster(threads_per_worker=0): a worker needs at least 1 thread; ...
    """
    if isinstance(threads_per_worker, bool) or not isinstance(threads_per_worker, int) \
            or threads_per_worker < 1:
        raise ValueError(
            f"LocalGPUCluster(threads_per_worker={threads_per_worker!r}): a worker needs at "
            "least 1 thread; the default 1 keeps each GPU's launches in order"
        )
    for key in worker_kwargs:
        if key in _DASK_CUDA_OPTIONS:
            raise TypeError(f"LocalGPUCluster takes no {key}=; use {_DASK_CUDA_OPTIONS[key]}")
        if key in _DASK_CUDA_ONLY:
            raise TypeError(
                f"LocalGPUCluster takes no {key}=: that is dask-cuda's. For spilling, RMM "
                "pools and UCX run dask_cuda.LocalCUDACluster and set its workers up for "
                "daskgpu with client.register_plugin(daskgpu.GPUWorkerPlugin())"
            )
    unknown = sorted(set(worker_kwargs) - _worker_options(processes))
    if unknown:
        raise TypeError(
            f"LocalGPUCluster got unexpected option(s) {', '.join(f'{k}=' for k in unknown)}: "
            f"they go to each distributed.{'Nanny' if processes else 'Worker'}, which does "
            "not take them; see help(daskgpu.LocalGPUCluster)"
        )


def _worker_options(processes) -> set:
    """The keyword options a worker (and its Nanny) accepts."""
    import inspect

    from distributed.core import Server

    classes = (Worker, Server, Nanny) if processes else (Worker, Server)
    return {name for cls in classes
            for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD} - {"self"}


def _transport(security, protocol, host, interface, processes, scheduler_port):
    """``(security, protocol, host)`` chosen as ``distributed.LocalCluster`` does."""
    if security is None:
        security = Security()
    elif security is True:
        try:
            security = Security.temporary()
        except ImportError as exc:
            raise ImportError(
                "security=True makes temporary TLS credentials, which needs the "
                "'cryptography' package: pip install 'daskgpu[batch]' (or cryptography), "
                "or pass a distributed.Security of your own"
            ) from exc
    elif not isinstance(security, Security):
        raise TypeError(
            f"security must be a distributed.Security object or True, got {security!r}"
        )
    if protocol is None:
        if host and "://" in host:
            protocol = host.split("://")[0]
        elif security.require_encryption:
            protocol = "tls://"
        elif not processes and not scheduler_port:
            protocol = "inproc://"
        else:
            protocol = "tcp://"
    if not protocol.endswith("://"):
        protocol += "://"
    if host is None and not protocol.startswith("inproc") and not interface:
        host = "127.0.0.1"
    return security, protocol, host


def resolve_devices(devices: int | str | Sequence[int | str] | None = None,
                    simulate: bool | None = None) -> tuple[tuple[int | str, ...], bool]:
    """The devices to run workers on, and whether to simulate: ``(devices, simulate)``.

    ``simulate=None`` simulates when ``daskgpu.simulate`` is on or the backend
    finds no GPU. Logs a line to the ``daskgpu`` logger when the result is simulated.

    Examples
    --------
    >>> resolve_devices("0,GPU-8f1c", simulate=True)
    ((0, 'GPU-8f1c'), True)
    >>> resolve_devices(simulate=True)
    ((0, 1), True)
    """
    if simulate:
        why, level = "simulate=True", logging.INFO
    elif simulate is None and backends.current().simulated:
        why, level = "daskgpu.simulate is on", logging.INFO
    else:
        found = backends.GPU.devices()
        if found.names or simulate is not None:
            fix = ("Install the NVIDIA driver and check CUDA_VISIBLE_DEVICES, or pass "
                   "simulate=True to run kernels in Numba's CUDA simulator.")
            return local_devices(devices, simulate=False, no_gpu_fix=fix), False
        why, level = f"no CUDA GPU: {found.reason}", logging.WARNING
    chosen = local_devices(devices, simulate=True, simulated_count=SIMULATED_WORKERS)
    # One short line: a newcomer without a GPU sees it on every start.
    logger.log(level, "LocalGPUCluster: %s; %d simulated workers run kernels in Numba's "
               "CUDA simulator", why, len(chosen))
    return chosen, True


async def _close_nanny(nanny) -> None:
    # distributed 2026.8's Nanny.close fails (an AssertionError) while the nanny's
    # process is starting or has just failed to; the nanny is closed all the same,
    # and the cluster's own close must not fail with it.
    try:
        await nanny.close()
    except Exception as exc:
        logger.debug("closing %r: %r", nanny, exc)


def _start_timeout(spec) -> float:
    """The seconds a worker spec's nanny waits for its process to start (0: none)."""
    if not spec or spec.get("cls") is not Nanny:
        return 0.0
    return parse_timedelta(spec.get("options", {}).get("death_timeout")) or 0.0


def worker_specs(devices, *, simulate, threads_per_worker=1, processes=True,
                 **options) -> dict:
    """One ``SpecCluster`` worker spec per device, named 0, 1, ...

    Each is a GPU worker as :func:`~daskgpu._dask.workers.gpu_worker.worker_options`
    defines it, with its peers visible: worker ``i``'s ``CUDA_VISIBLE_DEVICES``
    starts at ``devices[i]`` and continues round the list.

    Examples
    --------
    >>> specs = worker_specs((0, 1, 2), simulate=False)
    >>> [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()]
    ['0,1,2', '1,2,0', '2,0,1']
    >>> specs[0]["options"]["resources"]
    {'GPU': 1}
    """
    devices = tuple(devices)
    return {i: {"cls": Nanny if processes else Worker,
                "options": worker_options(devices, i, simulate=simulate, peers=True,
                                          process=processes, nthreads=threads_per_worker,
                                          **options)}
            for i in range(len(devices))}
