"""An iteration's tasks: one layer of :class:`~.block_task.BlockLaunch` per block of steps.

Built from the graph layer's own pieces (``overlap``, ``launches``, ``select``,
``trim`` of :mod:`daskgpu._dask.map_kernel.graph_hlg` or
:mod:`~daskgpu._dask.map_kernel.graph_expr`), so it runs on the HighLevelGraph
and on array expressions alike. Between blocks only halos move: the next
block's overlap slices each neighbour's edge where that neighbour lies, and
joins the slices to the chunk where it lies. The exchange is Dask's
``overlap`` behind one function (:func:`exchange`), so that halos could later
move device to device without the API changing.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np

from daskgpu._dask.cluster_facts import check_chunk_fits
from daskgpu._dask.iterate.block_task import BlockLaunch
from daskgpu._dask.iterate.plan import IteratePlan
from daskgpu._dask.launch_core.resources import GPU, GPU_MEMORY, LAUNCH_SHARE
from daskgpu._dask.map_kernel.api import chunk_places
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkParam,
    OutParam,
    ValueParam,
    WholeParam,
)
from daskgpu._dask.map_kernel.chunk_task import ChunkLaunch, ChunkMemory

__all__ = ["build", "exchange"]


def exchange(layer, arrays, depth: dict, boundary: dict) -> list:
    """``arrays`` extended by their neighbours' halos (and the boundary at the array's
    edges), as ``da.map_overlap`` extends them."""
    if not any(depth.values()):
        return list(arrays)
    return layer.overlap(list(arrays), depth, boundary)


def build(plan: IteratePlan, layer) -> tuple:
    """The final states as dask arrays: the steps in blocks, on ``layer``."""
    import dask
    from dask.array.core import broadcast_chunks
    from dask.base import tokenize

    mp = plan.map
    ndim = mp.ndim
    targets = plan.targets
    step, slots, initial = _step(plan)
    memory = _memory(plan)
    current = {t: mp.aligned[mp.params[t].source] for t in targets}
    prefix = mp.token or mp.kernel_name
    base = tokenize(mp.name, plan.steps, plan.blocks, plan.feeds)
    chunk_sources = {source for p, source in mp.params if isinstance(p, ChunkParam)}
    target_sources = {mp.params[t].source: t for t in targets}
    left = tuple(plan.boundary[ax] != "none" for ax in range(ndim))  # a halo at 0 too
    for b, steps in enumerate(plan.blocks):
        depth = {ax: steps * d for ax, d in enumerate(plan.depth)}
        sources = [current[target_sources[i]] if i in target_sources else a
                   for i, a in enumerate(mp.aligned)]
        used = sorted(chunk_sources)
        extended = dict(zip(used, exchange(layer, [sources[i] for i in used], depth,
                                           plan.boundary)))
        blocks = [extended.get(i) for i in range(len(mp.aligned))]
        block_chunks = broadcast_chunks(*(extended[i].chunks for i in used))
        # Merged, each block also names the user's chunks it holds: errors speak of those.
        where = chunk_places(block_chunks, mp.out_chunks, tuple(depth[ax] for ax in range(ndim)),
                             left, mp.user_chunks if mp.grouped else None)
        fn = BlockLaunch(step, slots, initial, plan.feeds, plan.outputs, targets, steps,
                         _dtypes(plan), plan.fills, plan.fill_kernels, plan.shape,
                         timeout=mp.timeout,
                         memory=ChunkMemory(memory.fixed, memory.per_element,
                                            math.prod(max(c) for c in block_chunks)))
        check_chunk_fits(fn.device_bytes(), mp.kernel_name, mp.cluster)
        task_args = mp.task_sources(blocks)
        last = b == len(plan.blocks) - 1
        named = last and mp.token is None  # name= is the final states' key name
        name = mp.name if named else f"{prefix}-{tokenize(base, b)}"
        asks = {GPU: LAUNCH_SHARE,
                **({GPU_MEMORY: fn.device_bytes()} if mp.cluster.gpu_memory else {})}
        with dask.annotate(resources=asks) if mp.cluster.offers_gpu else nullcontext():
            if len(targets) == 1:
                dtype = np.dtype(fn.dtypes[targets[0]])
                results = [layer.launches(fn, task_args, where, name, mp.meta(dtype, ndim),
                                          token=None if named else prefix)]
            else:
                launched = layer.launches(fn, task_args, where, name,
                                          np.empty((0,) * ndim, dtype=object))
                results = [layer.select(launched, k, f"{name}-state{k}",
                                        mp.meta(np.dtype(fn.dtypes[t]), ndim))
                           for k, t in enumerate(targets)]
        if any(depth.values()):
            results = [layer.trim(r, depth, plan.boundary) for r in results]
        current = dict(zip(targets, results))
    return tuple(current[t] for t in targets)


def _step(plan: IteratePlan):
    """One step's launch (outputs taken as values), the slots of its values and where
    each state's first value is among the task's."""
    mp = plan.map
    targets = set(plan.targets)
    params, slots, initial, task = [], [], [], 0
    for i, (param, _) in enumerate(mp.params):
        if isinstance(param, OutParam):
            params.append(ValueParam())  # the buffer the block hands it
            slots.append(("state", i))
            continue
        params.append(param)
        if not param.takes_value:
            continue
        if i in targets:
            slots.append(("state", i))
            initial.append((i, task))
        elif isinstance(param, ChunkParam):
            slots.append(("chunk", task))
        else:
            slots.append(("task", task))
        task += 1
    step = ChunkLaunch(mp.kernel, tuple(params), plan.outputs, mp.rank, mp.tpb, mp.on_device,
                       timeout=mp.timeout)
    return step, tuple(slots), tuple(initial)


def _dtypes(plan: IteratePlan) -> dict:
    mp = plan.map
    dtypes = {}
    for i, (param, source) in enumerate(mp.params):
        if isinstance(param, OutParam):
            dtypes[i] = np.dtype(param.dtype).str
        elif i in plan.targets:
            dtypes[i] = np.dtype(mp.arrays[source].dtype).str
    return dtypes


def _memory(plan: IteratePlan) -> ChunkMemory:
    """The device memory a block needs per element of its extended chunk: each state and
    each output's buffer (a step reads the one and writes the other), and each chunk that
    never changes; whole arrays once."""
    mp = plan.map
    fixed = per_element = 0
    for i, (param, source) in enumerate(mp.params):
        if isinstance(param, OutParam):
            per_element += np.dtype(param.dtype).itemsize
        elif isinstance(param, ChunkParam):
            if mp.on_device and i not in plan.targets:
                continue
            per_element += np.dtype(mp.arrays[source].dtype).itemsize
        elif isinstance(param, WholeParam) and isinstance(source, np.ndarray):
            fixed += source.nbytes
    return ChunkMemory(int(fixed), int(per_element), 0)
