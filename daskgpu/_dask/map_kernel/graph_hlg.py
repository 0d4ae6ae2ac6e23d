"""``map_kernel``'s tasks on Dask's HighLevelGraph layer (``array.query-planning`` off).

:class:`HLGLayer` is what :mod:`.api` asks of a graph layer: unify chunks,
halos and their trimming, the launch layer itself (``da.blockwise`` of
:func:`~.chunk_task.run_chunk` over the blocks and their places), and the
per-chunk outputs' combine. :mod:`.graph_expr` answers the same questions on
array expressions.
"""

from __future__ import annotations

import math
import pickle

import numpy as np

from daskgpu._dask.map_kernel import reduction
from daskgpu._dask.map_kernel.arguments import Out
from daskgpu._dask.map_kernel.chunk_task import run_chunk
from daskgpu._dask.map_kernel.hlg_sources import read_in_groups

__all__ = ["EMBED_BYTES", "HLGLayer", "LAUNCH_KEY_ANNOTATION", "embeds", "launch_key", "unified"]


#: The most bytes of a pickled launch that a graph's tasks carry together, one copy
#: each, rather than read it from a key of its own.
EMBED_BYTES = 256 << 10

#: The annotation of a launch key's layer: marks it as the launch the tasks read.
LAUNCH_KEY_ANNOTATION = {"daskgpu": "launch"}


def embeds(fn, tasks: int) -> bool:
    """Whether ``tasks`` tasks carry ``fn`` themselves: together at most :data:`EMBED_BYTES`.

    A launch key costs a round trip through the scheduler before any chunk
    starts (7 ms on an H200, against 16 chunks of 64 MiB taking 0.12 s), so a
    small graph carries the launch in each task instead.
    """
    if tasks > EMBED_BYTES >> 10:  # a launch pickles to more than 1 KiB: not worth pickling
        return False
    return tasks * len(pickle.dumps(fn)) <= EMBED_BYTES


class HLGLayer:
    """Building blocks of a map on the HighLevelGraph layer."""

    name = "hlg"

    @staticmethod
    def align(arrays, ndim):
        """Unify chunks as ``da.blockwise`` does (right-aligned broadcasting)."""
        from dask.array.core import unify_chunks

        return unified(unify_chunks, [placeholder(a) if isinstance(a, Out) else a
                                       for a in arrays], arrays, ndim)

    @staticmethod
    def regroup(array, chunks):
        """``array`` with larger chunks, neighbours merged. An array read by
        ``da.from_array`` (or ``da.from_zarr``) with nothing between is built again to
        read the larger pieces itself (:func:`.hlg_sources.read_in_groups`); any other
        gets a rechunk, whose tasks each concatenate the chunks of a group."""
        if array.name == PLACEHOLDER:
            return _placeholder(chunks, array.ndim)
        grouped = read_in_groups(array, chunks)
        return grouped if grouped is not None else array.rechunk(chunks)

    @staticmethod
    def overlap(arrays, depth, boundary):
        from dask.array.overlap import overlap

        return [overlap(a, depth=depth, boundary=boundary, allow_rechunk=False)
                for a in arrays]

    @staticmethod
    def trim(result, depth, boundary):
        from dask.array.overlap import trim_internal

        return trim_internal(result, depth, boundary)

    @staticmethod
    def coerce_halo(ndim, depth, boundary):
        from dask.array.overlap import coerce_boundary, coerce_depth

        return coerce_depth(ndim, depth), coerce_boundary(ndim, boundary)

    @staticmethod
    def launches(fn, task_args, places, name, meta, per_chunk=None, token=None):
        """The launch layer: ``fn`` per block on its arguments' blocks and its place.

        ``fn`` (the kernel's PTX and the parameters) is a key of the graph of
        its own, ``<name>-launch``, which every task reads: it travels once to
        each worker (and once to the scheduler), so a task is about as small
        as a ``map_blocks`` task, whatever the PTX and the number of chunks. A
        graph whose tasks would together carry at most :data:`EMBED_BYTES` of
        it carries ``fn`` in each task instead. Arrays broadcast
        right-aligned, as in ``da.map_blocks``; a per-chunk output adds its
        axes after the mapped ones, one block of ``per_chunk`` per launch.
        ``token`` is for the expression layer; here the name is ``name``.
        """
        import dask.array as da

        ndim = len(places.chunks)
        mapped = tuple(range(ndim))[::-1]
        pairs = [fn if embeds(fn, math.prod(len(c) for c in places.chunks))
                 else launch_key(fn, f"{name}-launch"), None]
        for a in task_args:
            pairs += [a, tuple(range(a.ndim))[::-1] if isinstance(a, da.Array) else None]
        new = tuple(range(ndim, ndim + len(per_chunk or ())))
        return da.blockwise(
            run_chunk, mapped + new, *pairs, places, mapped, name=name, meta=meta,
            new_axes=dict(zip(new, per_chunk or ())),
            adjust_chunks=None if per_chunk is None else dict.fromkeys(mapped, 1),
            align_arrays=False, concatenate=True)

    @staticmethod
    def select(launched, i, name, meta, per_chunk=None):
        """Result ``i`` of each launch of a map that returns several, named ``name``:
        aligned with the blocks, or one block of ``per_chunk`` per launch. ``da.blockwise``
        is the layer's own, so the expression layer uses this too."""
        import operator

        from dask.array import blockwise

        ndim = launched.ndim
        mapped = tuple(range(ndim))[::-1]
        new = tuple(range(ndim, ndim + len(per_chunk or ())))
        return blockwise(
            operator.getitem, mapped + new, launched, mapped, i, None, name=name, meta=meta,
            new_axes=dict(zip(new, per_chunk or ())),
            adjust_chunks=None if per_chunk is None else dict.fromkeys(mapped, 1),
            align_arrays=False, concatenate=True)

    @staticmethod
    def combine(partials, ndim, fold, split_every, name, axis):
        return reduction.combine_partials(partials, ndim, fold, split_every, name=name,
                                          axis=axis)


def unified(unify_chunks, dask_arrays, arrays, ndim):
    """``unify_chunks`` of the arrays, their chunks per mapped axis; a clear error."""
    pairs = []
    for a in dask_arrays:
        pairs += [a, tuple(reversed(range(a.ndim)))]
    try:
        chunkss, aligned = unify_chunks(*pairs, warn=False)
    except ValueError as exc:
        shapes = ", ".join(
            f"{'Out' if isinstance(a, Out) else 'array'} {tuple(a.shape)}" for a in arrays
        )
        raise ValueError(
            f"map_kernel cannot align the chunks of its arrays ({shapes}): {exc}. "
            "Give arrays and outputs shapes that broadcast together."
        ) from None
    out_chunks = tuple(chunkss[ndim - 1 - ax] for ax in range(ndim))
    return list(aligned), out_chunks


#: The name of the :func:`placeholder` arrays.
PLACEHOLDER = "daskgpu-out-placeholder"


def placeholder(out: Out):
    """A dask array of ``out``'s shape and chunks that costs no memory per chunk."""
    return _placeholder(out.chunks, len(out.shape))


def _placeholder(chunks, ndim):
    import dask.array as da

    # Only its chunks are read (to align them): a graph without tasks
    # costs a fraction of da.broadcast_to's (0.16 against 0.03 ms here).
    return da.Array({}, PLACEHOLDER, chunks, meta=np.empty((0,) * ndim, np.bool_))


def launch_key(fn, key: str):
    """``fn`` as the key ``key`` of a graph, its layer marked :data:`LAUNCH_KEY_ANNOTATION`.

    Marked, Dask's ``fuse_roots`` does not take it for a root input to fuse
    into the tasks (it fuses the roots of a layer whose annotations all
    match): every task reads it, so that step fuses no more than low-level
    fusion does anyway, and gives the same graph, but it first turns the
    layers into dicts of tasks and culls them key by key: a tenth to a
    sixth of a 20,000-chunk graph's build time. On a cluster that offers
    GPUs, the resources annotation of the tasks' layer keeps it out already.

    Examples
    --------
    >>> launch = launch_key("the launch", "saxpy-launch")
    >>> launch.key, launch.__dask_graph__().layers["saxpy-launch"].annotations
    ('saxpy-launch', {'daskgpu': 'launch'})
    """
    import dask
    from dask._task_spec import DataNode
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    annotations = {**(dask.get_annotations() or {}), **LAUNCH_KEY_ANNOTATION}
    # As dask.delayed(fn, name=key, traverse=False) holds it, but for the mark.
    layer = MaterializedLayer({key: DataNode(key, fn)}, annotations=annotations)
    return Delayed(key, HighLevelGraph({key: layer}, {key: set()}))
