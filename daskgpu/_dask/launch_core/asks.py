"""The device memory a task's launches ask of the scheduler's ``GPU-memory``.

Read by the scheduler's placement (:mod:`daskgpu._dask.placement`) from the
task specs it holds: a map's launch by its own block (its
:class:`~.task.ChunkPlace`, read by type), a submitted launch by its
arguments' sizes.
"""

from __future__ import annotations

from typing import NamedTuple

from dask._task_spec import Alias, DataNode, TaskRef

from daskgpu._dask.launch_core.task import ChunkPlace, run_chunk
from daskgpu._dask.launch_core.walk import launches_in, resolved
from daskgpu._image.random_states import STATE_DTYPE, RandomStates

__all__ = ["MemoryAsks", "device_bytes", "memory_asks"]


class MemoryAsks(NamedTuple):
    """What a task's launches ask of the device's memory, in bytes.

    Attributes
    ----------
    need : int
        For this task's own chunks.
    most : int
        For its maps' largest chunks (what a map's annotation asks).
    known : bool
        Whether every size is known: a submitted launch's future not yet
        computed has no size yet.
    """

    need: int
    most: int
    known: bool


def device_bytes(node, tasks) -> int:
    """The device memory the launches of the task spec ``node`` ask for, in bytes.

    A ``map_kernel`` launch asks what its own chunk needs, from the memory its
    launch worked out when the graph was built (read through the map's launch
    key in ``tasks``, the scheduler's tasks, when it is not in the task) and the
    block shape of the task's :class:`~.task.ChunkPlace`. A ``client.submit``
    launch asks for its arguments' bytes: arrays in the task, random states, and
    the futures it reads, by their size on the scheduler (0 while one is not
    computed yet, or is made within the task). 0 when nothing is known.
    """
    return memory_asks(node, tasks).need


def memory_asks(node, tasks) -> MemoryAsks:
    """The :class:`MemoryAsks` of the task spec ``node``, read through ``tasks`` (the
    scheduler's)."""
    def spec(key):
        ts = tasks.get(key)
        return None if ts is None else ts.run_spec

    need = most = 0
    known = True
    for task, launch, lookup in launches_in(node, spec):
        if launch is None:
            continue
        if task.func is run_chunk:
            need += launch.device_bytes(_place_shape(task, lookup))
            most += launch.device_bytes()
        else:  # a Launch, submitted with its arguments
            sizes = [_nbytes(a, tasks) for a in task.args]
            known = known and None not in sizes
            asked = launch.device_bytes(argument_bytes=sum(n or 0 for n in sizes))
            need, most = need + asked, most + asked
    return MemoryAsks(need, most, known)


def _place_shape(task, lookup) -> tuple | None:
    """The block shape of a map task's :class:`~.task.ChunkPlace` (its last argument),
    else None."""
    place = resolved(task.args[-1], lookup) if task.args else None
    return place.shape if isinstance(place, ChunkPlace) else None


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
