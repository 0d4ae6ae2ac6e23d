"""``map_kernel``'s tasks on Dask's array expressions (``array.query-planning`` on).

Written the way Dask's own array functions are there: a map is a
:class:`MapKernel` expression, a ``Blockwise`` whose operands are its input
arrays' expressions, so Dask's optimizer sees through it (slicing and
rechunking before a map stay lazy expressions; nothing is turned back into a
HighLevelGraph) and lowers it to one task per block. The launch the tasks
read is a :class:`LaunchKey` expression, one key of the graph, so a large
map's PTX travels once to each worker as on the HighLevelGraph layer.

Dask's expressions carry no annotations to the scheduler, so placement on
GPU workers rests on the scheduler plugin
(:class:`~daskgpu._dask.placement.GPUPlacement`), which reads each task as it
arrives, as it does on the other layer.

Imported only where query planning is on (:func:`~daskgpu._dask.map_kernel.api.graph_layer`): it
imports Dask's expression modules.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dask._expr import Expr
from dask._task_spec import DataNode
from dask.array._array_expr._blockwise import Blockwise
from dask.array._array_expr._expr import ArrayExpr
from dask.tokenize import _tokenize_deterministic

from daskgpu._dask.launch_core.task import run_chunk
from daskgpu._dask.map_kernel.arguments import Out
from daskgpu._dask.map_kernel.graphs.hlg import embeds, runs_per_axis, unified
from daskgpu._dask.map_kernel.graphs.layer import GraphLayer

__all__ = ["ExprLayer", "LaunchKey", "MapKernel", "Placeholder"]


class LaunchKey(Expr):
    """The launch a map's tasks read, as one key of the graph, ``<name>-launch``."""

    _parameters = ["launch", "key"]

    @functools.cached_property
    def _name(self):
        return self.operand("key")

    def _layer(self) -> dict:
        key = self.operand("key")
        return {key: DataNode(key, self.operand("launch"))}

    def __dask_tokenize__(self):
        return "daskgpu-launch-key", self.operand("key")


class MapKernel(Blockwise):
    """One ``map_kernel`` launch per block: :func:`run_chunk` on the launch (inline, or a
    reference to its :class:`LaunchKey` operand), the blocks and their places."""

    _parameters = ["launch_key", "out_ind", "name", "token", "map_id", "_meta_provided",
                   "new_axes", "adjust_chunks"]
    _defaults = {"launch_key": None, "name": None, "new_axes": None, "adjust_chunks": None}
    func = staticmethod(run_chunk)
    align_arrays = False
    concatenate = True
    kwargs: dict = {}

    @functools.cached_property
    def dtype(self):
        return self._meta.dtype

    @functools.cached_property
    def new_axes(self):
        return self.operand("new_axes") or {}

    def __dask_tokenize__(self):
        # The map (its plan's name: image, arguments, keywords) on its inputs as they
        # are now, so the name changes as the optimizer rewrites the inputs: Dask's
        # passes stop when the root's name stays the same.
        return _tokenize_deterministic(
            self.operand("map_id"), [op._name for op in self.operands if isinstance(op, Expr)])


class Placeholder(ArrayExpr):
    """An array of a :class:`Out`'s shape and chunks that is only aligned, never run."""

    _parameters = ["chunks", "_meta_provided"]

    @functools.cached_property
    def _meta(self):
        return self.operand("_meta_provided")

    def _layer(self) -> dict:
        return {}


class Joined(ArrayExpr):
    """An array's neighbouring chunks joined into larger ones (``chunks``, each a run of
    whole chunks of ``array``): a task per new chunk that concatenates its blocks.

    What a grouped map gives an input that does not read its groups itself. Unlike
    ``array.rechunk(chunks)``, it needs no lowering, so a map's expression lowers fully
    under ``dask.optimize`` and graph inspection (Dask's ``Rechunk`` expression has no
    ``npartitions`` there: ``dask.optimize(da.arange(8, chunks=2).rechunk(4))`` fails).
    """

    _parameters = ["array", "chunks"]

    @functools.cached_property
    def _meta(self):
        return self.array._meta

    def _layer(self) -> dict:
        import itertools

        from dask._task_spec import Alias, List, Task, TaskRef
        from dask.array.core import concatenate3

        source = self.array
        runs = runs_per_axis(source, self.operand("chunks"))

        def nested(group, axis=0, index=()):
            if axis == len(runs):
                return TaskRef((source._name, *index))
            return List(*(nested(group, axis + 1, index + (b,))
                          for b in runs[axis][group[axis]]))

        graph = {}
        for group in itertools.product(*(range(len(r)) for r in runs)):
            key = (self._name, *group)
            members = [runs[ax][g] for ax, g in enumerate(group)]
            if all(len(m) == 1 for m in members):  # one chunk: the same block, no copy
                graph[key] = Alias(key, (source._name, *(m[0] for m in members)))
            else:
                graph[key] = Task(key, concatenate3, nested(group))
        return graph


class ExprLayer(GraphLayer):
    """A map's tasks on array expressions: a :class:`~.layer.GraphLayer`; it shares with
    :class:`~.hlg.HLGLayer` what the interface writes once (``select``, ``combine``)."""

    name = "expr"

    def align(self, arrays, ndim):
        from dask.array._array_expr._collection import new_collection
        from dask.array._array_expr._expr import unify_chunks_expr

        def unify(*pairs, warn=False):
            exprs = [p.expr if i is not None else p for p, i in zip(pairs[::2], pairs[1::2])]
            chunkss, arrays, _ = unify_chunks_expr(
                *(x for e, i in zip(exprs, pairs[1::2]) for x in (e, i)))
            return chunkss, [new_collection(a) for a in arrays]

        dask_arrays = [
            new_collection(Placeholder(a.chunks, np.empty((0,) * len(a.shape), np.bool_)))
            if isinstance(a, Out) else a for a in arrays]
        return unified(unify, dask_arrays, arrays, ndim)

    def regroup(self, array, chunks):
        """``array`` with larger chunks, neighbours merged. An array read by
        ``da.from_array`` (or a batch's zarr input) reads the larger pieces itself, so
        the grouping adds no task; any other is joined by a task per group
        (:class:`Joined`)."""
        from dask.array._array_expr._collection import new_collection
        from dask.array._array_expr._io import FromArray

        expr = array.expr
        if isinstance(expr, Placeholder):
            return new_collection(Placeholder(chunks, expr._meta))
        if isinstance(expr, FromArray):
            return new_collection(expr.substitute_parameters({"chunks": chunks}))
        if runs_per_axis(array, chunks) is not None:
            return new_collection(Joined(expr, tuple(map(tuple, chunks))))
        return array.rechunk(chunks)

    def overlap(self, arrays, depth, boundary):
        from dask.array._array_expr._overlap import overlap

        return [overlap(a, depth=depth, boundary=boundary, allow_rechunk=False)
                for a in arrays]

    def trim(self, result, depth, boundary):
        from dask.array._array_expr._overlap import trim_internal

        return trim_internal(result, depth, boundary)

    def coerce_halo(self, ndim, depth, boundary):
        from dask.array._array_expr._overlap import coerce_boundary, coerce_depth

        return coerce_depth(ndim, depth), coerce_boundary(ndim, boundary)

    def launches(self, fn, task_args, places, name, meta, per_chunk=None, token=None):
        """The :class:`MapKernel` expression of the launches (see ``HLGLayer.launches``).

        With ``token`` (no ``name=`` given), the map's name is ``token`` and a
        hash of the map on its inputs, which changes as Dask's optimizer
        rewrites them. A ``name=`` is the output's key name whatever the
        inputs become; Dask's passes stop when the root's name stays the same,
        so the inputs of a named map are optimized here, once.
        """
        import dask.array as da
        from dask._task_spec import TaskRef
        from dask.array._array_expr._collection import new_collection

        ndim = len(places.chunks)
        mapped = tuple(range(ndim))[::-1]
        if embeds(fn, math.prod(len(c) for c in places.chunks)):
            key, pairs = None, [fn, None]
        else:
            key = LaunchKey(fn, f"{name}-launch")
            pairs = [TaskRef(f"{name}-launch"), None]
        for a in task_args:
            if isinstance(a, da.Array):
                expr = a.expr if token else a.expr.simplify().lower_completely()
                pairs += [expr, tuple(range(a.ndim))[::-1]]
            else:
                pairs += [a, None]
        new = tuple(range(ndim, ndim + len(per_chunk or ())))
        expr = MapKernel(key, mapped + new, None if token else name, token, name, meta,
                         dict(zip(new, per_chunk or ())),
                         None if per_chunk is None else dict.fromkeys(mapped, 1),
                         *pairs, places, mapped)
        return new_collection(expr)

