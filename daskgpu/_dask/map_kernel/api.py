"""Map a kernel over dask arrays: one forall-style launch per chunk.

:func:`map_kernel` validates its arguments (:mod:`daskgpu._dask.map_kernel.arguments`),
plans the kernel image and its parameters on the client
(:mod:`daskgpu._dask.map_kernel.selection`), then builds the graph with
``da.blockwise`` (after ``unify_chunks`` and, for halos,
``da.overlap.overlap``). Each task holds a
:class:`~daskgpu._dask.map_kernel.chunk_task.ChunkLaunch`, what runs on the worker, and
gets its own chunk's place from :class:`~daskgpu._dask.map_kernel.chunk_params.ChunkPlaces`.
A ``map_kernel`` over the output of another runs both launches in one task
per chunk (:func:`~daskgpu._dask.map_kernel.selection.fuse`; setting
``daskgpu.fuse-chains``), intermediates on the GPU.
"""

from __future__ import annotations

import math
import operator
import pickle
from contextlib import nullcontext
from numbers import Integral

import numpy as np

from daskgpu._config import flag
from daskgpu._dask.cluster_facts import check_chunk_fits, check_workers_link, cluster_facts
from daskgpu._dask.map_kernel import reduction
from daskgpu._dask.map_kernel.arg_kinds import check_extras, classify
from daskgpu._dask.map_kernel.arguments import Out, mapped_rank, offset
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkParam,
    ChunkPlaces,
    OutParam,
    PerChunkParam,
    is_cupy,
)
from daskgpu._dask.map_kernel.chunk_task import ChunkLaunch, ChunkMemory, run_chunk
from daskgpu._dask.map_kernel.keywords import (
    check_axis_changes,
    check_chunks,
    check_dtype,
    check_meta,
    output_dtype,
    resolve_outs,
)
from daskgpu._dask.map_kernel.selection import (
    ChainLink,
    chains,
    check_block_size,
    check_kernel,
    fuse,
    plan_params,
    select_image,
    shipped,
)
from daskgpu._dask.placement import GPU, GPU_MEMORY, LAUNCH_SHARE
from daskgpu._runtime import backends
from daskgpu._runtime.launch import check_timeout

__all__ = ["Out", "map_kernel", "offset"]


# -- building the graph -------------------------------------------------------

def map_kernel(kernel, *args, depth=None, boundary=None, tpb=0, name=None, grid_ndim=None,
               split_every=None, token=None, dtype=None, meta=None, chunks=None,
               drop_axis=None, new_axis=None, timeout=None):
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
        fills the outer edges (``"none"`` by default, or ``"reflect"``,
        ``"periodic"``, ``"nearest"``, a constant). Outputs are allocated like
        the extended chunk and trimmed afterwards.
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

    >>> x = da.arange(24, chunks=6).reshape(4, 6).rechunk((2, 3))
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
    check_kernel(kernel)
    if operator.index(tpb) < 0:
        raise ValueError(f"tpb must be 0 (automatic) or positive, got {tpb!r}")
    check_axis_changes(drop_axis, new_axis)
    dtype = output_dtype(dtype, meta)
    args = resolve_outs(args, dtype, meta)
    roles, arrays = classify(args)
    check_meta(meta, arrays)
    ndim = mapped_rank(arrays)
    check_extras(roles, ndim, depth)
    image, rank, flat = select_image(kernel, roles, arrays, ndim, grid_ndim)
    check_block_size(kernel.__name__, image, int(tpb))
    if flat:
        _check_flat_halo(kernel.__name__, depth, ndim)
    cluster = cluster_facts()
    check_workers_link(image, kernel.__name__, cluster)  # once, not per chunk
    # Simulated workers run the Python function, whether or not this process simulates.
    simulate = backends.current().simulated or cluster.simulates
    ship = shipped(kernel, image, simulate)
    aligned, out_chunks = _align(arrays, ndim)
    plan, returns = plan_params(kernel.__name__, image, roles, arrays, out_chunks, simulate,
                                flat)
    check_dtype(kernel.__name__, returns, dtype)
    if name is None:  # as da.map_blocks: name= is the full key name, token= its prefix
        from dask.base import tokenize

        name = f"{token or kernel.__name__}-" + tokenize(
            image.hash, kernel.__name__, args, depth, boundary, int(tpb), rank, simulate,
            timeout)
    name = str(name)
    results = _build_graph(ship, plan, returns, arrays, aligned, out_chunks, rank=rank,
                           tpb=int(tpb), depth=depth, boundary=boundary, name=name,
                           timeout=check_timeout(timeout), cluster=cluster,
                           kernel_name=kernel.__name__)
    if chunks is not None:
        check_chunks(chunks, results, plan, returns)
    return _combined(results, plan, returns, len(out_chunks), split_every, name)


def _check_flat_halo(kernel_name, depth, ndim):
    """Refuse halos for a kernel that sees N-D chunks flat: it cannot find its neighbours."""
    if depth is not None and any(
            depth.values() if isinstance(depth, dict) else np.atleast_1d(depth).tolist()):
        raise ValueError(
            f"kernel {kernel_name!r} indexes its {ndim}-D chunks flat (a rank-1 kernel), so "
            f"it cannot find a halo's neighbours (depth={depth!r}); write it over cuda.grid("
            f"{ndim}) with {ndim}-D arrays, or map without depth"
        )


def _align(arrays, ndim):
    """Unify chunks as ``da.blockwise`` does (right-aligned broadcasting)."""
    from dask.array.core import unify_chunks

    dask_arrays = [placeholder(a) if isinstance(a, Out) else a for a in arrays]
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


def placeholder(out: Out):
    """A dask array of ``out``'s shape and chunks that costs no memory per chunk."""
    import dask.array as da

    # Only its chunks are read (to align them): a graph without tasks
    # costs a fraction of da.broadcast_to's (0.16 against 0.03 ms here).
    return da.Array({}, "daskgpu-out-placeholder", out.chunks,
                    meta=np.empty((0,) * len(out.shape), np.bool_))


def _halo(aligned, out_chunks, ndim, depth, boundary):
    """Overlap every array as ``map_overlap`` does; return them and the halo spec."""
    from dask.array.overlap import coerce_boundary, coerce_depth, overlap

    depth = coerce_depth(ndim, depth)
    boundary = coerce_boundary(ndim, boundary)
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
        smallest = min(out_chunks[ax]) if out_chunks[ax] else 0
        if d > smallest:
            raise ValueError(
                f"map_kernel depth {d} on axis {ax} is deeper than the smallest chunk "
                f"({smallest} elements; chunks {out_chunks[ax]}). Rechunk so every chunk "
                f"on axis {ax} has at least {d} elements (x.rechunk(...)), or use a "
                "smaller depth."
            )
    overlapped = [overlap(a, depth=depth, boundary=boundary, allow_rechunk=False)
                  for a in aligned]
    left = tuple(boundary[ax] != "none" for ax in range(ndim))
    return overlapped, tuple(int(depth[ax]) for ax in range(ndim)), left, (depth, boundary)


def _places(block_chunks, out_chunks, halo, left) -> ChunkPlaces:
    """Each block's id, shape and start: a halo moves a chunk's start down by its depth."""
    starts = []
    for chunks, depth, edge in zip(out_chunks, halo, left):
        axis = np.cumsum((0,) + tuple(chunks[:-1])).tolist()
        starts.append(tuple(s - depth if b > 0 or edge else s for b, s in enumerate(axis)))
    return ChunkPlaces(block_chunks, starts)


def _meta_base(arrays):
    for a in arrays:
        meta = a.meta if isinstance(a, Out) else a._meta
        if meta is not None and is_cupy(meta):
            return meta
    return None


def _build_graph(ship, plan, returns, arrays, aligned, out_chunks, *, rank, tpb, depth,
                 boundary, name, cluster, kernel_name, timeout=None):
    """One launch task per chunk, on ``da.blockwise``; the results as dask arrays."""
    import dask
    from dask.array.core import broadcast_chunks
    from dask.array.overlap import trim_internal
    from dask.array.utils import meta_from_array

    ndim = len(out_chunks)
    blocks, halo, left, trim = _halo(aligned, out_chunks, ndim, depth, boundary)
    base = _meta_base(arrays)
    # Outputs are allocated in the task that launches on them: a task per
    # output chunk would double the graph and the scheduler's work.
    block_chunks = broadcast_chunks(*(b.chunks for b in blocks))
    places = _places(block_chunks, out_chunks, halo, left)
    task_args = [blocks[source] if isinstance(param, ChunkParam) else source
                 for param, source in plan if param.takes_value]
    need = _chunk_memory(plan, task_args, block_chunks, on_device=base is not None)
    check_chunk_fits(need.most, kernel_name, cluster)
    fn = ChunkLaunch(ship, tuple(p.param for p in plan), tuple(r.index for r in returns),
                     rank, tpb, base is not None, timeout=timeout, memory=need)
    if not any(halo) and flag("fuse-chains", True):
        fn, task_args = fuse(fn, task_args, plan, arrays, blocks, block_chunks)

    def meta_of(dtype, nd):
        if base is not None:
            return meta_from_array(base, nd, dtype)
        return np.empty((0,) * nd, dtype=dtype)

    # Per result: its shape per launch, when it is a per-chunk output.
    per_chunk = [plan[r.index].param.shape if isinstance(plan[r.index].param, PerChunkParam)
                 else None for r in returns]
    # Kept through blockwise fusion; the scheduler's placement plugin covers the rest.
    asks = {GPU: LAUNCH_SHARE, **({GPU_MEMORY: fn.device_bytes} if cluster.gpu_memory else {})}
    with dask.annotate(resources=asks) if cluster.offers_gpu else nullcontext():
        if len(returns) == 1:
            meta = meta_of(returns[0].dtype, ndim + len(per_chunk[0] or ()))
            results = [_launches(fn, task_args, places, name, meta, per_chunk[0])]
        else:
            launched = _launches(fn, task_args, places, name,
                                 np.empty((0,) * ndim, dtype=object))
            results = [
                launched.map_blocks(operator.getitem, i, name=f"{name}-out{i}",
                                    meta=meta_of(r.dtype, ndim + len(per or ())),
                                    **_block_layout(block_chunks, per))
                for i, (r, per) in enumerate(zip(returns, per_chunk))
            ]
    if trim is not None:
        results = [trim_internal(r, *trim) for r in results]
    elif len(returns) == 1 and isinstance(plan[returns[0].index].param, OutParam):
        # A later map_kernel over this result may fuse its launches with these.
        chains.put(results[0].name, ChainLink(results[0], fn, task_args,
                                              plan[returns[0].index].param.layout))
    return results[0] if len(results) == 1 else tuple(results)


def _chunk_memory(plan, task_args, block_chunks, on_device: bool) -> ChunkMemory:
    """The device memory a chunk's launch needs: its chunks and whole arrays copied in
    (CuPy chunks are there already), and its outputs, as a function of its block.

    Examples
    --------
    >>> import dask.array as da
    >>> x = da.ones(1000, chunks=400, dtype="f4")
    >>> plan = [(OutParam("f4", "C"), None), (ChunkParam("C", written=False), 0)]
    >>> m = _chunk_memory(plan, [x], x.chunks, on_device=False)  # 4 bytes in, 4 out
    >>> m.most, m.for_block((200,))
    (3200, 1600)
    """
    import dask.array as da

    block_chunks = tuple(tuple(axis) for axis in block_chunks)
    fixed = per_element = 0
    for arg in task_args:
        if isinstance(arg, da.Array):
            if on_device:
                continue
            if tuple(map(tuple, arg.chunks)) == block_chunks:
                per_element += arg.dtype.itemsize
            else:  # broadcast along some axis: counted at its largest chunk
                fixed += math.prod(max(c, default=0) for c in arg.chunks) * arg.dtype.itemsize
        elif isinstance(arg, np.ndarray):
            fixed += arg.nbytes
    for param, _ in plan:
        if isinstance(param, PerChunkParam):
            fixed += math.prod(param.shape) * np.dtype(param.dtype).itemsize
        elif isinstance(param, OutParam):
            per_element += np.dtype(param.dtype).itemsize
    largest = math.prod(max(c, default=0) for c in block_chunks)
    return ChunkMemory(int(fixed), int(per_element), int(largest))


def _launches(fn, task_args, places, name, meta, per_chunk=None):
    """The launch layer: ``fn`` per block on its arguments' blocks and its place.

    ``fn`` (the kernel's PTX and the parameters) is a key of the graph of its
    own, ``<name>-launch``, which every task reads: it travels once to each
    worker (and once to the scheduler), so a task is about as small as a
    ``map_blocks`` task, whatever the PTX and the number of chunks. A graph
    whose tasks would together carry at most :data:`EMBED_BYTES` of it
    carries ``fn`` in each task instead: that key costs a round trip through
    the scheduler before any chunk starts (7 ms on the H200, against 16
    chunks of 64 MiB taking 0.12 s). Arrays broadcast right-aligned, as in
    ``da.map_blocks``; a per-chunk output adds its axes after the mapped
    ones, one block of ``per_chunk`` per launch.
    """
    import dask.array as da

    ndim = len(places.chunks)
    mapped = tuple(range(ndim))[::-1]
    pairs = [fn if _embeds(fn, math.prod(len(c) for c in places.chunks))
             else _launch_key(fn, f"{name}-launch"), None]
    for a in task_args:
        pairs += [a, tuple(range(a.ndim))[::-1] if isinstance(a, da.Array) else None]
    new = tuple(range(ndim, ndim + len(per_chunk or ())))
    return da.blockwise(
        run_chunk, mapped + new, *pairs, places, mapped, name=name, meta=meta,
        new_axes=dict(zip(new, per_chunk or ())),
        adjust_chunks=None if per_chunk is None else dict.fromkeys(mapped, 1),
        align_arrays=False, concatenate=True)


#: The annotation of a launch key's layer: marks it as the launch the tasks read.
LAUNCH_KEY_ANNOTATION = {"daskgpu": "launch"}


def _launch_key(fn, key: str):
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
    >>> launch = _launch_key("the launch", "saxpy-launch")
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


#: The most bytes of a pickled launch (``fn`` of :func:`_launches`) that a graph's
#: tasks carry together, one copy each, rather than read it from a key of its own.
EMBED_BYTES = 256 << 10


def _embeds(fn, tasks: int) -> bool:
    """Whether ``tasks`` tasks carry ``fn`` themselves: together at most :data:`EMBED_BYTES`."""
    if tasks > EMBED_BYTES >> 10:  # a launch pickles to more than 1 KiB: not worth pickling
        return False
    return tasks * len(pickle.dumps(fn)) <= EMBED_BYTES


def _block_layout(block_chunks, per_chunk):
    """``map_blocks`` keywords of a result: aligned, or one block of ``per_chunk`` a launch."""
    if per_chunk is None:
        return {"chunks": block_chunks}
    ndim = len(block_chunks)
    return {"chunks": tuple((1,) * len(c) for c in block_chunks) + tuple((n,) for n in per_chunk),
            "new_axis": list(range(ndim, ndim + len(per_chunk)))}


def _combined(results, plan, returns, ndim, split_every, name):
    """The results, each per-chunk output with a ``combine`` reduced across chunks."""
    many = isinstance(results, tuple)
    done = []
    for k, (result, r) in enumerate(zip(results if many else (results,), returns)):
        param, out = plan[r.index]
        if isinstance(param, PerChunkParam) and out.fold is not None:
            result = reduction.combine_partials(result, ndim, out.fold, split_every,
                                                name=f"{name}-combine{k}",
                                                axis=reduction.mapped_axes(out.axis, ndim))
        done.append(result)
    return tuple(done) if many else done[0]
