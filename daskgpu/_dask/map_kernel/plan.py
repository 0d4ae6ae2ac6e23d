"""One :func:`~daskgpu.map_kernel` call, planned once on the client: :class:`MapPlan`.

:func:`plan_map` validates the call's arguments and keywords, selects the
kernel image, plans every kernel parameter and unifies the chunks; what it
returns is all that the graph builders (:mod:`.graphs.hlg`, :mod:`.graphs.expr`),
the reductions and the checks read, so none of them re-derives it.
"""

from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskgpu._dask.cluster_facts import ClusterFacts, check_workers_link, cluster_facts
from daskgpu._dask.launch_layout import (
    MAPPED,
    check_group,
    group_chunks,
    grouping_hazards,
    launch_bytes,
    least_groups,
)
from daskgpu._dask.map_kernel.arg_kinds import Planned, check_extras, classify
from daskgpu._dask.map_kernel.arguments import Out, mapped_rank
from daskgpu._dask.map_kernel.arrays import is_cupy
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkParam,
    OffsetParam,
    OutParam,
    PerChunkParam,
    StatesParam,
    ValueParam,
    WholeParam,
)
from daskgpu._dask.map_kernel.keywords import (
    check_axis_changes,
    check_dtype,
    check_meta,
    output_dtype,
    resolve_outs,
)
from daskgpu._dask.map_kernel.selection import (
    check_block_size,
    check_kernel,
    plan_params,
    select_image,
    shipped,
)
from daskgpu._image.random_states import STATE_DTYPE
from daskgpu._runtime import backends
from daskgpu._runtime.launch import check_timeout
from daskgpu._runtime.ptx_kernel import PTXKernel

__all__ = ["MapPlan", "Returned", "plan_map"]


@dataclass(frozen=True, eq=False)
class Returned:
    """One array a map returns: its kernel parameter, dtype, and what was asked of it.

    Outputs come first, in argument order, then the dask inputs the kernel writes.
    """

    index: int  # among the kernel's parameters
    dtype: np.dtype
    param: Any  # OutParam, PerChunkParam, or the ChunkParam of a written input
    out: Out | None  # the user's dg.Out for an output, None for a written input

    @property
    def per_chunk(self) -> tuple | None:
        """The shape each launch gives a per-chunk output; None for an aligned result."""
        return self.param.shape if isinstance(self.param, PerChunkParam) else None

    @property
    def fold(self):
        """The binary function that combines a per-chunk output across chunks, or None."""
        return self.out.fold if self.per_chunk is not None else None

    @property
    def aligned_output(self) -> bool:
        """An output aligned with the mapped chunks (what a later map may fuse with)."""
        return isinstance(self.param, OutParam)


@dataclass(frozen=True, eq=False)
class MapPlan:
    """Everything about one ``map_kernel`` call, built once by :func:`plan_map`.

    Attributes
    ----------
    kernel_name : str
    kernel : PTXKernel
        What the tasks ship: just the selected image (with its Python
        function while kernels are simulated).
    rank : int
        The launch grid's rank.
    tpb : int
        Threads per block (0: the occupancy API's choice).
    params : tuple of Planned
        One per kernel parameter: its parameter object and where its value
        comes from (an index into ``aligned``, an :class:`Out`, a value).
    returns : tuple of Returned
    arrays : tuple
        The dask arrays and aligned :class:`Out` as given (chunks not unified).
    aligned : tuple
        The same with their chunks unified, as ``da.blockwise`` aligns them.
    out_chunks : tuple of tuple of int
        The mapped chunks.
    depth, boundary
        The halo, as given to ``map_kernel``.
    name : str
        The output's key name.
    token : str or None
        The prefix of a name made from the map's hash (``token=``, else the
        kernel's name); None when ``name=`` was given.
    timeout : float or None
        Seconds a chunk's launch may run (None: the workers' setting); a grouped
        launch may run that times its chunks (:attr:`launch_timeout`).
    cluster : ClusterFacts
        What the current client's workers offer.
    split_every
        For outputs with ``combine=``.
    meta_base : array or None
        A CuPy meta when the map's arrays are CuPy, so outputs are too.
    user_chunks : tuple of tuple of int
        The user's chunks (unified, deepened for a halo), which ``out_chunks`` groups
        where chunks are grouped into larger launches
        (:func:`~daskgpu._dask.launch_layout.group_chunks`).
    hazards : tuple of Hazard
        Why grouping chunks could change what the kernel computes
        (:func:`~daskgpu._dask.launch_layout.grouping_hazards`); empty where it cannot.
    """

    kernel_name: str
    kernel: PTXKernel
    rank: int
    tpb: int
    params: tuple[Planned, ...]
    returns: tuple[Returned, ...]
    arrays: tuple
    aligned: tuple
    out_chunks: tuple
    depth: Any
    boundary: Any
    name: str
    token: str | None
    timeout: float | None
    cluster: ClusterFacts
    split_every: Any
    meta_base: Any
    user_chunks: tuple = ()
    hazards: tuple = ()

    @property
    def grouped(self) -> bool:
        """The mapped chunks were grouped into larger launches: ``out_chunks`` and
        ``aligned`` are the groups, ``user_chunks`` the chunks they hold."""
        return bool(self.user_chunks) and self.user_chunks != self.out_chunks

    @property
    def chunks_per_launch(self) -> int:
        """The most of the user's chunks one launch covers (1 unless grouped)."""
        if not self.grouped:
            return 1
        return math.prod(max(_members(u, g)) for u, g in zip(self.user_chunks, self.out_chunks))

    @property
    def launch_timeout(self) -> float | None:
        """A launch's time limit: ``timeout`` per chunk, times the chunks of the largest
        group where chunks are grouped."""
        return None if self.timeout is None else self.timeout * self.chunks_per_launch

    @property
    def ndim(self) -> int:
        return len(self.out_chunks)

    @property
    def on_device(self) -> bool:
        """The map's chunks are CuPy arrays: already on the GPU."""
        return self.meta_base is not None

    @property
    def param_objects(self) -> tuple:
        return tuple(p.param for p in self.params)

    def meta(self, dtype, ndim: int):
        """An empty array of the map's array type (NumPy or CuPy), ``dtype`` and ``ndim``."""
        if self.meta_base is not None:
            from dask.array.utils import meta_from_array

            return meta_from_array(self.meta_base, ndim, dtype)
        return np.empty((0,) * ndim, dtype=dtype)

    def task_sources(self, blocks) -> list:
        """The tasks' arguments before the place: a block for each chunk parameter (from
        ``blocks``, the arrays as the tasks read them), the value of each other one."""
        return [blocks[source] if isinstance(param, ChunkParam) else source
                for param, source in self.params if param.takes_value]


def plan_map(kernel, args, *, depth=None, boundary=None, tpb=0, name=None, grid_ndim=None,
             split_every=None, token=None, dtype=None, meta=None, drop_axis=None,
             new_axis=None, timeout=None, group=None, chunks=None, layer, group_bytes=None,
             group_spread=None, layout_warning=True) -> MapPlan:
    """Validate a ``map_kernel`` call and plan it (see :class:`MapPlan`).

    ``layer`` is the graph layer in use (:mod:`.graphs.hlg`, :mod:`.graphs.expr`):
    its ``align(arrays, ndim)`` unifies the chunks of the dask arrays and
    :class:`Out` placeholders, returning ``(aligned, out_chunks)``, and its
    ``regroup(array, chunks)`` gives an array larger chunks.

    ``group_bytes`` is the group size that ``group`` None or True stands for
    (None: the ``daskgpu.launch-bytes`` setting), ``group_spread(cluster_facts)``
    how many groups that size leaves at least (None: one per GPU thread of the
    cluster). ``layout_warning=False`` leaves saying why chunks are not grouped
    to the caller, which reads ``hazards``.
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
    aligned, out_chunks = layer.align(arrays, ndim)
    params, results = plan_params(kernel.__name__, image, roles, arrays, out_chunks, simulate,
                                  flat)
    check_group(group, "map_kernel(group")
    user_chunks = out_chunks
    depths, padded = _halo_of(layer, ndim, depth, boundary)
    hazards = grouping_hazards(
        image.positions, tuple(_role(param, flat and ndim > 1) for param, _ in params),
        rank=rank, halo=depths, padded=padded,
        names=getattr(kernel, "parameter_names", None))
    grouped = None
    if chunks is None and _may_group(params, ndim):  # chunks=: the user's, as given
        grouped = _grouping(kernel.__name__, hazards, params, arrays, out_chunks, group,
                            cluster, group_bytes,
                            None if group_spread is None else group_spread(cluster),
                            layout_warning)
    deepened = _deep_enough(grouped or out_chunks, depth, boundary, ndim, layer)
    if deepened is not None:
        grouped = deepened
        if user_chunks == out_chunks:  # halos need deeper chunks: those are the user's
            user_chunks = deepened
    if grouped is not None:
        aligned = _regrouped(layer, arrays, aligned, grouped)
        out_chunks = grouped
        params, results = plan_params(kernel.__name__, image, roles, arrays, out_chunks,
                                      simulate, flat)
    check_dtype(kernel.__name__, results, dtype)
    timeout = check_timeout(timeout)
    prefix = None
    if name is None:  # as da.map_blocks: name= is the full key name, token= its prefix
        from dask.base import tokenize

        prefix = str(token or kernel.__name__)
        # The launch layout, not group= as given: one call makes other launches under
        # another daskgpu.launch-bytes or beside GPUs that offer less memory.
        name = f"{prefix}-" + tokenize(
            image.hash, kernel.__name__, args, depth, boundary, int(tpb), rank, simulate,
            timeout, out_chunks, user_chunks)
    returns = tuple(
        Returned(r.index, r.dtype, params[r.index].param,
                 params[r.index].source if isinstance(params[r.index].source, Out) else None)
        for r in results)
    return MapPlan(kernel.__name__, ship, rank, int(tpb), params, returns, tuple(arrays),
                   tuple(aligned), out_chunks, depth, boundary, str(name), prefix, timeout, cluster,
                   split_every, _meta_base(arrays), user_chunks, hazards)


def _deep_enough(chunks, depth, boundary, ndim, layer):
    """``chunks`` with every chunk at least as deep as the halo on its axis, where one is
    not, as ``da.map_overlap`` rechunks (dask's ``ensure_minimum_chunksize``); None when
    every chunk is, or the halo is one :func:`~.api._halo` refuses (a depth that is not a
    non-negative integer, or deeper than the whole axis)."""
    from numbers import Integral

    from dask.array.overlap import ensure_minimum_chunksize

    if depth is None:
        return None
    halo, _ = layer.coerce_halo(ndim, depth, boundary)
    deepened = list(chunks)
    for ax, d in halo.items():
        if not isinstance(d, Integral) or d <= 0 or not chunks[ax] or d <= min(chunks[ax]):
            continue
        if d > sum(chunks[ax]):
            return None
        deepened[ax] = ensure_minimum_chunksize(int(d), chunks[ax])
    return tuple(deepened) if deepened != list(chunks) else None


def _check_flat_halo(kernel_name, depth, ndim):
    """Refuse halos for a kernel that sees N-D chunks flat: it cannot find its neighbours."""
    if depth is not None and any(
            depth.values() if isinstance(depth, dict) else np.atleast_1d(depth).tolist()):
        raise ValueError(
            f"kernel {kernel_name!r} indexes its {ndim}-D chunks flat (a rank-1 kernel), so "
            f"it cannot find a halo's neighbours (depth={depth!r}); write it over cuda.grid("
            f"{ndim}) with {ndim}-D arrays, or map without depth"
        )


def _meta_base(arrays):
    for a in arrays:
        meta = a.meta if isinstance(a, Out) else a._meta
        if meta is not None and is_cupy(meta):
            return meta
    return None


# -- launches sized for the GPU ---------------------------------------------------

def _grouping(kernel_name, hazards, params, arrays, chunks, group, cluster, group_bytes=None,
              spread=None, warn=True):
    """The groups the map launches over, or None for one launch per chunk.

    With ``group`` None (the default), chunks are grouped only where the kernel's
    results cannot depend on where a launch begins or ends (no ``hazards``); where they
    might, and grouping would have cut the launches at least fourfold, a
    ``PerformanceWarning`` says why and how to group anyway (``group=True``).
    """
    per_element, fixed = launch_footprint(params, arrays)
    grouped = group_chunks(chunks, per_element, launch_bytes(group, cluster, group_bytes),
                           fixed=fixed, min_groups=least_groups(
                               group, cluster.threads if spread is None else spread))
    if grouped is None or group is not None or not hazards:
        return grouped
    launches, groups = math.prod(len(c) for c in chunks), math.prod(len(g) for g in grouped)
    if warn and launches >= 4 * groups:
        warn_per_chunk(kernel_name, hazards, launches, groups)
    return None


def _role(param, flat_nd) -> Any:
    """A kernel parameter's role in the map, as the grouping rule reads it."""
    if isinstance(param, (ChunkParam, OutParam, StatesParam)):
        return MAPPED
    if isinstance(param, OffsetParam):
        # A flat launch over N-D chunks has no position per axis to add it to.
        return ("offset", param.axis) if not flat_nd else "offset of an N-D chunk"
    return "value" if isinstance(param, ValueParam) else "whole"


def warn_per_chunk(kernel_name, hazards, launches, groups, fix="pass group=True"):
    """Say once (per call site) that a map launches per chunk where grouping would have
    cut its launches, why, and ``fix``."""
    from dask.array.core import PerformanceWarning

    more = f" (and {len(hazards) - 1} more)" if len(hazards) > 1 else ""
    warnings.warn(PerformanceWarning(
        f"map_kernel launches {kernel_name!r} once per chunk ({launches:,} launches, where "
        f"launches sized for the GPU would be {groups:,}): daskgpu cannot show that its "
        f"results do not depend on where a launch begins or ends, since it {hazards[0]}"
        f"{more}. If they do not, {fix} to launch the chunks in groups; group=False keeps "
        "one launch per chunk and silences this"), stacklevel=user_level())


def user_level() -> int:
    """The stack level of the first frame outside daskgpu: the user's call."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("daskgpu."):
        frame, level = frame.f_back, level + 1
    return level


def _halo_of(layer, ndim, depth, boundary) -> tuple:
    """The halo's depth per axis (zeros without one) and whether each axis's array edges
    are padded too (a boundary other than ``"none"``)."""
    if depth is None:
        return (0,) * ndim, (False,) * ndim
    from numbers import Integral

    depths, boundaries = layer.coerce_halo(ndim, depth, boundary)
    return (tuple(int(depths.get(ax, 0)) if isinstance(depths.get(ax, 0), Integral) else 0
                  for ax in range(ndim)),
            tuple(boundaries.get(ax, "none") != "none" for ax in range(ndim)))


def launch_footprint(params, arrays) -> tuple:
    """``(per element, fixed)``: the device bytes a launch needs per element of its block
    (its chunks copied in, aligned outputs, random states) and whatever its size (arrays
    passed whole, per-chunk outputs). CuPy chunks are on the device already."""
    per_element = fixed = 0
    for a in arrays:
        if not isinstance(a, Out) and not is_cupy(a._meta):
            per_element += np.dtype(a.dtype).itemsize
    for param, source in params:
        if isinstance(param, OutParam):
            per_element += np.dtype(param.dtype).itemsize
        elif isinstance(param, StatesParam):
            per_element += STATE_DTYPE.itemsize
        elif isinstance(param, PerChunkParam):
            fixed += math.prod(param.shape) * np.dtype(param.dtype).itemsize
        elif isinstance(param, WholeParam) and not is_cupy(source):
            fixed += int(getattr(source, "nbytes", 0))
    return per_element, fixed


def _members(user, grouped) -> list:
    """How many of the ``user`` chunks each of the ``grouped`` ones holds (one axis)."""
    counts, it = [], iter(user)
    for g in grouped:
        n = total = 0
        while total < g:
            total += next(it)
            n += 1
        counts.append(n)
    return counts or [1]


def _may_group(params, ndim) -> bool:
    """Whether results stay the same when chunks are grouped: no per-chunk output that
    keeps one element per block (without ``combine=`` over every mapped axis)."""
    from daskgpu._dask.map_kernel.reduction import mapped_axes

    for param, source in params:
        if isinstance(param, PerChunkParam):
            if source.fold is None or mapped_axes(source.axis, ndim) != tuple(range(ndim)):
                return False
    return True


def _regrouped(layer, arrays, aligned, grouped) -> list:
    """Each of ``aligned`` over the ``grouped`` chunks; an array passed several times
    (``saxpy(out, a, x, x)``) is regrouped once, its pieces read or joined once.

    An array is regrouped from itself as given (``arrays``), not from its copy with
    unified chunks: one of two ``da.from_array`` inputs chunked differently then still
    reads the groups' pieces, where its unified copy, a rechunk, would be joined.
    """
    done, regrouped = {}, []
    for given, a in zip(arrays, aligned):
        source = a if isinstance(given, Out) or given.chunks == a.chunks else given
        chunks = _right_aligned(grouped, a)
        if (source.name, chunks) not in done:
            done[source.name, chunks] = layer.regroup(source, chunks)
        regrouped.append(done[source.name, chunks])
    return regrouped


def _right_aligned(grouped, array) -> tuple:
    """``grouped`` for ``array``'s axes (the last of the mapped ones), keeping the size-1
    axes it is broadcast along."""
    own = grouped[len(grouped) - array.ndim:]
    return tuple(c if n != 1 else (1,) for c, n in zip(own, array.shape))
