"""The one walk over Dask's task specs that finds the launches a task runs.

The scheduler's placement (:mod:`daskgpu._dask.placement`) and the worker's
launch watch (:mod:`daskgpu._dask.workers.watchdog`) share it: a task runs a
launch when its callable is a
:class:`~daskgpu._runtime.launch_task.LaunchTask` (a submitted launch) or
:func:`~.task.run_chunk`, whose first argument is the map's launch, also
inside fused tasks. It reads types, never attributes.
"""

from __future__ import annotations

from dask._task_spec import Alias, DataNode, Task, TaskRef

from daskgpu._dask.launch_core.task import ChunkPlace, run_chunk
from daskgpu._runtime.launch_task import LaunchTask

__all__ = ["held_in", "launch_of", "launches_in", "place_of", "resolved", "runs_launch"]

#: Deep enough for a blockwise-fused task inside a low-level fused one.
_MAX_DEPTH = 6


def runs_launch(node) -> bool:
    """Whether the task spec ``node`` runs a daskgpu launch, also inside fused subgraphs."""
    return next(launches_in(node, _nothing), None) is not None


def launch_of(node, lookup) -> LaunchTask | None:
    """The first launch the task spec ``node`` runs, read through ``lookup``; None when
    it runs none (or its launch cannot be found)."""
    return next((launch for _, launch, _ in launches_in(node, lookup)
                 if launch is not None), None)


def place_of(node) -> ChunkPlace | None:
    """The :class:`~.task.ChunkPlace` of the first map task within the task spec ``node``
    (its last argument, read by type); None where it runs none.

    Examples
    --------
    >>> from dask._task_spec import Task
    >>> place = ChunkPlace((1,), (4,), (4,))
    >>> place_of(Task("k", run_chunk, "launch", DataNode(None, place))) == place
    True
    """
    for task, _, _ in launches_in(node, lambda key: None):
        last = task.args[-1] if task.args else None
        last = last.value if isinstance(last, DataNode) else last
        if isinstance(last, ChunkPlace):
            return last
    return None


def held_in(data):
    """A ``lookup`` over a mapping of keys to values (a worker's data): None when absent."""
    def held(key):
        return data[key] if key in data else None

    return held


def launches_in(node, lookup, depth: int = 0):
    """``(task, launch, lookup)`` for each task spec within ``node`` that runs a launch.

    A map's launch is inline or a reference to the map's launch key, which
    ``lookup(key)`` resolves (the scheduler's task spec, or a worker's data).
    ``launch`` is None when it cannot be found. Within a low-level fused task
    (``_execute_subgraph``), its input keys resolve to the values it is handed,
    then to its own tasks; ``lookup`` is the one that holds for ``task``'s
    arguments.
    """
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, Task):
        func = node.func
        if isinstance(func, LaunchTask):
            yield node, func, lookup
            return
        if func is run_chunk:
            launch = resolved(node.args[0], lookup) if node.args else None
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


def resolved(node, lookup):
    """An argument's value: a reference to a key (or an alias of one) through ``lookup``
    (itself when that finds nothing), a ``DataNode`` unwrapped; anything else as it is."""
    if isinstance(node, TaskRef | Alias):
        found = lookup(node.key if isinstance(node, TaskRef) else node.target)
        node = node if found is None else found
    if isinstance(node, DataNode):
        node = node.value
    return node
