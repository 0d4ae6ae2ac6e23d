"""Between Numba's types and daskgpu's :class:`ArgSpec`."""

from __future__ import annotations

import numpy as np
from numba.cuda import types
from numba.cuda.core import sigutils

from daskgpu._errors import CompileError
from daskgpu._image.argspec import ArgSpec, array_info, layout_of


def normalize(sig) -> tuple:
    """Argument types of a signature string, signature object or tuple of types."""
    try:
        args, ret = sigutils.normalize_signature(sig)
    except Exception as exc:
        raise CompileError(
            f"cannot read the signature {sig!r}: {exc}. Write it as Numba does, "
            "e.g. 'void(float32[::1], float32)'."
        ) from exc
    if ret not in (None, types.void, types.none):
        raise CompileError(
            f"a kernel returns nothing, but signature {sig!r} returns {ret}; "
            "write it as 'void(...)' and pass output arrays as arguments"
        )
    return tuple(args)


def to_argspec(typ, position: int, fname: str) -> ArgSpec:
    """The :class:`ArgSpec` of one Numba argument type."""
    if isinstance(typ, types.Array):
        dtype = _dtype_name(typ.dtype, position, fname)
        return ArgSpec("array", dtype, typ.ndim, typ.layout)
    if isinstance(typ, (types.Number, types.Boolean)):
        return ArgSpec("scalar", _dtype_name(typ, position, fname))
    raise CompileError(
        f"parameter {position} of {fname!r} has type {typ}; daskgpu ships kernels whose "
        "parameters are arrays and scalars (bool, ints, floats, complex). Pass other "
        "data as arrays."
    )


def _dtype_name(typ, position, fname) -> str:
    try:
        return np.dtype(str(typ) if str(typ) != "boolean" else "bool").name
    except TypeError:
        raise CompileError(
            f"parameter {position} of {fname!r} has element type {typ}, which has no "
            "numpy dtype daskgpu can marshal"
        ) from None


def typeof_args(args) -> tuple:
    """Numba types for concrete arguments: host or device arrays and scalars."""
    from numba.np import numpy_support

    out = []
    for a in args:
        info = array_info(a)
        if info is not None:
            dtype, shape, strides, _ = info
            nb = numpy_support.from_dtype(dtype)
            out.append(types.Array(nb, len(shape), layout_of(shape, strides, dtype.itemsize)))
        else:
            out.append(_scalar_type(a))
    return tuple(out)


def _scalar_type(a):
    if isinstance(a, (bool, np.bool_)):
        return types.boolean
    if isinstance(a, np.generic):
        from numba.np import numpy_support

        return numpy_support.from_dtype(a.dtype)
    if isinstance(a, int):
        return types.int64
    if isinstance(a, float):
        return types.float64
    if isinstance(a, complex):
        return types.complex128
    raise TypeError(
        f"cannot pass {type(a).__name__} to a kernel; pass numpy or device arrays and "
        "numbers"
    )
