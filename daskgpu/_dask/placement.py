"""GPU placement that holds on any cluster: a scheduler plugin restricts launches to GPU workers.

A ``resources`` annotation on a graph layer does not survive every path to
the scheduler: distributed materializes and optimizes graphs on the
scheduler, with the scheduler's own config, and dask's low-level task fusion
(``optimization.fuse.active``, on by default) turns the layers into one plain
dict, dropping their annotations. Launches then land on plain CPU workers.

:class:`GPUPlacement` instead looks at each task as the scheduler creates it,
after every optimization: a task whose callable is (or, fused, contains) a
daskgpu launch gets the resource restriction ``GPU=``
:data:`~daskgpu._dask.launch_core.resources.LAUNCH_SHARE`
while any worker of the cluster offers that resource. Task restrictions are
the scheduler's own state, so no optimization setting on either side can drop
them. The scheduler has daskgpu installed anyway: it unpickles the graph,
launches included.

:func:`ensure_placement` registers the plugin once per scheduler; the client
side of ``map_kernel`` and ``run_batch`` calls it, as does
:class:`~daskgpu.LocalGPUCluster`.
"""

from __future__ import annotations

import logging
import threading

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.scheduler import NoValidWorkerError

from daskgpu._bounded import BoundedCache
from daskgpu._dask.launch_core.asks import memory_asks
from daskgpu._dask.launch_core.resources import GPU, GPU_MEMORY, LAUNCH_SHARE
from daskgpu._dask.launch_core.walk import launch_of, runs_launch

__all__ = ["GPUPlacement", "NoGPUWorkerError", "UNPLACED_CALLBACK", "UNPLACED_PERIOD",
           "ensure_placement"]

logger = logging.getLogger("daskgpu")


def _finite(offer) -> bool:
    return isinstance(offer, int | float) and 0 <= offer < float("inf")


class GPUPlacement(SchedulerPlugin):
    """Restrict every task that launches a kernel to workers offering the ``GPU`` resource.

    A launch asks for ``LAUNCH_SHARE`` of it, or what its own annotation
    asks when more (``resources={"GPU": 1}`` keeps a task alone on its GPU).

    While no worker offers ``GPU`` (a CPU cluster that simulates), tasks are
    left alone: a restriction would make them wait for a GPU that never comes.

    It also asks, for each launch task, the ``GPU-memory`` it needs
    (:func:`~daskgpu._dask.launch_core.asks.device_bytes`; a submitted launch
    reading a future not computed yet asks for the largest offer until it is),
    fails a launch task that no worker could take for ``daskgpu.no-worker-timeout`` seconds
    (:class:`NoGPUWorkerError`), and gives the launch tasks running beside one
    that lost its worker's CUDA context one more try.

    Examples
    --------
    >>> from distributed import Client
    >>> client = Client(scheduler_address)  # doctest: +SKIP
    >>> client.register_plugin(GPUPlacement())  # doctest: +SKIP
    """

    name = "daskgpu-gpu-placement"
    idempotent = True

    def __init__(self):
        # Launch tasks that read a future not computed when they were submitted, with the
        # GPU-memory their annotation asked: they ask for the whole largest offer until
        # every size is known, then for what they need.
        self._unsized = {}
        # Launch tasks given one more try because another task lost their worker's CUDA
        # context while they ran, with their own retries.
        self._retried = {}
        # Tasks waiting on a worker that its launch guard replaces, by its address: they
        # are counted one death fewer (:meth:`_let_go`).
        self._spared = {}

    def update_graph(self, scheduler, *, tasks, **kwargs) -> None:
        if not scheduler.resources.get(GPU):
            return
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.run_spec is None or not runs_launch(ts.run_spec):
                continue
            restrictions = dict(ts.resource_restrictions or {})
            restrictions[GPU] = max(restrictions.get(GPU, 0), LAUNCH_SHARE)
            ts.resource_restrictions = restrictions
            if ts.loose_restrictions:
                # allow_other_workers=True: where none of its workers can take it,
                # distributed picks among all workers, resources unasked, GPU or not.
                # The GPU ask is what holds: any GPU worker may take it.
                ts.worker_restrictions = ts.host_restrictions = None
                ts.loose_restrictions = False
            self._ask_memory(scheduler, ts)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        """Ask again, by their arguments' sizes, for the memory of the launch tasks that
        waited on ``key``, now computed; forget a task that is forgotten; when ``key``
        lost its worker's CUDA context, have the launches running beside it run again."""
        if finish == "forgotten":
            self._unsized.pop(key, None)
            self._spared.pop(key, None)
        if start == "processing" and finish != "processing":
            if key in self._retried:
                self._restore_retries(key)
            if key in self._spared:
                self._count_again(key)
            if finish == "erred" and _lost_context(kwargs.get("exception_text")):
                self._retry_beside(key, kwargs.get("worker"))
                self._let_go(key, kwargs.get("worker"), kwargs.get("exception_text"))
        if finish != "memory" or not self._unsized:
            return
        scheduler = self._scheduler
        ts = scheduler.tasks.get(key) if scheduler is not None else None
        for dependent in ts.dependents if ts is not None else ():
            if dependent.key in self._unsized and dependent.state == "waiting":
                self._ask_memory(scheduler, dependent)

    async def start(self, scheduler) -> None:
        self._scheduler = scheduler
        callbacks = getattr(scheduler, "periodic_callbacks", None)
        if isinstance(callbacks, dict) and UNPLACED_CALLBACK not in callbacks:
            from tornado.ioloop import PeriodicCallback

            callbacks[UNPLACED_CALLBACK] = looking = PeriodicCallback(
                self.fail_unplaced, UNPLACED_PERIOD * 1000)
            looking.start()

    async def close(self) -> None:
        callbacks = getattr(self._scheduler, "periodic_callbacks", None)
        if isinstance(callbacks, dict) and UNPLACED_CALLBACK in callbacks:
            callbacks.pop(UNPLACED_CALLBACK).stop()

    _scheduler = None

    def _retry_beside(self, key, address) -> None:
        """Give each launch task running on the worker at ``address``, beside ``key`` (which
        lost the worker's CUDA context), one more try: any of them now fails for that
        task's fault, with the same lost context, and must run again on a fresh worker.
        (The worker itself takes no new task until its nanny replaces it.)"""
        scheduler = self._scheduler
        ws = scheduler.workers.get(address) if scheduler is not None and address else None
        for ts in list(ws.processing) if ws is not None else ():
            if ts.key != key and ts.key not in self._retried and ts.run_spec is not None \
                    and runs_launch(ts.run_spec):
                self._retried[ts.key] = ts.retries
                ts.retries += 1

    def _let_go(self, key, address, exception_text) -> None:
        """The worker at ``address`` is being replaced by its launch guard (``key`` lost its
        CUDA context, or outran its time limit): the tasks waiting on it are not to be
        counted as having killed it (distributed fails a task as ``KilledWorker`` after
        ``allowed-failures`` such deaths), so each is counted one death fewer now, which
        its worker's removal then counts back. A worker whose simulated launch was
        stopped goes on, and is kept."""
        scheduler = self._scheduler
        ws = scheduler.workers.get(address) if scheduler is not None and address else None
        if ws is None or _STOPPED in (exception_text or ""):
            return
        for ts in ws.processing:
            if ts.key != key and ts.key not in self._spared:
                self._spared[ts.key] = address
                ts.suspicious -= 1

    def _count_again(self, key) -> None:
        """The task ``key`` left the worker it was spared on: if the worker is still there
        (the task ended or moved before it went), its count of deaths is as it was."""
        address = self._spared.pop(key)
        scheduler = self._scheduler
        ts = scheduler.tasks.get(key) if scheduler is not None else None
        if ts is not None and address in scheduler.workers:
            ts.suspicious += 1

    def _restore_retries(self, key) -> None:
        """The task ``key`` left the worker whose context was lost: its own retries again."""
        retries = self._retried.pop(key)
        ts = self._scheduler.tasks.get(key) if self._scheduler is not None else None
        if ts is not None:
            ts.retries = retries

    def fail_unplaced(self, now: float | None = None) -> list:
        """Fail the launch tasks that no worker could take for ``daskgpu.no-worker-timeout``
        seconds (waiting in the scheduler's ``no-worker`` state), each naming what it asks
        and what the workers offer; their keys.

        A task waits there when no worker of the cluster offers what it asks, as when
        the one worker with enough ``GPU-memory`` has died and no other will take its
        chunks; distributed would have it wait for ever. A task the caller restricted
        (``workers=``) to workers without a GPU waits there too: where every worker it
        names is there, it fails at once, naming the restriction; else after the wait.
        """
        from time import monotonic

        from daskgpu import _config

        scheduler = self._scheduler
        wait = _config.get("no-worker-timeout")
        if scheduler is None or wait is None or not scheduler.unrunnable:
            return []
        now = monotonic() if now is None else now
        def offered(ts):  # by a worker that is there and allowed, if not running now (paused)
            asks = ts.resource_restrictions
            return any(all(ws.resources.get(name, 0) >= v for name, v in asks.items())
                       for ws in _allowed(scheduler, ts))

        # A task restricted (workers=) to workers that are all there, none offering what
        # it asks, waits for nothing: it is refused at once rather than after the wait.
        late = [ts for ts, since in list(scheduler.unrunnable.items())
                if GPU in (ts.resource_restrictions or {}) and not offered(ts)
                and (now - since > wait or _restricted_to_present(scheduler, ts))]
        if not late:
            return []
        from distributed.protocol import pickle

        stimulus_id = f"daskgpu-no-worker-timeout-{now}"
        recommendations = {}
        for ts in late:
            offers = {ws.address: dict(ws.resources) for ws in _allowed(scheduler, ts)}
            error = NoGPUWorkerError.of(ts.key, _kernel_name(ts, scheduler.tasks),
                                        dict(ts.resource_restrictions), offers, wait,
                                        _restriction(ts))
            recommendations.update(scheduler.transition(
                ts.key, "erred", exception=pickle.dumps(error), cause=ts.key,
                stimulus_id=stimulus_id))
            logger.error("daskgpu: %s", error)
        scheduler.transitions(recommendations, stimulus_id=stimulus_id)
        return [ts.key for ts in late]

    def _ask_memory(self, scheduler, ts) -> None:
        """Set the ``GPU-memory`` the launch task ``ts`` asks for."""
        # A launch never asks for more than the largest worker has: one that needs more
        # (a submitted launch on large arrays; maps are refused when built) runs alone
        # there, rather than wait for a worker that never comes.
        # An offer that is no finite number of bytes (a worker started by hand with
        # GPU-memory=nan) is not one: asking for it would leave tasks waiting for ever.
        largest = max((offer for ws in scheduler.workers.values()
                       if _finite(offer := ws.resources.get(GPU_MEMORY, 0))), default=0)
        if not largest:
            return
        need, most, known = memory_asks(ts.run_spec, scheduler.tasks)
        restrictions = dict(ts.resource_restrictions or {})
        # The annotation's ask, as it was before a first ask of this plugin's replaced it.
        asked = self._unsized.pop(ts.key, restrictions.get(GPU_MEMORY, 0))
        if not known:  # runs alone until its futures' sizes are known
            self._unsized[ts.key] = asked
            need = largest
        need = min(need, largest)
        # The map's own annotation asks for its largest chunk (what holds where this
        # plugin is not); its task's own chunk replaces that. An ask above it is the
        # user's, and kept.
        if need:
            restrictions[GPU_MEMORY] = need if asked <= most else max(asked, need)
            ts.resource_restrictions = restrictions


#: The scheduler's periodic callback that fails launch tasks no worker can take.
UNPLACED_CALLBACK = "daskgpu-no-worker-timeout"

#: Seconds between two looks at the tasks waiting for a worker.
UNPLACED_PERIOD = 1.0


class NoGPUWorkerError(NoValidWorkerError):
    """No worker of the cluster offered what a launch task asks (the ``GPU`` resource, the
    ``GPU-memory`` its chunk needs) for ``daskgpu.no-worker-timeout`` seconds.

    A :class:`distributed.scheduler.NoValidWorkerError`, as distributed's own
    ``no-workers-timeout`` raises, whose message names the kernel, what the task
    asks and what each worker offers.

    Examples
    --------
    >>> str(NoGPUWorkerError.of(("double-1", 0), "double", {"GPU-memory": 2048},
    ...                         {"tcp://a:1": {"GPU": 1, "GPU-memory": 1024}}, 60.0))[:58]
    "kernel 'double' (task ('double-1', 0)) asks for GPU-memory"
    """

    @classmethod
    def of(cls, key, kernel, asks, offers, timeout, restriction=None) -> NoGPUWorkerError:
        """``restriction``: the caller's ``workers=`` restriction, which ``offers`` (the
        workers it allows) are limited to."""
        from dask.utils import format_bytes

        def said(resources):
            return ", ".join(f"{name}={format_bytes(int(v)) if name == GPU_MEMORY else f'{v:g}'}"
                             for name, v in sorted(resources.items())) or "nothing"

        offered = "; ".join(f"{address}: {said(r)}" for address, r in sorted(offers.items()))
        if restriction is not None:
            message = (
                f"kernel {kernel!r} (task {key!r}) asks for {said(asks)}, and is restricted "
                f"to workers={restriction!r}, of which none offers that: "
                + (f"they offer {offered}" if offers else "none of them is there")
                + "; restrict it to a GPU worker, pass allow_other_workers=True, or leave "
                "workers= out")
            return cls(key, set(), set(), asks, timeout, message)
        message = (
            f"kernel {kernel!r} (task {key!r}) asks for {said(asks)}, and no worker of the "
            f"cluster offered that for {timeout:g} s (daskgpu.no-worker-timeout): "
            + (f"the workers offer {offered}" if offers else "there are no workers")
            + "; start a worker that offers it (a GPU with more memory, or a larger "
            "daskgpu.device-memory), or use smaller chunks")
        return cls(key, set(), set(), asks, timeout, message)

    def __init__(self, task, host_restrictions, worker_restrictions, resource_restrictions,
                 timeout, message=""):
        Exception.__init__(self, task, host_restrictions, worker_restrictions,
                           resource_restrictions, timeout, message)

    def __str__(self) -> str:
        return self.args[5]


def _allowed(scheduler, ts) -> list:
    """The workers there that the caller's restrictions (``workers=``) allow ``ts`` on."""
    named = set(ts.worker_restrictions or ())
    hosts = set(ts.host_restrictions or ())
    if ts.loose_restrictions or not (named or hosts):
        return list(scheduler.workers.values())
    return [ws for ws in scheduler.workers.values()
            if ws.address in named or ws.host in hosts or ws.name in hosts]


def _restricted_to_present(scheduler, ts) -> bool:
    """Whether ``ts`` may run only on named workers, all of them there."""
    named = ts.worker_restrictions
    return bool(named) and not ts.host_restrictions and not ts.loose_restrictions \
        and all(address in scheduler.workers for address in named)


def _restriction(ts) -> list | None:
    """The caller's ``workers=`` restriction of ``ts``, sorted; None when it has none."""
    if ts.loose_restrictions or not (ts.worker_restrictions or ts.host_restrictions):
        return None
    return sorted({*(ts.worker_restrictions or ()), *(ts.host_restrictions or ())})


#: What the error of a launch stopped over its time limit says: its worker goes on.
_STOPPED = "the simulated launch was stopped"


def _lost_context(exception_text) -> bool:
    """Whether a task's error, as the scheduler has its text, is a lost CUDA context."""
    from daskgpu._errors import ContextLostError, LaunchTimeoutError

    return isinstance(exception_text, str) and exception_text.startswith(
        (f"{ContextLostError.__name__}(", f"{LaunchTimeoutError.__name__}("))


def _kernel_name(ts, tasks) -> str:
    """The name of the kernel the scheduler's task ``ts`` launches (its key's, else)."""
    from dask.utils import key_split

    def spec(key):
        found = tasks.get(key)
        return None if found is None else found.run_spec

    launch = launch_of(ts.run_spec, spec)
    return launch.kernel_name if launch is not None else key_split(ts.key)


# Schedulers known to run the plugin, by address (client side).
_registered = BoundedCache(64, "schedulers with GPU placement")
_lock = threading.Lock()


def ensure_placement(client) -> None:
    """Register :class:`GPUPlacement` on ``client``'s scheduler, once per scheduler.

    A scheduler that cannot take it (one without daskgpu installed cannot
    unpickle it, nor the launches) is tried once and named in one warning;
    launches then keep only their ``resources`` annotation.
    """
    address = client.scheduler.address
    if address in _registered:
        return
    with _lock:
        if address in _registered:
            return
        try:
            client.register_plugin(GPUPlacement(), name=GPUPlacement.name)
        except Exception as exc:
            logger.warning(
                "daskgpu: the scheduler at %s did not take the GPU placement plugin "
                "(%s: %s); install daskgpu where the scheduler runs, or launches may land "
                "on workers without a GPU when the graph is fused", address,
                type(exc).__name__, exc)
        _registered.put(address, True)
