"""Grouped launches that read their source in larger pieces, on the HighLevelGraph layer.

An array made by ``da.from_array`` (and ``da.from_zarr``, built on it) holds
its source in its own graph: a NumPy array is sliced on the client, one
constant per chunk; any other array-like is read by a task per chunk (Dask's
``graph_from_arraylike``: a ``Blockwise`` layer of ``getter`` calls on the
source, held inline or in a layer ``original-<name>`` of its own). Where a
map's input is such an array, with nothing between, :func:`read_in_groups`
builds it again over the grouped chunks: one constant, or one read, per group,
rather than one per chunk and a task that concatenates them. Any other array
gets None (and a rechunk, whose tasks concatenate).

On array expressions Dask's ``FromArray`` takes new chunks itself
(:mod:`.graph_expr`).
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

__all__ = ["read_in_groups"]


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


# -- NumPy arrays, sliced on the client -------------------------------------------

def _constants_in_groups(array, layer, chunks):
    """``array``'s chunks, constants of its graph (``da.from_array`` of a NumPy array),
    joined into one constant per group on the client."""
    from dask._task_spec import DataNode
    from dask.array.core import Array

    runs = [_runs(tuple(old), tuple(new)) for old, new in zip(array.chunks, chunks)]
    mapping = layer.mapping
    if any(r is None for r in runs) or len(mapping) != math.prod(array.numblocks):
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
    if any(r is None for r in (_runs(tuple(o), tuple(n)) for o, n in zip(array.chunks, chunks))):
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
