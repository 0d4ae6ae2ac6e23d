"""``map_kernel``'s ``da.map_blocks`` keywords: what each means for a launch, checked.

``dtype=`` and ``meta=`` complete outputs that give no dtype (``meta=`` also
their array type), ``dg.Out()`` without a shape takes the mapped arrays'
broadcast shape, and ``chunks=`` is checked against the chunks each launch
fills. ``drop_axis=`` and ``new_axis=`` are refused in one line that names
what does the same with a launch: a per-chunk output and ``axis=``.
"""

from __future__ import annotations

import numpy as np

from daskgpu._dask.map_kernel.arg_kinds import check_array
from daskgpu._dask.map_kernel.arguments import Out, known_dtype
from daskgpu._dask.map_kernel.arrays import is_cupy

__all__ = ["check_axis_changes", "check_chunks", "check_dtype", "check_meta", "output_dtype",
           "resolve_outs"]


def check_axis_changes(drop_axis, new_axis):
    """Refuse ``drop_axis=`` / ``new_axis=``, saying what does that in ``map_kernel``."""
    if drop_axis is not None:
        raise ValueError(
            f"map_kernel takes no drop_axis={drop_axis!r}: an aligned dg.Out has the mapped "
            "chunks' axes, since each launch fills its chunk's elements. To reduce along "
            "an axis, give a per-chunk output and combine it along that axis: "
            "dg.Out(dtype, per_chunk=shape, combine='sum', axis=...)"
        )
    if new_axis is not None:
        raise ValueError(
            f"map_kernel takes no new_axis={new_axis!r}: an aligned dg.Out has the mapped "
            "chunks' axes. For an output with axes of its own, one block per launch, use "
            "dg.Out(dtype, per_chunk=shape): its axes follow the mapped ones"
        )


def output_dtype(dtype, meta):
    """The outputs' dtype from ``map_kernel``'s ``dtype=``, else ``meta=``'s; None if neither."""
    if meta is not None and not (isinstance(meta, np.ndarray) or is_cupy(meta)):
        raise TypeError(
            f"map_kernel(meta=...) takes a NumPy or CuPy array (as np.empty((0,), dtype)), "
            f"got {type(meta).__name__}"
        )
    if dtype is not None:
        try:
            return np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"map_kernel got dtype={dtype!r}, which numpy cannot read: "
                            f"{exc}") from None
    return None if meta is None else np.dtype(meta.dtype)


def resolve_outs(args, dtype, meta) -> tuple:
    """``args`` with every :class:`Out` completed: ``dtype``, the mapped shape and ``meta``."""
    import dask.array as da

    for pos, a in enumerate(args):
        if isinstance(a, da.Array):  # before its shape is read: it may be unknown
            check_array(a, pos)
    outs = [a for a in args if isinstance(a, Out)]
    if not outs:
        return args
    shaped = [a.shape for a in args if isinstance(a, da.Array)]
    shaped += [o.shape for o in outs if o.pending is None and o.per_chunk is None]
    shape = _mapped_shape(shaped)
    done = []
    for a in args:
        if isinstance(a, Out):
            if a.pending is not None and dtype is None and known_dtype(a) is None:
                raise TypeError(
                    f"map_kernel got {a!r} without a dtype; give it one, dg.Out(np.float32, "
                    "...), or pass dtype= (or meta=) to map_kernel"
                )
            if (a.pending is not None and shape is None and not any(
                    a.pending[k] is not None for k in ("like", "shape", "chunks", "per_chunk"))):
                raise ValueError(
                    f"map_kernel got {a!r} with no dask array to take its shape from; give "
                    "it one: dg.Out(dtype, like=x) or dg.Out(dtype, shape=..., chunks=...)"
                )
            a = a.resolve(dtype, shape, meta)
        done.append(a)
    return tuple(done)


def _mapped_shape(shapes):
    """The shapes broadcast together, as the mapped arrays are; None for no shape."""
    if not shapes:
        return None
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        return None  # _align reports arrays that do not broadcast, with their shapes


def check_meta(meta, arrays):
    """Refuse a NumPy ``meta=`` for CuPy chunks: their outputs are CuPy."""
    import dask.array as da

    if meta is None or is_cupy(meta):
        return
    for a in arrays:
        if isinstance(a, da.Array) and is_cupy(a._meta):
            raise ValueError(
                "map_kernel got a NumPy meta= with CuPy chunks; outputs of CuPy chunks are "
                "CuPy arrays. Give a CuPy meta (cupy.empty((0,), dtype)), or none"
            )


def check_dtype(kernel_name, returns, dtype):
    """Refuse results whose dtype is not ``map_kernel``'s ``dtype=`` (``returns``: Results)."""
    if dtype is None:
        return
    other = sorted({np.dtype(r.dtype).name for r in returns} - {dtype.name})
    if other:
        raise ValueError(
            f"map_kernel got dtype={dtype.name}, but kernel {kernel_name!r} also returns "
            f"{', '.join(other)} (an output that names its own dtype, or a dask input it "
            "writes); drop dtype= or make the dtypes agree"
        )


def check_chunks(chunks, results, returns):
    """Check ``map_kernel``'s ``chunks=`` against the aligned results' chunks.

    ``results`` are the map's arrays and ``returns`` the plan's
    :class:`~daskgpu._dask.map_kernel.plan.Returned`, one each.
    """
    from dask.array.core import normalize_chunks

    aligned = [res for res, r in zip(results, returns) if r.per_chunk is None]
    if not aligned:
        raise ValueError(
            "map_kernel got chunks=, but returns only per-chunk outputs, whose shape per "
            "launch is their per_chunk=; drop chunks="
        )
    for res in aligned:
        try:
            wanted = normalize_chunks(chunks, res.shape, dtype=res.dtype)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"map_kernel got chunks={chunks!r}, which do not fit its output of shape "
                f"{res.shape}: {exc}"
            ) from None
        if wanted != res.chunks:
            raise ValueError(
                f"map_kernel got chunks={chunks!r}, but each launch fills one mapped chunk, "
                f"so its output has chunks {res.chunks}. Rechunk the inputs (x.rechunk(...)), "
                "or drop chunks="
            )
