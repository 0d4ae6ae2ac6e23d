"""The task a map's launch runs in: :func:`run_chunk` on the launch, the chunk's place last.

A ``map_kernel`` task is ``run_chunk(launch, *values, place)``. The scheduler's
placement and the worker's launch watch know such a task by its function
(:mod:`.walk`) and read its place by its type, :class:`ChunkPlace`, as
distributed reads its shuffle's barrier task by its type; neither needs the
feature that builds the task.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ChunkPlace", "run_chunk"]


class ChunkPlace(NamedTuple):
    """Where a task's block lies: its block id, its shape and its global start, per axis,
    and for a launch over a group of the user's chunks, which ones (``members``: per
    axis, the first one's index and global start, and each one's size).

    The last argument of a map's task, built by the map's layout; a task
    carries its own place, never the chunking of the whole array.

    Examples
    --------
    >>> place = ChunkPlace((1, 0), (2, 3), (2, 0))
    >>> place.shape, tuple(place) == ((1, 0), (2, 3), (2, 0), None)
    ((2, 3), True)
    """

    block_id: tuple
    shape: tuple
    start: tuple
    members: tuple | None = None


def run_chunk(launch, *values):
    """What a ``map_kernel`` task runs: ``launch`` (a
    :class:`~daskgpu._runtime.launch_task.LaunchTask`, inline or a key of the graph) on
    the task's values, the chunk's :class:`ChunkPlace` last.

    Examples
    --------
    >>> run_chunk(lambda *values: values, 2.0, ChunkPlace((0,), (4,), (0,)))
    (2.0, ChunkPlace(block_id=(0,), shape=(4,), start=(0,), members=None))
    """
    return launch(*values)
