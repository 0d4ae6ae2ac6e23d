"""Map a kernel over dask arrays: one forall-style launch per chunk.

:func:`map_kernel` validates and plans the call once (:func:`.plan.plan_map`,
a :class:`~.plan.MapPlan`), then builds its tasks on the graph layer that
``dask.array`` runs on in this process: the HighLevelGraph
(:mod:`.graphs.hlg`) or array expressions (:mod:`.graphs.expr`,
``array.query-planning``), which answer the same few questions (align the
chunks, halos, the launch layer, the combine). Each task holds a
:class:`~.chunk_task.ChunkLaunch`, what runs on the worker, and gets its own
chunk's place from :class:`~.chunk_params.ChunkPlaces`. A ``map_kernel`` over
the output of another runs both launches in one task per chunk
(:func:`.chains.fuse`; setting ``daskgpu.fuse-chains``), intermediates on the
GPU.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from numbers import Integral

import numpy as np

from daskgpu._config import flag
from daskgpu._dask.cluster_facts import check_chunk_fits
from daskgpu._dask.launch_core.resources import GPU, GPU_MEMORY, LAUNCH_SHARE
from daskgpu._dask.map_kernel.arguments import Out, offset
from daskgpu._dask.map_kernel.chains import ChainLink, chains, fuse
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkPlaces,
    OutParam,
    PerChunkParam,
    StatesParam,
)
from daskgpu._dask.map_kernel.chunk_task import ChunkLaunch, ChunkMemory
from daskgpu._dask.map_kernel.graphs.hlg import HLGLayer
from daskgpu._dask.map_kernel.graphs.layer import GraphLayer
from daskgpu._dask.map_kernel.keywords import check_chunks
from daskgpu._dask.map_kernel.plan import MapPlan, plan_map
from daskgpu._dask.map_kernel.reduction import mapped_axes
from daskgpu._image.random_states import STATE_DTYPE

__all__ = ["Out", "chunk_places", "graph_layer", "map_kernel", "offset"]


# -- building the graph -------------------------------------------------------

def map_kernel(kernel, *args, depth=None, boundary=None, tpb=0, name=None, grid_ndim=None,
               split_every=None, token=None, dtype=None, meta=None, chunks=None,
               drop_axis=None, new_axis=None, timeout=None, group=None):
    """Launch ``kernel`` once per chunk of dask arrays; return its outputs lazily.

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        A kernel from :func:`daskgpu.jit` / :func:`daskgpu.kernel`, or one loaded
        by :func:`daskgpu.load`. A lazy kernel (no signature) is compiled here,
        on the client, for the chunks' dtypes and ranks (C-contiguous).
    *args
        The kernel's arguments, in order:

        - dask arrays: one chunk per launch, chunks aligned and broadcast as
          ``da.blockwise`` does (lower-rank or size-1 arrays arrive with their
          own chunk shape);
        - :class:`Out`: an output allocated per chunk on the worker, aligned
          with the chunks, or one per launch (``per_chunk=``), optionally
          combined across chunks (``combine=``, along ``axis=``). ``dg.Out()``
          without ``like=`` or ``shape=`` takes the mapped dask arrays' shape
          (broadcast together); without a dtype, ``dtype=``;
        - :data:`offset`: the chunk's global start index, one ``int64`` per
          dimension;
        - :func:`random_states` ``(seed)``: the chunk's xoroshiro128+ states,
          one per element of the launch, state *g* for global (row-major flat)
          element *g*, so the numbers do not depend on the chunking;
        - numpy or device arrays: passed whole to every launch (a copy, if the
          kernel writes it; those writes are not returned);
        - numbers.
    depth, boundary
        Halos, as in ``da.map_overlap``: each chunk is extended by ``depth``
        elements per side (an int, or a per-axis tuple or dict), ``boundary``
        fills the outer edges: None (the default) or ``"none"`` leaves them
        without a halo, as ``da.map_overlap`` does; or ``"reflect"``,
        ``"periodic"``, ``"nearest"``, a constant. Outputs are allocated like
        the extended chunk and trimmed afterwards. Chunks shallower than their
        halo are first merged with their neighbours, as ``da.map_overlap``
        rechunks, and the output has those chunks.
    tpb : int
        Threads per block; 0 asks the occupancy API, whose choice differs
        between devices. A kernel with static shared memory
        (``cuda.shared.array`` of a constant shape, sized for its block) is
        refused without ``tpb=``; one with dynamic shared memory is refused.
    name : str, optional
        The key name to use for the output array, as in ``da.map_blocks``.
        Note that this fully specifies the output key name, and must be
        unique: two calls with the same ``name`` share their results. If not
        provided, it is ``{token}-{hash}``, the hash of the image and the
        arguments, so equal calls give equal keys and different calls never
        share one. Several outputs are named ``{name}-out{i}``.
    grid_ndim : int, optional
        Launch rank. Default: the rank of the kernel's ``cuda.grid(n)`` /
        ``cuda.gridsize(n)`` calls, else 1. Rank 1 launches ``chunk.size``
        threads; rank 2 or 3 launches ``chunk.shape`` threads (axis 0 is x).
        A rank-1 kernel over N-D chunks sees them flat, as 1-D C-ordered
        arrays of the chunk's elements (broadcast to the chunk's shape; its
        aligned outputs come back in that shape), where its signature takes
        1-D arrays or, for a lazy kernel, where it compiles with them; one
        that indexes N-D (``x[i, j]``) gets the N-D chunks. Flat chunks take
        no ``depth``.
    token : str, optional
        The key prefix to use for the output array, as in ``da.map_blocks``.
        If not provided, the kernel's name.
    split_every : int or dict, optional
        For outputs with ``combine=``: how many partials one combine task
        folds, as in ``da.reduction`` (default: dask's ``split_every``).
    dtype : numpy dtype, optional
        As in ``da.map_blocks``, the output's dtype: outputs declared without
        one (``dg.Out()``) take it, and any result of another dtype (an
        output that names its own, or a written input) is refused.
    meta : array, optional
        As in ``da.map_blocks``, an empty array of the output's type: NumPy,
        or CuPy to allocate the outputs with CuPy whatever the inputs. Its
        dtype serves where ``dtype=`` is not given. CuPy chunks give CuPy
        outputs, so a NumPy ``meta`` with them is refused.
    chunks : tuple, optional
        As in ``da.map_blocks``, the outputs' chunks. An aligned output has
        the mapped chunks, so ``chunks=`` is checked against them (an error
        names both when they differ); a launch cannot give another chunk
        shape. For outputs of their own shape use ``dg.Out(per_chunk=...)``.
    drop_axis, new_axis
        Not supported, with an error that says why: an aligned output has the
        mapped chunk's axes. A per-chunk output (``dg.Out(per_chunk=shape)``)
        adds axes; combining it along ``axis=`` drops mapped axes.
    timeout : float, optional
        The most seconds a chunk's task may run on a GPU worker, in place of
        the workers' ``daskgpu.launch-timeout``. A task over it fails naming
        the kernel, the chunk and the limit, and the worker's process is
        replaced (its nanny starts a fresh one on the same GPU), which frees
        the GPU of a kernel that would not end; the other tasks that were
        running on that worker run again elsewhere, as after a lost worker.
    group : bool or int or str, optional
        Launches sized for the GPU rather than for the storage. A map whose
        chunks each need less than a quarter of ``daskgpu.launch-bytes``
        (32 MiB by default; at most a quarter of a worker's ``GPU-memory``) of
        device memory merges neighbouring chunks, never splitting one, into
        groups that need about that much, and launches once per group: Dask
        runs a few thousand tasks a second at best, and a launch over a small
        chunk leaves the GPU idle. The outputs then have the grouped chunks.
        None (the default): grouped only where daskgpu can show, from the
        kernel's code, that its results cannot depend on where a launch begins
        or ends (every use of the thread's position indexes a mapped array
        there, checks it against such an array's extent, adds it to
        ``dg.offset``, or reads within the halo); otherwise one launch per
        chunk, with a ``PerformanceWarning`` saying why where grouping would
        have cut the launches fourfold. At this default size a cluster's GPU
        threads each get a group where the map has that many chunks. True:
        group any kernel at the setting's size; False: one launch per chunk; a
        size (bytes, or a string such as ``"64 MiB"``): group any kernel at
        that size, as asked. Not done with ``chunks=``, or with a per-chunk
        output that keeps one element per launch (no ``combine=`` over every
        mapped axis). An input read by ``da.from_array`` or ``da.from_zarr``,
        with nothing between, reads the larger pieces itself (on both of
        Dask's graph layers): one task per launch. Any other input is joined
        by a task per group before its launch, its chunks' own tasks left as
        they are.

    Returns
    -------
    dask.array.Array or tuple of them
        The :class:`Out` arrays in argument order, then every dask input the
        kernel writes, as new arrays (the inputs themselves are never
        modified). One result comes back bare. Results are CuPy-backed when
        the inputs are.

    Notes
    -----
    Each chunk's task holds only PTX and plain data (plus, while
    ``daskgpu.simulate`` is on, the Python function for the simulator).

    When a distributed client is current and its workers offer a ``GPU``
    resource, every launch task is restricted to those workers, asking a
    small share of the resource (``GPU=2**-10``): a worker runs as many
    launches at once as it has threads, as it would run ``map_blocks`` tasks.
    The tasks also carry that as a layer annotation, but Dask's low-level
    task fusion (on by default) drops annotations on the way to the
    scheduler, so the restriction is set there, by the placement plugin that
    ``map_kernel`` registers, on any cluster and whatever the graph's
    optimization. To keep each launch alone on its GPU, ask for the whole
    resource: ``.persist(resources={"GPU": 1})``.

    A dask array that an earlier ``map_kernel`` returned (its one aligned
    output, without ``depth``), passed here unchanged and once, is fused: each
    task runs both launches on the same chunk, and on host chunks the
    intermediate stays on the GPU while each input crosses PCIe once. The
    intermediate array's own tasks are then not in this graph; computing it as
    well runs its launches a second time, with the same results. The setting
    ``daskgpu.fuse-chains`` (default true) turns this off.

    Examples
    --------
    >>> import dask, numpy as np, dask.array as da, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit
    ... def saxpy(out, a, x, y):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = a * x[i] + y[i]
    >>> x = da.arange(8, chunks=4, dtype=np.float32)
    >>> with dask.config.set({"daskgpu.simulate": True}):   # no GPU needed
    ...     z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
    ...     z.compute()
    array([ 0.,  3.,  6.,  9., 12., 15., 18., 21.], dtype=float32)

    Global indices with :data:`offset` and a halo with ``depth``:

    >>> @dg.jit
    ... def index(out, start):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = start + i
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.map_kernel(index, dg.Out(np.int64, shape=(6,), chunks=3), dg.offset).compute()
    array([0, 1, 2, 3, 4, 5])

    A per-chunk output, summed across chunks (a histogram):

    >>> @dg.jit
    ... def hist(counts, x):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         cuda.atomic.add(counts, x[i] % 4, 1)
    >>> x = da.arange(10, chunks=3)
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.map_kernel(hist, dg.Out(np.int64, per_chunk=4, combine="sum"), x).compute()
    array([3, 3, 2, 2])

    The same over a 2-D array, summed along axis 1 only: one histogram per
    block of rows (a ``cuda.grid(1)`` kernel sees the 2-D chunks flat):

    >>> x = da.from_array(np.arange(24).reshape(4, 6), chunks=(2, 3))
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     rows = dg.map_kernel(hist, dg.Out(np.int64, per_chunk=4, combine="sum", axis=1), x)
    ...     rows.compute()
    array([[3, 3, 3, 3],
           [3, 3, 3, 3]])

    ``dtype=`` as in ``da.map_blocks``, for an output shaped like the mapped
    arrays:

    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.map_kernel(saxpy, dg.Out(), np.float32(2), x, x, dtype=np.float32).compute()[0]
    array([ 0.,  3.,  6.,  9., 12., 15.], dtype=float32)
    """
    layer = graph_layer()
    plan = plan_map(kernel, args, depth=depth, boundary=boundary, tpb=tpb, name=name,
                    grid_ndim=grid_ndim, split_every=split_every, token=token, dtype=dtype,
                    meta=meta, drop_axis=drop_axis, new_axis=new_axis, timeout=timeout,
                    group=group, chunks=chunks, layer=layer)
    results = _build(plan, layer)
    if chunks is not None:
        check_chunks(chunks, results, plan.returns)
    return _combined(results, plan, layer)


def graph_layer() -> GraphLayer:
    """The graph layer that ``dask.array`` runs on here: expressions or HighLevelGraph."""
    if not expressions_enabled():
        return HLGLayer()
    from daskgpu._dask.map_kernel.graphs.expr import ExprLayer

    return ExprLayer()


def expressions_enabled() -> bool:
    """Whether ``dask.array`` runs on array expressions in this process.

    Dask reads ``array.query-planning`` once, when ``dask.array`` is first
    imported; older Dask versions have no expressions at all.
    """
    import dask.array as da

    check = getattr(da, "array_expr_enabled", None)
    return bool(check()) if check is not None else False


def _halo(plan: MapPlan, layer):
    """Overlap every array as ``map_overlap`` does; return them and the halo spec."""
    aligned, ndim = list(plan.aligned), plan.ndim
    depth, boundary = layer.coerce_halo(ndim, plan.depth, plan.boundary)
    for ax, d in depth.items():
        if not isinstance(d, Integral) or d < 0:
            raise ValueError(
                f"map_kernel takes a non-negative integer depth per axis, got {d!r} for "
                f"axis {ax}"
            )
    if not any(depth.values()):
        return aligned, (0,) * ndim, (False,) * ndim, None
    for a in aligned:
        if a.ndim != ndim:
            raise ValueError(
                f"with depth, every array of map_kernel must be {ndim}-D like its outputs; "
                f"got one of shape {a.shape}. Broadcast it first (da.broadcast_to)."
            )
    for ax, d in depth.items():
        # Shallower chunks were rechunked when planned, as da.map_overlap does: what is
        # left is an axis shorter than its halo.
        smallest = min(plan.out_chunks[ax]) if plan.out_chunks[ax] else 0
        if d > smallest:
            raise ValueError(
                f"map_kernel depth {d} on axis {ax} is deeper than the axis is long "
                f"({sum(plan.out_chunks[ax])} elements; chunks {plan.out_chunks[ax]}), "
                "so no chunk can hold its halo; use a depth of at most the axis's length."
            )
    overlapped = layer.overlap(aligned, depth, boundary)
    left = tuple(boundary[ax] != "none" for ax in range(ndim))
    return overlapped, tuple(int(depth[ax]) for ax in range(ndim)), left, (depth, boundary)


def chunk_places(block_chunks, out_chunks, halo, left, user_chunks=None) -> ChunkPlaces:
    """Each block's id, shape and start: a halo moves a chunk's start down by its depth.
    Grouped (``user_chunks`` given), each also names the user's chunks it holds."""
    starts = []
    for chunks, depth, edge in zip(out_chunks, halo, left):
        axis = np.cumsum((0,) + tuple(chunks[:-1])).tolist()
        starts.append(tuple(s - depth if b > 0 or edge else s for b, s in enumerate(axis)))
    members = None
    if user_chunks is not None:
        members = tuple(_members_per_group(u, g) for u, g in zip(user_chunks, out_chunks))
    return ChunkPlaces(block_chunks, starts, members)


def _members_per_group(user, grouped) -> tuple:
    """Per group of one axis: its first user chunk's index and start, and the user chunks'
    sizes within it."""
    out, it, index, start = [], iter(user), 0, 0
    for g in grouped:
        sizes, total = [], 0
        while total < g:
            sizes.append(next(it))
            total += sizes[-1]
        out.append((index, start, tuple(sizes)))
        index, start = index + len(sizes), start + total
    return tuple(out)


def _build(plan: MapPlan, layer) -> tuple:
    """One launch task per chunk, on ``layer``; the results as dask arrays."""
    import dask
    from dask.array.core import broadcast_chunks

    ndim = plan.ndim
    blocks, halo, left, trim = _halo(plan, layer)
    # Outputs are allocated in the task that launches on them: a task per
    # output chunk would double the graph and the scheduler's work.
    block_chunks = broadcast_chunks(*(b.chunks for b in blocks))
    places = chunk_places(block_chunks, plan.out_chunks, halo, left,
                     plan.user_chunks if plan.grouped else None)
    task_args = plan.task_sources(blocks)
    need = _chunk_memory(plan, task_args, block_chunks)
    check_chunk_fits(need.most, plan.kernel_name, plan.cluster)
    fn = ChunkLaunch(plan.kernel, plan.param_objects, tuple(r.index for r in plan.returns),
                     plan.rank, plan.tpb, plan.on_device, timeout=plan.launch_timeout,
                     memory=need)
    if not any(halo) and flag("fuse-chains", True):
        fused, fused_args = fuse(fn, task_args, plan, blocks, block_chunks)
        # A fused task holds every launch's arrays at once: where that is more than any
        # worker offers, though each map alone fits, the maps stay apart.
        gpu_memory = plan.cluster.gpu_memory
        if fused is fn or not gpu_memory or fused.device_bytes() <= gpu_memory:
            fn, task_args = fused, fused_args
    name, returns = plan.name, plan.returns
    # Kept through blockwise fusion on the HighLevelGraph layer; the scheduler's
    # placement plugin covers the rest (and expressions, which carry no annotations).
    asks = {GPU: LAUNCH_SHARE,
            **({GPU_MEMORY: fn.device_bytes()} if plan.cluster.gpu_memory else {})}
    with dask.annotate(resources=asks) if plan.cluster.offers_gpu else nullcontext():
        if len(returns) == 1:
            r = returns[0]
            meta = plan.meta(r.dtype, ndim + len(r.per_chunk or ()))
            results = [layer.launches(fn, task_args, places, name, meta, r.per_chunk,
                                      token=plan.token)]
        else:
            launched = layer.launches(fn, task_args, places, name,
                                      np.empty((0,) * ndim, dtype=object))
            results = [
                layer.select(launched, i, f"{name}-out{i}",
                             plan.meta(r.dtype, ndim + len(r.per_chunk or ())), r.per_chunk)
                for i, r in enumerate(returns)
            ]
    if trim is not None:
        results = [layer.trim(r, *trim) for r in results]
    elif len(returns) == 1 and returns[0].aligned_output:
        # A later map_kernel over this result may fuse its launches with these.
        chains.put(results[0].name, ChainLink(results[0], fn, task_args,
                                              returns[0].param.layout))
    return tuple(results)


def _chunk_memory(plan: MapPlan, task_args, block_chunks) -> ChunkMemory:
    """The device memory a chunk's launch needs: its chunks and whole arrays copied in
    (CuPy chunks are there already), its outputs, and its random states (built on the
    device, 16 bytes an element), as a function of its block."""
    import dask.array as da

    block_chunks = tuple(tuple(axis) for axis in block_chunks)
    fixed = per_element = 0
    for arg in task_args:
        if isinstance(arg, da.Array):
            if plan.on_device:
                continue
            if tuple(map(tuple, arg.chunks)) == block_chunks:
                per_element += np.dtype(arg.dtype).itemsize
            else:  # broadcast along some axis: counted at its largest chunk
                fixed += (math.prod(max(c, default=0) for c in arg.chunks)
                          * np.dtype(arg.dtype).itemsize)
        elif isinstance(arg, np.ndarray):
            fixed += arg.nbytes
    for param in plan.param_objects:
        if isinstance(param, PerChunkParam):
            fixed += math.prod(param.shape) * np.dtype(param.dtype).itemsize
        elif isinstance(param, OutParam):
            per_element += np.dtype(param.dtype).itemsize
        elif isinstance(param, StatesParam):
            per_element += STATE_DTYPE.itemsize
    largest = math.prod(max(c, default=0) for c in block_chunks)
    return ChunkMemory(int(fixed), int(per_element), int(largest))


def _combined(results, plan: MapPlan, layer):
    """The results, each per-chunk output with a ``combine`` reduced across chunks; one
    result bare."""
    done = []
    for k, (result, r) in enumerate(zip(results, plan.returns)):
        if r.fold is not None:
            result = layer.combine(result, plan.ndim, r.fold, plan.split_every,
                                   f"{plan.name}-combine{k}",
                                   mapped_axes(r.out.axis, plan.ndim))
        done.append(result)
    return done[0] if len(done) == 1 else tuple(done)
