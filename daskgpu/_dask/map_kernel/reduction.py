"""Per-chunk outputs of :func:`~daskgpu.map_kernel` and their cross-chunk combine.

A ``dg.Out(dtype, per_chunk=shape)`` gives each launch its own output of
``shape``; the launch task returns it with ``ndim`` leading axes of length 1,
so the outputs form a dask array of shape ``numblocks + shape``. With
``combine=``, that array is reduced over its leading axes (or the mapped axes
that ``axis=`` names, keeping the others) by ``da.reduction``'s tree
(``split_every`` partials per combine task), each step folding partials
pairwise with one binary function. Partials are whatever the launch made
(NumPy, or CuPy when the chunks are CuPy), and the fold calls the function on
them as they are, so CuPy partials stay on the device.
"""

from __future__ import annotations

import functools
import warnings
from numbers import Integral, Number

import numpy as np

__all__ = ["COMBINES", "check_axis", "check_combine", "check_fill", "combine_partials",
           "default_fill", "mapped_axes"]

#: The combines named by a string, and the ufuncs they stand for.
COMBINES = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def check_combine(combine):
    """The binary function ``f(a, b) -> array`` for a ``combine=`` value, or TypeError."""
    if isinstance(combine, str):
        fn = COMBINES.get(combine)
        if fn is None:
            raise ValueError(
                f"dg.Out(combine={combine!r}) is not a combine daskgpu knows; use one of "
                f"{sorted(COMBINES)}, a NumPy ufunc of two inputs (np.add, np.maximum, ...), "
                "or a function f(a, b) -> array"
            )
        return fn
    if isinstance(combine, np.ufunc):
        if combine.nin != 2 or combine.nout != 1:
            raise TypeError(
                f"dg.Out(combine=np.{combine.__name__}) takes {combine.nin} inputs and gives "
                f"{combine.nout} outputs; a combine takes two partial results and gives one "
                "(np.add, np.maximum, ...)"
            )
        return combine
    if callable(combine):
        return combine
    raise TypeError(
        f"dg.Out(combine=...) takes 'sum', 'prod', 'min', 'max', a NumPy ufunc or a function "
        f"f(a, b) -> array, got {type(combine).__name__} {combine!r}"
    )


def check_axis(axis) -> tuple:
    """``dg.Out(axis=...)`` as a tuple of ints; TypeError for anything else."""
    axes = (axis,) if isinstance(axis, Integral) else axis
    if not isinstance(axes, (tuple, list)) or not all(isinstance(a, Integral) for a in axes):
        raise TypeError(f"dg.Out(axis=...) takes an int or a tuple of ints, got {axis!r}")
    return tuple(int(a) for a in axes)


def mapped_axes(axis, ndim: int) -> tuple:
    """``axis`` of a per-chunk output as sorted, non-negative axes of an ``ndim``-D map.

    None means every mapped axis. Raises ValueError for an axis out of range or
    given twice.

    Examples
    --------
    >>> mapped_axes((-1,), 3), mapped_axes(None, 2)
    ((2,), (0, 1))
    """
    if axis is None:
        return tuple(range(ndim))
    if any(not -ndim <= a < ndim for a in axis) or len({a % ndim for a in axis}) != len(axis):
        raise ValueError(
            f"dg.Out(axis={axis!r}) names mapped axes of this {ndim}-D map: give distinct "
            f"axes in {-ndim}..{ndim - 1}"
        )
    return tuple(sorted(a % ndim for a in axis))


def default_fill(combine, dtype: np.dtype):
    """The identity each launch's output starts from when ``fill=`` is not given.

    0 for ``"sum"`` and for no combine, 1 for ``"prod"``, the dtype's largest
    value (``inf`` for floats) for ``"min"`` and its smallest for ``"max"``; a
    ufunc's own identity where it has one; else 0.
    """
    fn = COMBINES.get(combine, combine) if isinstance(combine, str) else combine
    if fn is np.minimum or fn is np.maximum or fn is np.fmin or fn is np.fmax:
        low = fn is np.maximum or fn is np.fmax
        if dtype.kind == "f":
            return -np.inf if low else np.inf
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return info.min if low else info.max
        if dtype.kind == "b":
            return not low
    if isinstance(fn, np.ufunc) and fn.identity is not None:
        return fn.identity
    return 0


def check_fill(fill, dtype: np.dtype):
    """``fill`` as a scalar of ``dtype``; ValueError when the dtype cannot hold it.

    Integers and booleans must be held exactly; a float fill may round (0.1 in
    float32) but not overflow to infinity.
    """
    if isinstance(fill, np.ndarray) or not isinstance(fill, (Number, np.generic)):
        raise TypeError(f"dg.Out(fill=...) takes a number, got {type(fill).__name__} {fill!r}")
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = np.array(fill).astype(dtype)[()]
            if dtype.kind == "f":
                fits = np.isreal(fill) and (np.isfinite(value) or not np.isfinite(fill))
            elif dtype.kind == "c":
                fits = bool(np.isfinite(value) or not np.isfinite(fill))
            else:  # integers and booleans: exactly
                fits = np.isreal(fill) and bool(value == fill)
    except (TypeError, ValueError, OverflowError):
        fits = False
    if not fits:
        held = ""
        if dtype.kind in "iu":
            held = f" (range {np.iinfo(dtype).min}..{np.iinfo(dtype).max})"
        raise ValueError(
            f"dg.Out(fill={fill!r}) does not fit dtype {dtype.name}{held}; give a fill "
            "that the output's dtype holds, or choose another dtype"
        )
    return value


def _fold(partials, axis, keepdims, fn, dtype):
    """Fold the partials along ``axis`` pairwise with ``fn``; CuPy stays CuPy."""
    axis = tuple(sorted(axis))
    kept = tuple(ax for ax in range(partials.ndim) if ax not in axis)
    moved = partials.transpose(axis + kept)
    rest = moved.shape[len(axis):]
    flat = moved.reshape((-1,) + rest)
    result = functools.reduce(fn, (flat[i] for i in range(flat.shape[0])))
    if getattr(result, "shape", None) != tuple(rest):
        raise ValueError(
            f"the combine {getattr(fn, '__name__', fn)!r} of per-chunk outputs of shape "
            f"{tuple(rest)} returned {type(result).__name__} of shape "
            f"{getattr(result, 'shape', None)}; it must return an array of the same shape"
        )
    if result.dtype != dtype:
        result = result.astype(dtype)
    if keepdims:
        return result.reshape(tuple(1 if ax in axis else n for ax, n in enumerate(partials.shape)))
    return result


def _as_partial(x, axis, keepdims):
    return x  # each block of the per-chunk array already is one partial


def combine_partials(partials, ndim, fn, split_every=None, name=None, axis=None):
    """Reduce ``partials`` (shape ``numblocks + shape``) over mapped axes ``axis``.

    ``axis``: sorted non-negative mapped axes (:func:`mapped_axes`); None for
    all ``ndim`` of them. The other mapped axes stay, one element per block.
    """
    import dask.array as da

    fold = functools.partial(_fold, fn=fn, dtype=partials.dtype)
    return da.reduction(
        partials, _as_partial, fold, combine=fold,
        axis=tuple(range(ndim)) if axis is None else tuple(axis),
        keepdims=False, dtype=partials.dtype, split_every=split_every, name=name,
        concatenate=True, meta=partials._meta,
    )
