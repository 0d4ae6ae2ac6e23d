"""What ``map_kernel`` asks of a graph layer: :class:`GraphLayer`, a Protocol mypy checks.

``map_kernel`` builds a map's plan (:mod:`daskgpu._dask.map_kernel.plan`) and
its tasks (:mod:`daskgpu._dask.map_kernel.api`) through these questions
only; each of Dask's array graph layers answers them in its own module
(:mod:`.hlg`, :mod:`.expr`), as Dask's array expressions implement
``ArrayExpr``. What both answer alike (``da.blockwise`` and the reduction tree
are both layers' own) is written here once, and each layer inherits it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

__all__ = ["GraphLayer"]


class GraphLayer(Protocol):
    """A graph layer ``map_kernel`` builds on: HighLevelGraph or array expressions.

    Examples
    --------
    >>> from daskgpu._dask.map_kernel.graphs.hlg import HLGLayer
    >>> layer: GraphLayer = HLGLayer()
    >>> layer.name
    'hlg'
    """

    #: The layer's short name, as tests and errors name it.
    name: ClassVar[str]

    def align(self, arrays: list, ndim: int) -> tuple[list, tuple]:
        """Unify the chunks of ``arrays`` (dask arrays and ``Out`` placeholders) as
        ``da.blockwise`` does: the aligned arrays and the chunks per mapped axis."""
        ...

    def regroup(self, array: Any, chunks: tuple) -> Any:
        """``array`` with larger ``chunks``, each a run of whole chunks: read in the
        larger pieces where it can be, else rechunked."""
        ...

    def overlap(self, arrays: list, depth: Any, boundary: Any) -> list:
        """``arrays`` with halos of ``depth``, as ``da.overlap`` gives them."""
        ...

    def trim(self, result: Any, depth: Any, boundary: Any) -> Any:
        """``result`` with its halos cut off again."""
        ...

    def coerce_halo(self, ndim: int, depth: Any, boundary: Any) -> tuple[dict, dict]:
        """``depth`` and ``boundary`` per axis, as Dask's overlap reads them."""
        ...

    def launches(self, fn: Any, task_args: list, places: Any, name: str, meta: Any,
                 per_chunk: tuple | None = None, token: str | None = None) -> Any:
        """The launch layer: ``fn`` (the map's launch) per block on its arguments'
        blocks and its place, as one array; ``per_chunk`` adds one block of that shape
        per launch; ``token`` (no ``name=`` given) prefixes a name of the layer's own."""
        ...

    def select(self, launched: Any, i: int, name: str, meta: Any,
               per_chunk: tuple | None = None) -> Any:
        """Result ``i`` of each launch of a map that returns several, named ``name``:
        aligned with the blocks, or one block of ``per_chunk`` per launch."""
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

    def combine(self, partials: Any, ndim: int, fold: Any, split_every: Any, name: str,
                axis: Any) -> Any:
        """The per-chunk outputs ``partials`` combined across chunks by ``fold``, in
        Dask's reduction tree."""
        from daskgpu._dask.map_kernel import reduction

        return reduction.combine_partials(partials, ndim, fold, split_every, name=name,
                                          axis=axis)
