"""One :func:`~daskgpu.map_kernel` call, planned once on the client: :class:`MapPlan`.

:func:`plan_map` validates the call's arguments and keywords, selects the
kernel image, plans every kernel parameter and unifies the chunks; what it
returns is all that the graph builders (:mod:`.graph_hlg`, :mod:`.graph_expr`),
the reductions and the checks read, so none of them re-derives it.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskgpu._dask.cluster_facts import ClusterFacts, check_workers_link, cluster_facts
from daskgpu._dask.map_kernel.arg_kinds import Planned, check_extras, classify
from daskgpu._dask.map_kernel.arguments import Out, mapped_rank
from daskgpu._dask.map_kernel.chunk_params import ChunkParam, OutParam, PerChunkParam, is_cupy
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
        Seconds a chunk's task may run (None: the workers' setting).
    cluster : ClusterFacts
        What the current client's workers offer.
    split_every
        For outputs with ``combine=``.
    grouped : bool
        The mapped chunks were grouped into larger launches (:func:`group_chunks`);
        ``out_chunks`` and ``aligned`` are the groups.
    meta_base : array or None
        A CuPy meta when the map's arrays are CuPy, so outputs are too.
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
    grouped: bool = False

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
             new_axis=None, timeout=None, group=None, chunks=None, layer) -> MapPlan:
    """Validate a ``map_kernel`` call and plan it (see :class:`MapPlan`).

    ``layer`` is the graph layer in use (:mod:`.graph_hlg`, :mod:`.graph_expr`):
    its ``align(arrays, ndim)`` unifies the chunks of the dask arrays and
    :class:`Out` placeholders, returning ``(aligned, out_chunks)``, and its
    ``regroup(array, chunks)`` gives an array larger chunks.
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
    grouped = None
    if chunks is None and _may_group(params, ndim):  # chunks=: the user's, as given
        grouped = group_chunks(out_chunks, _bytes_per_element(arrays, aligned, params),
                               launch_bytes(group, cluster))
    deepened = _deep_enough(grouped or out_chunks, depth, boundary, ndim, layer)
    if deepened is not None:
        grouped = deepened
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
        name = f"{prefix}-" + tokenize(
            image.hash, kernel.__name__, args, depth, boundary, int(tpb), rank, simulate,
            timeout, group)
    returns = tuple(
        Returned(r.index, r.dtype, params[r.index].param,
                 params[r.index].source if isinstance(params[r.index].source, Out) else None)
        for r in results)
    return MapPlan(kernel.__name__, ship, rank, int(tpb), params, returns, tuple(arrays),
                   tuple(aligned), out_chunks, depth, boundary, str(name), prefix, timeout, cluster,
                   split_every, _meta_base(arrays), grouped is not None)


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

def launch_bytes(group, cluster: ClusterFacts) -> int:
    """The device memory a grouped launch should cover: ``group`` (``map_kernel``'s
    keyword: None for the ``daskgpu.launch-bytes`` setting, False or 0 for none, True for
    the setting, or a size), at most a quarter of the GPU-memory a worker offers, so that
    grouped launches still share a GPU.

    Examples
    --------
    >>> from daskgpu._dask.cluster_facts import ClusterFacts
    >>> launch_bytes("8 MiB", ClusterFacts()), launch_bytes(False, ClusterFacts())
    (8388608, 0)
    >>> launch_bytes(None, ClusterFacts(gpu_memory=2**24)) == 2**22
    True
    """
    from daskgpu import _config

    if group is None or group is True:
        target = _config.get("launch-bytes")
    elif group is False:
        target = 0
    else:
        try:
            target = _config.SETTINGS["launch-bytes"](group)
        except ValueError as exc:
            raise ValueError(
                f"map_kernel(group={group!r}): {exc}; give True or None (the "
                "daskgpu.launch-bytes setting), False (no grouping) or a size"
            ) from None
    if cluster.gpu_memory:
        target = min(target, cluster.gpu_memory // 4)
    return int(target)


def group_chunks(chunks: tuple, per_element: int, target: int) -> tuple | None:
    """Neighbouring chunks merged (never split) into groups that need about ``target``
    bytes each; None where the chunks are not far smaller than that (the largest block
    needs more than a quarter of it) or grouping is off (``target`` 0).

    Groups grow along the last axis first (a C-ordered block stays contiguous),
    then along earlier ones.

    Examples
    --------
    >>> group_chunks(((256,) * 8,), per_element=8, target=8192)
    ((1024, 1024),)
    >>> group_chunks(((2,) * 4, (3, 3)), per_element=8, target=192)
    ((4, 4), (6,))
    >>> group_chunks(((1000,),), per_element=8, target=8192) is None  # far enough
    True
    """
    if target <= 0 or per_element <= 0 or not chunks or any(not c for c in chunks):
        return None
    largest = math.prod(max(c) for c in chunks) * per_element
    if largest * 4 > target:
        return None
    want = max(1, target // per_element)  # elements a group should hold
    grouped, inner = list(chunks), 1
    for ax in reversed(range(len(chunks))):
        length = max(1, -(-want // inner))  # elements along this axis a group should span
        runs, run = [], 0
        for c in chunks[ax]:
            if run and run + c > length:
                runs.append(run)
                run = 0
            run += c
        runs.append(run)
        grouped[ax] = tuple(runs)
        if len(runs) > 1:  # this axis holds the groups' size: earlier axes stay as they are
            break
        inner *= runs[0]
    grouped = tuple(grouped)
    return None if grouped == tuple(map(tuple, chunks)) else grouped


def _may_group(params, ndim) -> bool:
    """Whether results stay the same when chunks are grouped: no per-chunk output that
    keeps one element per block (without ``combine=`` over every mapped axis)."""
    from daskgpu._dask.map_kernel.reduction import mapped_axes

    for param, source in params:
        if isinstance(param, PerChunkParam):
            if source.fold is None or mapped_axes(source.axis, ndim) != tuple(range(ndim)):
                return False
    return True


def _bytes_per_element(arrays, aligned, params) -> int:
    """Bytes a launch needs per element of its block: its chunks and its outputs."""
    total = sum(np.dtype(a.dtype).itemsize for given, a in zip(arrays, aligned)
                if not isinstance(given, Out))
    total += sum(np.dtype(p.dtype).itemsize for p, _ in params if isinstance(p, OutParam))
    return total


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
