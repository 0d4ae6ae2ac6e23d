"""A ``map_kernel`` over another's result: both launches in one task per chunk.

Each ``map_kernel`` whose one result is an aligned output without halos
records how it was made in :data:`chains`, a bounded registry keyed by the
result's name (nothing is stored on the dask array); :func:`fuse` then runs
those launches first, in the same tasks, when a later map reads that result.
"""

from __future__ import annotations

import weakref

from daskgpu._bounded import BoundedCache
from daskgpu._dask.map_kernel.chunk_params import ChunkParam, FlatChunkParam
from daskgpu._dask.map_kernel.chunk_task import Fused

__all__ = ["ChainLink", "chains", "fuse"]


class ChainLink:
    """How a ``map_kernel`` result was made, so that a later ``map_kernel`` can fuse with it.

    It holds its result weakly: it applies to that very array only (not to a
    persisted or otherwise rebuilt array of the same name), and lets go of the
    launch and its arguments once the array is gone.

    Parameters
    ----------
    result : dask.array.Array
        The one aligned output of a ``map_kernel`` without halos.
    launch : ChunkLaunch or Fused
        What each of its tasks runs.
    args : tuple
        The tasks' arguments, before the chunk's place.
    layout : str
        The output's layout, ``"C"`` or ``"F"``.
    """

    __slots__ = ("_result", "launch", "args", "layout", "__weakref__")

    def __init__(self, result, launch, args, layout):
        self.launch, self.args, self.layout = launch, tuple(args), layout
        # The callback holds the link weakly too: an evicted link goes at once.
        link = weakref.ref(self)

        def release(_dead):
            alive = link()
            if alive is not None:
                alive.launch = alive.args = None

        self._result = weakref.ref(result, release)

    def of(self, array) -> bool:
        """Whether this link describes ``array`` itself (and not another of its name)."""
        return self._result() is array


#: ``map_kernel`` results a later ``map_kernel`` may fuse with, by key name
#: (client side); see :class:`ChainLink`.
chains = BoundedCache(256, "map_kernel results to fuse with")


def fuse(fn, task_args, plan, blocks, block_chunks):
    """Fuse the launches of earlier map_kernels whose outputs this one reads.

    An input qualifies when it is the very array an earlier ``map_kernel``
    returned, as its one aligned output without halos (its :class:`ChainLink`
    in :data:`chains`), read here unchanged (same chunks, no halo, not
    written, a compatible layout) and only once. Its task then runs that
    ``map_kernel``'s launch first, in the same task, on that one's own
    inputs: the intermediate chunk exists only there (on the GPU for host
    chunks), and the earlier array's tasks are not in this graph. If it is
    also computed on its own, its launches run twice, with equal results; set
    ``daskgpu.fuse-chains`` to false to keep them apart.
    """
    found, pos = [], 0
    arrays = plan.arrays
    names = [arrays[source].name for param, source in plan.params
             if isinstance(param, ChunkParam)]
    for param, source in plan.params:
        if isinstance(param, ChunkParam):
            a = arrays[source]
            link = chains.lookup(a.name)
            if (link is not None and link.of(a) and not param.written
                    and names.count(a.name) == 1 and blocks[source].name == a.name
                    and a.ndim == len(block_chunks) and a.chunks == block_chunks
                    and (param.layout == "A" or (param.layout == "F") == (link.layout == "F"))
                    # a flat view of an F-ordered intermediate would reorder it
                    and not (isinstance(param, FlatChunkParam) and link.layout == "F")):
                found.append((pos, link))
        if param.takes_value:
            pos += 1
    for pos, link in reversed(found):  # later slots first: earlier ones stay put
        fn = Fused(link.launch, fn, pos, len(link.args))
        task_args = task_args[:pos] + list(link.args) + task_args[pos + 1:]
    return fn, task_args
