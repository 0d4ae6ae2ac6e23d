"""One :func:`~daskgpu.map_kernel` call, planned once on the client: :class:`MapPlan`.

:func:`plan_map` validates the call's arguments and keywords, selects the
kernel image, plans every kernel parameter and unifies the chunks; what it
returns is all that the graph builders (:mod:`.graph_hlg`, :mod:`.graph_expr`),
the reductions and the checks read, so none of them re-derives it.
"""

from __future__ import annotations

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
             new_axis=None, timeout=None, align) -> MapPlan:
    """Validate a ``map_kernel`` call and plan it (see :class:`MapPlan`).

    ``align(arrays, ndim)`` unifies the chunks of the dask arrays and
    :class:`Out` placeholders as the graph layer in use does, returning
    ``(aligned, out_chunks)``.
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
    aligned, out_chunks = align(arrays, ndim)
    params, results = plan_params(kernel.__name__, image, roles, arrays, out_chunks, simulate,
                                  flat)
    check_dtype(kernel.__name__, results, dtype)
    timeout = check_timeout(timeout)
    prefix = None
    if name is None:  # as da.map_blocks: name= is the full key name, token= its prefix
        from dask.base import tokenize

        prefix = str(token or kernel.__name__)
        name = f"{prefix}-" + tokenize(
            image.hash, kernel.__name__, args, depth, boundary, int(tpb), rank, simulate,
            timeout)
    returns = tuple(
        Returned(r.index, r.dtype, params[r.index].param,
                 params[r.index].source if isinstance(params[r.index].source, Out) else None)
        for r in results)
    return MapPlan(kernel.__name__, ship, rank, int(tpb), params, returns, tuple(arrays),
                   tuple(aligned), out_chunks, depth, boundary, str(name), prefix, timeout, cluster,
                   split_every, _meta_base(arrays))


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
