"""GPU placement that holds on any cluster: a scheduler plugin restricts launches to GPU workers.

A ``resources`` annotation on a graph layer does not survive every path to
the scheduler: distributed materializes and optimizes graphs on the
scheduler, with the scheduler's own config, and dask's low-level task fusion
(``optimization.fuse.active``, on by default) turns the layers into one plain
dict, dropping their annotations. Launches then land on plain CPU workers.

:class:`GPUPlacement` instead looks at each task as the scheduler creates it,
after every optimization: a task whose callable is (or, fused, contains) a
daskgpu launch gets the resource restriction ``GPU=``:data:`LAUNCH_SHARE`
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

from dask._task_spec import Alias, DataNode, Task, TaskRef
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.scheduler import NoValidWorkerError

from daskgpu._bounded import BoundedCache
from daskgpu._dask.map_kernel.chunk_task import run_chunk
from daskgpu._image.random_states import STATE_DTYPE, RandomStates
from daskgpu._runtime.launch_task import LaunchTask

__all__ = ["GPU", "GPUPlacement", "GPU_MEMORY", "LAUNCH_SHARE", "NoGPUWorkerError",
           "UNPLACED_CALLBACK", "UNPLACED_PERIOD", "device_bytes",
           "ensure_placement", "launches_in", "memory_offer", "runs_launch"]

logger = logging.getLogger("daskgpu")

#: The resource a GPU worker offers, one per GPU.
GPU = "GPU"

#: What a launch task asks of its worker's ``GPU``: a share, not the whole GPU.
#: The restriction keeps launches on GPU workers; how many run at once is the
#: worker's thread count, as for any Dask task (one by default, as dask-cuda
#: has it). Asking ``GPU=1`` ran them one at a time whatever the threads, while
#: ``map_blocks`` of the same work used them all. A power of two, so that the
#: scheduler's sums of it are exact.
LAUNCH_SHARE = 2.0 ** -10

#: The resource a GPU worker offers as its device's memory, in bytes
#: (:func:`memory_offer`); a launch asks for what its chunk needs on the device.
GPU_MEMORY = "GPU-memory"


def memory_offer(total: int | None, simulated: bool) -> int | None:
    """The ``GPU-memory`` a worker offers: ``daskgpu.device-memory`` when set, else its
    device's ``total`` less ``daskgpu.device-memory-margin``; simulated, only the setting
    (None: no offer, so launches are not sized).

    Examples
    --------
    >>> memory_offer(141 * 2**30, simulated=False) == 139 * 2**30
    True
    >>> memory_offer(None, simulated=True) is None
    True
    """
    from daskgpu import _config

    given = _config.get("device-memory")
    if given is not None:
        return given
    if simulated or not total:
        return None
    return int(total) - _config.memory_margin(int(total))


#: Deep enough for a blockwise-fused task inside a low-level fused one.
_MAX_DEPTH = 6


def runs_launch(node) -> bool:
    """Whether the task spec ``node`` runs a daskgpu launch, also inside fused subgraphs."""
    return next(launches_in(node, _nothing), None) is not None


def launches_in(node, lookup, depth: int = 0):
    """``(task, launch, lookup)`` for each task spec within ``node`` that runs a launch.

    The one walk over Dask's task specs that the scheduler's placement and the
    worker's launch watch share. A task runs a launch when its callable is a
    :class:`~daskgpu._runtime.launch_task.LaunchTask` (a submitted launch) or
    :func:`~daskgpu._dask.map_kernel.chunk_task.run_chunk`, whose first
    argument is the map's launch: inline, or a reference to the map's launch
    key, which ``lookup(key)`` resolves (the scheduler's task spec, or a
    worker's data). ``launch`` is None when it cannot be found. Within a
    low-level fused task (``_execute_subgraph``), its input keys resolve to the
    values it is handed, then to its own tasks; ``lookup`` is the one that holds
    for ``task``'s arguments.
    """
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, Task):
        func = node.func
        if isinstance(func, LaunchTask):
            yield node, func, lookup
            return
        if func is run_chunk:
            launch = _resolved(node.args[0], lookup) if node.args else None
            yield node, launch if isinstance(launch, LaunchTask) else None, lookup
            return
        if node.has_subgraph():
            lookup = _subgraph_lookup(node.args, lookup)
        for a in (*node.args, *node.kwargs.values()):
            yield from launches_in(a, lookup, depth + 1)
    elif isinstance(node, dict):
        def inner(key, graph=node):
            return graph[key] if key in graph else lookup(key)

        for v in node.values():
            yield from launches_in(v, inner, depth + 1)
    elif isinstance(node, (tuple, list)):
        for v in node:
            yield from launches_in(v, lookup, depth + 1)


def _nothing(key):
    return None


def _subgraph_lookup(args, lookup):
    """``lookup`` within a low-level fused task, ``_execute_subgraph(inner, out, inkeys,
    *values)``: its input keys resolve to the values it is handed (the map's launch key
    among them, once the scheduler has filled it in), then to its own tasks."""
    if len(args) < 3 or not isinstance(args[0], dict) or not isinstance(args[2], tuple):
        return lookup
    handed = dict(zip(args[2], args[3:]))

    def inner(key):
        if key not in handed:
            return lookup(key)
        value = handed[key]
        return lookup(value.key) if isinstance(value, TaskRef | Alias) else value

    return inner


def _resolved(node, lookup):
    """An argument's value: a reference to a key (or an alias of one) through ``lookup``
    (itself when that finds nothing), a ``DataNode`` unwrapped; anything else as it is."""
    if isinstance(node, TaskRef | Alias):
        found = lookup(node.key if isinstance(node, TaskRef) else node.target)
        node = node if found is None else found
    if isinstance(node, DataNode):
        node = node.value
    return node


def device_bytes(node, tasks) -> int:
    """The device memory the launches of the task spec ``node`` ask for, in bytes.

    A ``map_kernel`` launch asks what its own chunk needs, from the
    :class:`~daskgpu._dask.map_kernel.chunk_task.ChunkMemory` worked out when the
    graph was built (on its ``ChunkLaunch``, read through the map's launch key in
    ``tasks``, the scheduler's tasks, when it is not in the task) and the block
    shape in the task's place. A ``client.submit`` launch asks for its arguments'
    bytes: arrays in the task, random states, and the futures it reads, by their
    size on the scheduler (0 while one is not computed yet, or is made within the task).
    0 when nothing is known.
    """
    return _memory_asks(node, tasks)[0]


def _memory_asks(node, tasks) -> tuple[int, int, bool]:
    """``(bytes for this task's chunks, bytes for its maps' largest chunks, whether every
    size is known)``: a submitted launch's future not yet computed has no size yet."""
    def spec(key):
        ts = tasks.get(key)
        return None if ts is None else ts.run_spec

    need = most = 0
    known = True
    for task, launch, lookup in launches_in(node, spec):
        if launch is None:
            continue
        if task.func is run_chunk:
            need += launch.device_bytes(_block_shape(task, lookup))
            most += launch.device_bytes()
        else:  # a Launch, submitted with its arguments
            sizes = [_nbytes(a, tasks) for a in task.args]
            known = known and None not in sizes
            asked = launch.device_bytes(argument_bytes=sum(n or 0 for n in sizes))
            need, most = need + asked, most + asked
    return need, most, known


def _block_shape(task, lookup):
    """The block shape in a ``map_kernel`` task's place (its last argument), else None."""
    place = _resolved(task.args[-1], lookup) if task.args else None
    if isinstance(place, tuple) and len(place) == 3 and isinstance(place[1], tuple) \
            and all(isinstance(n, int) for n in place[1]):
        return place[1]
    return None


def _nbytes(node, tasks) -> int | None:
    """An argument's size: an inline array's, random states' (built on the device), or a
    computed key's on the scheduler; None for a key not computed yet, or made within
    the task itself (fused: no task of the scheduler's), whose size is known only then."""
    if isinstance(node, TaskRef | Alias):
        ts = tasks.get(node.key if isinstance(node, TaskRef) else node.target)
        if ts is None:
            return None
        return None if ts.nbytes is None or ts.nbytes < 0 else int(ts.nbytes)
    if isinstance(node, DataNode):
        node = node.value
    if isinstance(node, RandomStates):
        return int(node.n or 0) * STATE_DTYPE.itemsize
    return max(int(getattr(node, "nbytes", 0) or 0), 0)


def _finite(offer) -> bool:
    return isinstance(offer, int | float) and 0 <= offer < float("inf")


class GPUPlacement(SchedulerPlugin):
    """Restrict every task that launches a kernel to workers offering the ``GPU`` resource.

    A launch asks for :data:`LAUNCH_SHARE` of it, or what its own annotation
    asks when more (``resources={"GPU": 1}`` keeps a task alone on its GPU).

    While no worker offers ``GPU`` (a CPU cluster that simulates), tasks are
    left alone: a restriction would make them wait for a GPU that never comes.

    It also asks, for each launch task, the ``GPU-memory`` it needs
    (:func:`device_bytes`; a submitted launch reading a future not computed
    yet asks for the largest offer until it is), fails a launch task that no
    worker could take for ``daskgpu.no-worker-timeout`` seconds
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
        need, most, known = _memory_asks(ts.run_spec, scheduler.tasks)
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

    launch = next((launch for _, launch, _ in launches_in(ts.run_spec, spec)
                   if launch is not None), None)
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
