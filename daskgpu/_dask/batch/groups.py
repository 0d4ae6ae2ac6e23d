"""Launches sized for the GPU in a batch: neighbouring stored chunks in one task.

A store's chunks are sized for its disk (zarr chunks of 64 KiB to a few MiB),
and Dask runs a few thousand tasks a second at best: one task per stored chunk
leaves the GPU idle. A batch therefore gathers neighbouring chunks into groups
by ``map_kernel``'s own rule (:mod:`daskgpu._dask.launch_layout`: groups sized by the
``daskgpu.launch-bytes`` setting, at most a quarter of a worker's GPU memory, and only
for a kernel whose results cannot depend on where a launch begins or ends), and, at
the default size, into at least :data:`PROGRESS_STEPS` tasks where the job has that
many chunks, so that its progress moves and an interrupted job keeps what it finished.
A group's task reads its region of each input in one piece, launches the
kernel once over it, and stores every chunk of it in every output, recording
each chunk in the ledger on its own, so that a resumed job still goes chunk by
chunk, with the region of its launch (:meth:`Layout.launch_of`): a kernel sees
the group as one chunk, so a resumed job computes again each chunk it would
launch over another region. A :class:`Layout` says how many stored chunks a
task holds along each axis; with grouping off, one.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from daskgpu._errors import BatchError

__all__ = ["PROGRESS_STEPS", "Layout", "check_group", "plan_layout"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the stored chunks of a job are gathered into tasks.

    Attributes
    ----------
    shape : tuple of int
        The arrays' shape.
    chunksize : tuple of int
        The stored chunks' shape.
    per_task : tuple of int
        Stored chunks a task holds along each axis (fewer at the far edges):
        all ones without grouping.

    Examples
    --------
    >>> layout = Layout(shape=(10, 1000), chunksize=(5, 100), per_task=(1, 4))
    >>> layout.numblocks, layout.tasks, layout.chunks_per_task
    ((2, 10), 6, 4)
    >>> layout.element_chunks()
    ((5, 5), (400, 400, 200))
    >>> layout.block_chunks()
    ((1, 1), (4, 4, 2))
    >>> layout.members([(0, 3), (0, 4), (1, 9)])
    {(0, 0): [(0, 3)], (0, 1): [(0, 4)], (1, 2): [(1, 9)]}
    >>> layout.within((1, 9)), layout.size_of((1, 2)), layout.alone().tasks
    ((0, 1), 2, 20)
    >>> layout.launch_of((1, 9)), layout.alone().launch_of((1, 9))
    (((5, 800), (5, 200)), ((5, 900), (5, 100)))
    """

    shape: tuple
    chunksize: tuple
    per_task: tuple

    @property
    def numblocks(self) -> tuple:
        """Stored chunks along each axis."""
        return tuple(-(-s // c) if c else 0 for s, c in zip(self.shape, self.chunksize))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def grouped(self) -> bool:
        """Whether a task holds more than one stored chunk."""
        return math.prod(self.per_task) > 1

    @property
    def chunks_per_task(self) -> int:
        """The most stored chunks one task holds."""
        return math.prod(self.per_task)

    @property
    def tasks(self) -> int:
        """Tasks over the whole grid."""
        return math.prod(len(c) for c in self.block_chunks())

    def block_chunks(self) -> tuple:
        """The tasks' extents in stored chunks, as dask chunks of the grid of chunks."""
        return tuple(_runs(n, k) for n, k in zip(self.numblocks, self.per_task))

    def element_chunks(self) -> tuple:
        """The tasks' extents in elements: the chunks the inputs are read in."""
        return tuple(_runs(s, k * c) for s, c, k in zip(self.shape, self.chunksize,
                                                         self.per_task))

    def task_of(self, chunk) -> tuple:
        """The index of the task that holds stored chunk ``chunk``."""
        return tuple(c // k for c, k in zip(chunk, self.per_task))

    def within(self, chunk) -> tuple:
        """Stored chunk ``chunk``'s index within its task's block of chunks."""
        return tuple(c % k for c, k in zip(chunk, self.per_task))

    def size_of(self, task) -> int:
        """Stored chunks that task ``task`` holds."""
        return math.prod(min(k, n - t * k) for t, k, n in zip(task, self.per_task,
                                                              self.numblocks))

    def launch_of(self, chunk) -> tuple:
        """``(start, shape)`` in elements of the launch that computes stored chunk
        ``chunk``: its task's whole block, which the kernel sees as one chunk."""
        start = tuple(t * k * c for t, k, c in zip(self.task_of(chunk), self.per_task,
                                                   self.chunksize))
        shape = tuple(min(k * c, s - b) for k, c, s, b in zip(self.per_task, self.chunksize,
                                                              self.shape, start))
        return start, shape

    def alone(self) -> Layout:
        """The same job one chunk a task."""
        return dataclasses.replace(self, per_task=(1,) * self.ndim)

    def members(self, chunks) -> dict:
        """``{task index: [its chunks among chunks]}``, in the order ``chunks`` come."""
        tasks: dict = {}
        for chunk in chunks:
            tasks.setdefault(self.task_of(chunk), []).append(tuple(chunk))
        return tasks


def _runs(total, size) -> tuple:
    """``total`` in pieces of ``size``, the last one shorter."""
    if not total:
        return ()
    full, rest = divmod(total, size)
    return (size,) * full + ((rest,) if rest else ())


#: The fewest tasks a grouped job is cut into, where it has that many chunks: the steps
#: its progress moves by and an interrupt keeps.
PROGRESS_STEPS = 20


def check_group(group):
    """``group`` as ``run_batch`` takes it (see
    :func:`~daskgpu._dask.launch_layout.check_group`), or a :class:`BatchError`.

    Examples
    --------
    >>> check_group("64 MiB"), check_group(False)
    ('64 MiB', False)
    >>> check_group("lots")
    Traceback (most recent call last):
    ...
    daskgpu._errors.BatchError: group='lots': it must be a size from 0 to 1125899906842624 \
bytes (1 PiB), such as "8GiB" or "512 MB"; give True or None (the daskgpu.launch-bytes \
setting), False (no grouping) or a size, e.g. "64 MiB"
    """
    from daskgpu._dask.launch_layout import check_group as check

    try:
        return check(group)
    except ValueError as exc:
        raise BatchError(str(exc)) from None


def plan_layout(shape, chunksize, dtypes, group, cluster) -> Layout:
    """The tasks of a job over ``shape`` stored in ``chunksize``: groups of neighbouring
    chunks that need about :func:`~daskgpu._dask.launch_layout.launch_bytes` of device
    memory each, as ``map_kernel`` groups them, or one chunk a task where the chunks are
    not far smaller than that or ``group`` is False. The default size leaves at least
    :data:`PROGRESS_STEPS` tasks (and one per GPU thread) where the chunks allow; a size
    given is taken as asked.

    ``dtypes`` are those of every input and output: what a launch holds per element.
    ``cluster`` is what the workers offer
    (:class:`~daskgpu._dask.cluster_facts.ClusterFacts`).

    Examples
    --------
    >>> from daskgpu._dask.cluster_facts import ClusterFacts
    >>> f4 = np.dtype("float32")
    >>> plan_layout((1 << 24,), (1024,), [f4, f4], "1 MiB", ClusterFacts()).per_task
    (128,)
    >>> plan_layout((40 * 1024,), (1024,), [f4, f4], None, ClusterFacts()).per_task
    (2,)
    >>> plan_layout((40 * 1024,), (1024,), [f4, f4], "1 MiB", ClusterFacts()).per_task
    (40,)
    >>> plan_layout((1 << 20,), (1024,), [f4, f4], False, ClusterFacts()).per_task
    (1,)
    """
    from daskgpu._dask.launch_layout import group_chunks, launch_bytes, least_groups

    ones = (1,) * len(shape)
    per_element = sum(np.dtype(d).itemsize for d in dtypes)
    stored = tuple(_runs(s, c) for s, c in zip(shape, chunksize))
    grouped = group_chunks(stored, per_element, launch_bytes(group, cluster),
                           min_groups=least_groups(group, max(PROGRESS_STEPS, cluster.threads)))
    if grouped is None:
        return Layout(tuple(shape), tuple(chunksize), ones)
    # Regular chunks make regular groups: the first of each axis gives the count.
    per_task = tuple(-(-g[0] // c) for g, c in zip(grouped, chunksize))
    return Layout(tuple(shape), tuple(chunksize), per_task)
