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

from daskgpu._bounded import BoundedCache
from daskgpu._dask.map_kernel.chunk_task import run_chunk
from daskgpu._runtime.launch_task import LaunchTask

__all__ = ["GPU", "GPUPlacement", "GPU_MEMORY", "LAUNCH_SHARE", "device_bytes",
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
    bytes: arrays in the task, and the futures it reads, by their size on the
    scheduler. 0 when nothing is known.
    """
    return _memory_asks(node, tasks)[0]


def _memory_asks(node, tasks) -> tuple[int, int]:
    """``(bytes for this task's chunks, bytes for its maps' largest chunks)``."""
    def spec(key):
        ts = tasks.get(key)
        return None if ts is None else ts.run_spec

    need = most = 0
    for task, launch, lookup in launches_in(node, spec):
        if launch is None:
            continue
        if task.func is run_chunk:
            need += launch.device_bytes(_block_shape(task, lookup))
            most += launch.device_bytes()
        else:  # a Launch, submitted with its arguments
            asked = launch.device_bytes(argument_bytes=sum(
                _nbytes(a, tasks) for a in task.args))
            need, most = need + asked, most + asked
    return need, most


def _block_shape(task, lookup):
    """The block shape in a ``map_kernel`` task's place (its last argument), else None."""
    place = _resolved(task.args[-1], lookup) if task.args else None
    if isinstance(place, tuple) and len(place) == 3 and isinstance(place[1], tuple) \
            and all(isinstance(n, int) for n in place[1]):
        return place[1]
    return None


def _nbytes(node, tasks) -> int:
    """An argument's size: an inline array's, or a computed key's on the scheduler."""
    if isinstance(node, TaskRef | Alias):
        ts = tasks.get(node.key if isinstance(node, TaskRef) else node.target)
        return 0 if ts is None else max(int(ts.nbytes or 0), 0)
    if isinstance(node, DataNode):
        node = node.value
    return max(int(getattr(node, "nbytes", 0) or 0), 0)


def _finite(offer) -> bool:
    return isinstance(offer, int | float) and 0 <= offer < float("inf")


class GPUPlacement(SchedulerPlugin):
    """Restrict every task that launches a kernel to workers offering the ``GPU`` resource.

    A launch asks for :data:`LAUNCH_SHARE` of it, or what its own annotation
    asks when more (``resources={"GPU": 1}`` keeps a task alone on its GPU).

    While no worker offers ``GPU`` (a CPU cluster that simulates), tasks are
    left alone: a restriction would make them wait for a GPU that never comes.

    Examples
    --------
    >>> from distributed import Client
    >>> client = Client(scheduler_address)  # doctest: +SKIP
    >>> client.register_plugin(GPUPlacement())  # doctest: +SKIP
    """

    name = "daskgpu-gpu-placement"
    idempotent = True

    def update_graph(self, scheduler, *, tasks, **kwargs) -> None:
        if not scheduler.resources.get(GPU):
            return
        # A launch never asks for more than the largest worker has: one that needs more
        # (a submitted launch on large arrays; maps are refused when built) runs alone
        # there, rather than wait for a worker that never comes.
        # An offer that is no finite number of bytes (a worker started by hand with
        # GPU-memory=nan) is not one: asking for it would leave tasks waiting for ever.
        largest = max((offer for ws in scheduler.workers.values()
                       if _finite(offer := ws.resources.get(GPU_MEMORY, 0))), default=0)
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.run_spec is None or not runs_launch(ts.run_spec):
                continue
            restrictions = dict(ts.resource_restrictions or {})
            restrictions[GPU] = max(restrictions.get(GPU, 0), LAUNCH_SHARE)
            if largest:
                need, most = _memory_asks(ts.run_spec, scheduler.tasks)
                need = min(need, largest)
                asked = restrictions.get(GPU_MEMORY, 0)
                # The map's own annotation asks for its largest chunk (what holds where
                # this plugin is not); its task's own chunk replaces that. An ask above
                # it is the user's, and kept.
                if need:
                    restrictions[GPU_MEMORY] = need if asked <= most else max(asked, need)
            ts.resource_restrictions = restrictions


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
