"""``map_kernel``'s tasks on Dask's HighLevelGraph layer (``array.query-planning`` off).

:class:`HLGLayer` answers what :class:`~.layer.GraphLayer` asks: unify chunks,
halos and their trimming, the launch layer itself (``da.blockwise`` of
:func:`~daskgpu._dask.launch_core.task.run_chunk` over the blocks and their
places), and larger chunks for grouped launches: a ``da.from_array`` input read
in the groups' pieces (:func:`read_in_groups`), any other rechunked. :mod:`.expr`
answers the same questions on array expressions.
"""

from __future__ import annotations

import math
import pickle
from itertools import product

import numpy as np

from daskgpu._dask.launch_core.task import run_chunk
from daskgpu._dask.map_kernel.arguments import Out
from daskgpu._dask.map_kernel.graphs.layer import GraphLayer

__all__ = ["EMBED_BYTES", "HLGLayer", "LAUNCH_KEY_ANNOTATION", "embeds", "launch_key",
           "read_in_groups", "unified"]


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


class HLGLayer(GraphLayer):
    """A map's tasks on the HighLevelGraph layer: a :class:`~.layer.GraphLayer`."""

    name = "hlg"

    def align(self, arrays, ndim):
        """Unify chunks as ``da.blockwise`` does (right-aligned broadcasting)."""
        from dask.array.core import unify_chunks

        return unified(unify_chunks, [placeholder(a) if isinstance(a, Out) else a
                                       for a in arrays], arrays, ndim)

    def regroup(self, array, chunks):
        """``array`` with larger chunks, neighbours merged. An array read by
        ``da.from_array`` (or ``da.from_zarr``) with nothing between is built again to
        read the larger pieces itself (:func:`read_in_groups`); any other
        gets a rechunk, whose tasks each concatenate the chunks of a group."""
        if array.name == PLACEHOLDER:
            return _placeholder(chunks, array.ndim)
        grouped = read_in_groups(array, chunks)
        return grouped if grouped is not None else array.rechunk(chunks)

    def overlap(self, arrays, depth, boundary):
        from dask.array.overlap import overlap

        return [overlap(a, depth=depth, boundary=boundary, allow_rechunk=False)
                for a in arrays]

    def trim(self, result, depth, boundary):
        from dask.array.overlap import trim_internal

        return trim_internal(result, depth, boundary)

    def coerce_halo(self, ndim, depth, boundary):
        from dask.array.overlap import coerce_boundary, coerce_depth

        return coerce_depth(ndim, depth), coerce_boundary(ndim, boundary)

    def launches(self, fn, task_args, places, name, meta, per_chunk=None, token=None):
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


# -- a from_array input read in the groups' pieces -----------------------------------
#
# An array made by ``da.from_array`` (and ``da.from_zarr``, built on it) holds its
# source in its own graph: a NumPy array is sliced on the client, one constant per
# chunk; any other array-like is read by a task per chunk (Dask's
# ``graph_from_arraylike``: a Blockwise layer of ``getter`` calls on the source, held
# inline or in a layer ``original-<name>`` of its own). Where a map's input is such an
# array, with nothing between, it is built again over the grouped chunks: one constant,
# or one read, per group, rather than one per chunk and a task that joins them. On
# array expressions Dask's ``FromArray`` takes new chunks itself (:mod:`.expr`).

def read_in_groups(array, chunks):
    """``array``, a ``da.from_array`` of a source, built again over ``chunks`` (each a
    run of whole chunks of ``array``), or None where ``array``'s graph is anything else.

    The new array reads the source as the old one did (the same getter, lock and
    ``asarray``; the source inline or a key of its own), its layers annotated as
    the old ones; only the pieces are larger. Called on the HighLevelGraph layer only.
    """
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    graph = array.__dask_graph__()
    if not isinstance(graph, HighLevelGraph) or array.name not in graph.layers:
        return None
    layer = graph.layers[array.name]
    if isinstance(layer, MaterializedLayer):
        if graph.dependencies.get(array.name):
            return None
        return _constants_in_groups(array, layer, chunks)
    read = _arraylike_read(array, graph)
    return None if read is None else _read_in_groups(array, read, layer, chunks)


def _group_name(array, chunks) -> str:
    """A name for ``array`` over ``chunks``: its prefix (``array``, ``from-zarr``) and a
    hash of the two, so that every map grouping the same array alike shares its keys."""
    from dask.base import tokenize
    from dask.utils import key_split

    return f"{key_split(array.name)}-{tokenize(array.name, chunks)}"


def _runs(old: tuple, new: tuple) -> list:
    """The blocks of ``old`` chunks that each of ``new`` (runs of whole ones) covers, as
    ranges; None where ``new`` is not made of whole ``old`` chunks."""
    runs, start, filled = [], 0, 0
    for size in new:
        stop = start
        while filled < size and stop < len(old):
            filled += old[stop]
            stop += 1
        if filled != size:
            return None
        runs.append(range(start, stop))
        start, filled = stop, 0
    return runs if start == len(old) else None


def runs_per_axis(array, chunks):
    """:func:`_runs` of ``array``'s chunks that each of ``chunks`` covers, per axis; None
    where some axis of ``chunks`` is not made of whole chunks of ``array``."""
    runs = [_runs(tuple(old), tuple(new)) for old, new in zip(array.chunks, chunks)]
    return None if any(r is None for r in runs) else runs


# -- NumPy arrays, sliced on the client -------------------------------------------

def _constants_in_groups(array, layer, chunks):
    """``array``'s chunks, constants of its graph (``da.from_array`` of a NumPy array),
    joined into one constant per group on the client."""
    from dask._task_spec import DataNode
    from dask.array.core import Array

    runs = runs_per_axis(array, chunks)
    mapping = layer.mapping
    if runs is None or len(mapping) != math.prod(array.numblocks):
        return None
    # Exactly NumPy's own arrays (a subclass may not join to the same thing), checked
    # in one pass: this runs over every chunk of the array.
    if not all(type(v) is np.ndarray for v in mapping.values()):
        if not all(isinstance(v, DataNode) and type(v.value) is np.ndarray
                   for v in mapping.values()):
            return None
        mapping = {k: v.value for k, v in mapping.items()}
    ndim, source = array.ndim, array.name

    def joined(group, axis=0, index=()):
        if axis == ndim:
            return mapping[(source, *index)]
        parts = [joined(group, axis + 1, index + (b,)) for b in runs[axis][group[axis]]]
        # One chunk is kept as it is (a view); several are copied into one array.
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)

    name = _group_name(array, chunks)
    grouped = {}
    for group in product(*(range(len(c)) for c in chunks)):
        try:
            piece = joined(group)
        except (KeyError, ValueError):  # not one constant per chunk, or they do not fit
            return None
        # Joining along each axis needs the pieces to agree on the others, so a group of
        # the right shape and dtype was joined from chunks of the right shapes.
        if (piece.shape != tuple(c[g] for c, g in zip(chunks, group))
                or piece.dtype != array.dtype):
            return None
        grouped[(name, *group)] = piece
    out = Array(grouped, name, chunks, meta=array._meta)
    _annotate_like(out, layer)
    return out


# -- other array-likes, read by a task per chunk ---------------------------------------

def _arraylike_read(array, graph):
    """How ``array``'s Blockwise layer reads its source, as
    ``(source, getter, keywords, inline)``; None where it is not Dask's
    ``graph_from_arraylike`` (one of Dask's getters on the source and each chunk's
    slices, nothing else)."""
    from dask._task_spec import DataNode, GraphNode, Task, TaskRef
    from dask.array.core import getter, getter_inline, getter_nofancy
    from dask.blockwise import Blockwise, blockwise_token
    from dask.highlevelgraph import MaterializedLayer
    from dask.layers import ArraySliceDep

    layer = graph.layers[array.name]
    if not isinstance(layer, Blockwise) or layer.output != array.name:
        return None
    task = layer.task
    if (not isinstance(task, Task) or task.func not in (getter, getter_nofancy, getter_inline)
            or layer.new_axes or layer.concatenate or len(layer.indices) != 2):
        return None
    if ([getattr(a, "key", None) for a in task.args]
            != [blockwise_token(0), blockwise_token(1)]
            or not set(task.kwargs) <= {"asarray", "lock"}):
        return None
    (source, source_index), (slices, slices_index) = layer.indices
    dep = layer.io_deps.get(slices)
    if (not isinstance(dep, ArraySliceDep) or source_index is not None
            or tuple(slices_index or ()) != tuple(layer.output_indices)
            or tuple(map(tuple, dep.chunks)) != array.chunks):
        return None
    kwargs = {k: v.value if isinstance(v, DataNode) else v for k, v in task.kwargs.items()}
    if isinstance(kwargs.get("lock"), GraphNode) or isinstance(kwargs.get("asarray"),
                                                                  GraphNode):
        return None
    deps = graph.dependencies.get(array.name, set())
    if isinstance(source, TaskRef):
        original = graph.layers.get(source.key)
        if (deps != {source.key} or not isinstance(original, MaterializedLayer)
                or graph.dependencies.get(source.key) or len(original) != 1
                or source.key not in original):
            return None
        value = original[source.key]
        if isinstance(value, DataNode):
            value = value.value
        elif isinstance(value, GraphNode):
            return None
        return value, task.func, kwargs, False
    if isinstance(source, GraphNode) or deps:
        return None
    return source, task.func, kwargs, True


def _read_in_groups(array, read, layer, chunks):
    """``array`` read as ``read`` says (:func:`_arraylike_read`), over ``chunks``."""
    from dask.array.core import Array, graph_from_arraylike

    source, getitem, kwargs, inline = read
    if runs_per_axis(array, chunks) is None:
        return None
    name = _group_name(array, chunks)
    graph = graph_from_arraylike(source, chunks, array.shape, name, getitem=getitem,
                                 lock=kwargs.get("lock", False),
                                 asarray=kwargs.get("asarray", True), dtype=array.dtype,
                                 inline_array=inline)
    out = Array(graph, name, chunks, meta=array._meta)
    _annotate_like(out, layer)
    return out


def _annotate_like(array, layer) -> None:
    """Give ``array``'s layers ``layer``'s annotations (those of the user's ``from_array``,
    not those current where the map is built)."""
    for new in array.__dask_graph__().layers.values():
        new.annotations = dict(layer.annotations) if layer.annotations else None
        new.collection_annotations = (dict(layer.collection_annotations)
                                      if layer.collection_annotations else None)
