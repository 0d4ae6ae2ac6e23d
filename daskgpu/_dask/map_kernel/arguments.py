"""The placeholders a user passes to :func:`~daskgpu.map_kernel` among a kernel's arguments.

:class:`Out` stands for an output allocated per chunk on the worker (aligned
with the chunks, or one per launch and optionally combined across chunks);
:data:`offset` for the chunk's global start index. What each argument is,
and the kernel parameters it becomes, is its kind's
(:mod:`daskgpu._dask.map_kernel.arg_kinds`); :mod:`daskgpu._dask.map_kernel.keywords` checks
the ``map_blocks`` keywords that complete or constrain the outputs.
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np

from daskgpu._dask.map_kernel import reduction
from daskgpu._dask.map_kernel.arrays import array_module, is_cupy, native_fix

__all__ = ["Out", "mapped_rank", "offset", "unknown_sizes"]


class _Offset:
    """``dg.offset``: stands for a chunk's global start index in :func:`~daskgpu.map_kernel`.

    Each occurrence expands to one ``int64`` kernel parameter per array
    dimension, in axis order: a 1-D map passes one ``int64``, a 2-D map two
    (row, column). The value is the global index of element 0 of the chunk the
    kernel sees; with ``depth`` that is the start of the extended chunk
    (negative at the lower edge unless ``boundary="none"``).

    Examples
    --------
    >>> import daskgpu as dg, pickle
    >>> dg.offset
    daskgpu.offset
    >>> pickle.loads(pickle.dumps(dg.offset)) is dg.offset
    True
    """

    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self):
        return "offset"  # pickled by reference to the module-level singleton

    def __repr__(self):
        return "daskgpu.offset"

    def __dask_tokenize__(self):
        return "daskgpu.offset"


offset = _Offset()


class Out:
    """An output array of :func:`~daskgpu.map_kernel`, allocated per chunk on the worker.

    Parameters
    ----------
    dtype : numpy dtype, optional
        Element type of the output. Without it, the output takes
        ``map_kernel``'s ``dtype=`` (or its ``meta=``'s dtype).
    like : array, optional
        Take the shape, and for a dask array also the chunks and the array type
        (NumPy or CuPy), from ``like``. It need not be an argument of the kernel.
        Without ``dtype`` here or ``map_kernel``'s ``dtype=``/``meta=``, the
        output also takes ``like``'s dtype, as ``np.empty_like`` does.
    shape : tuple of int, optional
        The shape, when there is no ``like``. Without ``like``, ``shape`` and
        ``chunks``, an aligned output takes the shape of the mapped dask
        arrays (broadcast together, as ``da.map_blocks`` shapes its output).
    chunks : optional
        Dask chunks (anything ``dask.array`` accepts). Default: ``like``'s
        chunks, else one chunk that takes the chunking of the arrays it is
        aligned with.
    per_chunk : int or tuple of int, optional
        Instead of an output aligned with the chunks, give every launch its own
        output of this shape. The result has shape ``numblocks + per_chunk``:
        one block per launch, in chunk order. The launch still covers the
        mapped chunk; per-chunk outputs do not change its size.
    combine : str, ufunc or callable, optional
        With ``per_chunk``: reduce the per-chunk outputs across chunks with a
        tree reduction (``split_every=`` on :func:`~daskgpu.map_kernel`); the result
        has shape ``per_chunk``. ``"sum"``, ``"prod"``, ``"min"``, ``"max"``,
        a NumPy ufunc of two inputs (``np.add``, ``np.maximum``, ...), or a
        function ``f(a, b) -> array`` of two partials. Partials are NumPy, or
        CuPy (and stay on the device) when the chunks are CuPy.
    axis : int or tuple of int, optional
        With ``combine``: the mapped axes to combine along, as ``axis=`` of
        ``da.reduction`` over the array of per-chunk outputs (shape
        ``numblocks + per_chunk``). The result keeps the other mapped axes,
        one element per block: shape ``numblocks`` without ``axis``, then
        ``per_chunk``. Default: every mapped axis.
    fill : number, optional
        With ``per_chunk``: the value each launch's output starts from, which
        must fit ``dtype``. Default: the combine's identity (0 for ``"sum"``,
        1 for ``"prod"``, the dtype's largest value or ``inf`` for ``"min"``,
        its smallest for ``"max"``), else 0.

    Each chunk of an aligned output is allocated zero-filled (NumPy, or CuPy
    when the chunks are CuPy arrays) in the layout the kernel's signature asks
    for.

    Examples
    --------
    >>> import numpy as np, dask.array as da, daskgpu as dg
    >>> x = da.ones(10, chunks=5)
    >>> dg.Out(np.float32, like=x)
    Out(float32, shape=(10,), chunks=((5, 5),))
    >>> dg.Out("int64", shape=(4, 6), chunks=(2, 3))
    Out(int64, shape=(4, 6), chunks=((2, 2), (3, 3)))
    >>> dg.Out(np.int64, per_chunk=256, combine="sum")
    Out(int64, per_chunk=(256,), combine='sum', fill=0)
    >>> dg.Out(np.float64)  # shaped like the mapped arrays
    Out(float64, shape from map_kernel)
    """

    __slots__ = ("dtype", "shape", "chunks", "meta", "per_chunk", "combine", "fill", "fold",
                 "axis", "pending")

    def __init__(self, dtype=None, like=None, shape=None, chunks=None, *, per_chunk=None,
                 combine=None, fill=None, axis=None):
        import dask.array as da
        from dask.array.core import normalize_chunks

        given = {"like": like, "shape": shape, "chunks": chunks, "per_chunk": per_chunk,
                 "combine": combine, "fill": fill, "axis": axis}
        self.dtype = None if dtype is None else _dtype(dtype)
        self.shape = self.chunks = self.meta = self.pending = None
        self.per_chunk = self.combine = self.fill = self.fold = self.axis = None
        if dtype is None or all(v is None for v in given.values()):
            self.pending = given  # completed by map_kernel: Out.resolve
            return
        if per_chunk is not None:
            self._init_per_chunk(per_chunk, like, shape, chunks, combine, fill, axis)
            return
        if combine is not None or fill is not None or axis is not None:
            raise TypeError(
                "dg.Out(combine=..., fill=..., axis=...) applies to per-chunk outputs: write "
                "dg.Out(dtype, per_chunk=shape, combine=..., fill=...)"
            )
        if like is not None:
            if shape is not None:
                raise TypeError("dg.Out takes like= or shape=, not both")
            shape = getattr(like, "shape", None)
            if shape is None:
                raise TypeError(
                    f"dg.Out(like=...) needs an array with a shape, got {type(like).__name__}"
                )
            if isinstance(like, da.Array):
                if chunks is None:
                    chunks = like.chunks
                # Only the array type (CuPy or NumPy) comes from like's meta: its dtype
                # (a record, say) need not cast to ours, and a mask is not an output's.
                if is_cupy(like._meta):
                    self.meta = array_module(True).empty((0,) * len(like.shape), self.dtype)
        elif shape is None:
            raise TypeError(
                "dg.Out needs like= (an array to copy shape and chunks from) or shape= "
                "with its chunks=; without all three it takes the mapped arrays' shape"
            )
        shape = (shape,) if isinstance(shape, Integral) else tuple(shape)
        if any(not isinstance(n, Integral) or n < 0 for n in shape):
            raise ValueError(
                f"dg.Out needs a known, non-negative shape, got {shape!r}; for a dask "
                "array of unknown chunk sizes call x.compute_chunk_sizes() first"
            )
        self.shape = tuple(int(n) for n in shape)
        self.chunks = normalize_chunks(
            self.shape if chunks is None else chunks, self.shape, dtype=self.dtype
        )
        if unknown_sizes(self.chunks):
            raise ValueError(
                "dg.Out needs known chunk sizes; call x.compute_chunk_sizes() on `like` first"
            )

    def _init_per_chunk(self, per_chunk, like, shape, chunks, combine, fill, axis):
        if like is not None or shape is not None or chunks is not None:
            raise TypeError(
                "dg.Out(per_chunk=shape) takes no like=, shape= or chunks=: a per-chunk "
                "output has its own shape, one per launch"
            )
        shape = (per_chunk,) if isinstance(per_chunk, Integral) else tuple(per_chunk)
        if any(not isinstance(n, Integral) or n < 0 for n in shape):
            raise ValueError(
                f"dg.Out(per_chunk=...) needs a non-negative int or tuple of ints, got "
                f"{per_chunk!r}"
            )
        self.shape = self.per_chunk = tuple(int(n) for n in shape)
        self.chunks = tuple((n,) for n in self.shape)
        if combine is not None:
            self.fold = reduction.check_combine(combine)
            self.combine = combine
        if axis is not None:
            if combine is None:
                raise TypeError(
                    f"dg.Out(per_chunk=..., axis={axis!r}) needs combine=: axis= says along "
                    "which mapped axes the per-chunk outputs are combined"
                )
            self.axis = reduction.check_axis(axis)
        if fill is None:
            fill = reduction.default_fill(combine, self.dtype)
        self.fill = reduction.check_fill(fill, self.dtype).item()

    def resolve(self, dtype=None, shape=None, meta=None) -> Out:
        """This output completed with ``map_kernel``'s ``dtype``, mapped ``shape`` and ``meta``.

        An output that gave its own dtype keeps it; one without a shape takes
        ``shape``; ``meta`` (an array of the output's type) applies where the
        output has none of its own (from ``like=``).
        """
        out = self
        if self.pending is not None:
            given = dict(self.pending)
            if not any(given[k] is not None for k in ("like", "shape", "chunks", "per_chunk")):
                given["shape"] = shape
            out = Out(_first_dtype(self.dtype, dtype, given["like"]), **given)
        if meta is not None and out.meta is None and out.per_chunk is None:
            from dask.array.utils import meta_from_array

            done = Out.__new__(Out)
            for slot in Out.__slots__:
                setattr(done, slot, getattr(out, slot))
            done.meta = meta_from_array(meta, len(out.shape), out.dtype)
            out = done
        return out

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __dask_tokenize__(self):
        from dask.base import tokenize

        if self.pending is not None:
            return ("daskgpu.Out", None if self.dtype is None else self.dtype.str,
                    tokenize(self.pending))
        meta = None if self.meta is None else type(self.meta).__module__
        return ("daskgpu.Out", self.dtype.str, self.shape, self.chunks, meta, self.per_chunk,
                None if self.combine is None else tokenize(self.combine), self.fill, self.axis)

    def __repr__(self):
        if self.pending is not None:
            dtype = "dtype from map_kernel" if self.dtype is None else self.dtype.name
            given = ", ".join(f"{k}={v!r}" for k, v in self.pending.items() if v is not None)
            return f"Out({dtype}, {given or 'shape from map_kernel'})"
        if self.per_chunk is not None:
            combine = "" if self.combine is None else f", combine={_combine_name(self.combine)}"
            axis = "" if self.axis is None else f", axis={self.axis}"
            return (f"Out({self.dtype.name}, per_chunk={self.per_chunk}{combine}{axis}, "
                    f"fill={self.fill!r})")
        return f"Out({self.dtype.name}, shape={self.shape}, chunks={self.chunks})"


def _dtype(dtype) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dg.Out got dtype {dtype!r}, which numpy cannot read: {exc}") from None
    if native_fix(dtype) is not None:
        native = dtype.newbyteorder("=")
        raise TypeError(
            f"dg.Out got dtype {dtype.str}, not in this machine's byte order, which kernels "
            f"cannot write; use dg.Out({(native.name if native.fields is None else native)!r}"
            f", ...) and convert the result with .astype({dtype.str!r}) if you need it"
        )
    return dtype


def _combine_name(combine) -> str:
    if isinstance(combine, str):
        return repr(combine)
    if isinstance(combine, np.ufunc):
        return f"np.{combine.__name__}"
    return getattr(combine, "__qualname__", repr(combine))


def unknown_sizes(chunks) -> bool:
    """Whether some of ``chunks`` are unknown (NaN, as after boolean indexing).

    One sum per axis, since NaN carries through it: a check per chunk costs a
    100,000-chunk map a tenth of a second.

    Examples
    --------
    >>> unknown_sizes(((2, 2), (3,))), unknown_sizes(((2, float("nan")),))
    (False, True)
    """
    return any(math.isnan(sum(axis)) for axis in chunks)


def mapped_rank(arrays) -> int:
    """The rank of the mapped chunks: the highest of the arrays', which outputs must have."""
    ndim = max(len(a.shape) for a in arrays)
    for a in arrays:
        if isinstance(a, Out) and a.ndim != ndim:
            raise ValueError(
                f"map_kernel outputs must have the rank of the mapped arrays ({ndim}-D), "
                f"got {a!r}"
            )
    if ndim == 0:
        raise ValueError("map_kernel maps over arrays of at least one dimension")
    return ndim


def known_dtype(out: Out):
    """``out``'s dtype before ``map_kernel`` gives one: its own, or ``like``'s; else None."""
    return _first_dtype(out.dtype, None, (out.pending or {}).get("like"))


def _first_dtype(own, mapped, like):
    """An output's dtype: its own, else ``map_kernel``'s, else ``like``'s (np.empty_like's)."""
    for dtype in (own, mapped, getattr(like, "dtype", None)):
        if dtype is not None:
            return dtype
    return None
