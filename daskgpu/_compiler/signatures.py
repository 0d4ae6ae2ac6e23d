"""Between Numba's types and daskgpu's :class:`ArgSpec`."""

from __future__ import annotations

import enum
from dataclasses import replace

import numpy as np
from numba.cuda import types
from numba.cuda.core import sigutils

from daskgpu._errors import CompileError
from daskgpu._image.argspec import (
    BFLOAT16,
    ArgSpec,
    class_name,
    dtype_code,
    is_bfloat16,
    tuple_code,
)
from daskgpu._image.array_info import array_info, layout_of


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
    if isinstance(typ, types.BaseTuple):
        members = [to_argspec(t, position, fname) for t in typ.types]
        return ArgSpec("tuple", tuple_code(members))
    if isinstance(typ, types.Record):
        return ArgSpec("record", _dtype_name(typ, position, fname))
    if isinstance(typ, types.EnumMember):
        # Numba passes an enum member as its value, of the enum's value type.
        return replace(to_argspec(typ.dtype, position, fname),
                       enum=class_name(typ.instance_class))
    if isinstance(typ, types.CPointer):
        # A raw device address, passed as numba does: one 64-bit integer.
        return ArgSpec("scalar", "uint64")
    if isinstance(typ, (types.Number, types.Boolean, types.NPDatetime, types.NPTimedelta)):
        return ArgSpec("scalar", _dtype_name(typ, position, fname))
    raise CompileError(
        f"parameter {position} of {fname!r} has type {typ}; daskgpu ships kernels whose "
        "parameters are arrays, numbers, bool, datetime64/timedelta64 and records. Pass "
        "other data as arrays."
    )


def _dtype_name(typ, position, fname) -> str:
    from numba.np import numpy_support

    if typ == types.bfloat16:  # numba-cuda's own type: numba has no dtype for it
        return BFLOAT16
    try:
        return dtype_code(numpy_support.as_dtype(typ))
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise CompileError(
            f"parameter {position} of {fname!r} has element type {typ}, which has no "
            f"numpy dtype daskgpu can marshal ({exc})"
        ) from None


def typeof_args(args) -> tuple:
    """Numba types for concrete arguments: host or device arrays and scalars."""
    out = []
    for a in args:
        info = array_info(a)
        if info is not None:
            dtype, shape, strides, _ = info
            if dtype.kind == "V" and dtype.names is None:
                # The CUDA array interface spells records "|V<n>"; the array's
                # own dtype (Numba's device arrays) has the fields.
                own = getattr(a, "dtype", None)
                if isinstance(own, np.dtype) and own.itemsize == dtype.itemsize:
                    dtype = own
            nb = _element_type(dtype)
            out.append(types.Array(nb, len(shape), layout_of(shape, strides, dtype.itemsize)))
        else:
            out.append(_scalar_type(a))
    return tuple(out)


def _element_type(dtype: np.dtype):
    """Numba's type of ``dtype``, numba-cuda's bfloat16 for ``ml_dtypes.bfloat16``."""
    from numba.np import numpy_support

    if is_bfloat16(dtype):
        return types.bfloat16
    if not _native(dtype):  # Numba raises a bare "NumbaNotImplementedError: >f4"
        native = dtype.newbyteorder("=")
        fix = native.name if native.fields is None else native.descr
        raise TypeError(
            f"cannot pass an array of dtype {dtype.str if dtype.fields is None else dtype} "
            f"to a kernel: it is not in this machine's byte order; convert with "
            f".astype({fix!r})"
        )
    return numpy_support.from_dtype(dtype)


def _native(dtype: np.dtype) -> bool:
    """Whether ``dtype`` and all its record fields are in this machine's byte order."""
    if dtype.fields is None:
        base = dtype.subdtype[0] if dtype.subdtype is not None else dtype
        return base.isnative
    return all(_native(f[0]) for f in dtype.fields.values())


def _scalar_type(a):
    if isinstance(a, tuple):
        members = typeof_args(a)
        if hasattr(type(a), "_fields"):  # a namedtuple, typed as numba types it
            return types.NamedTuple(members, type(a)) if len(set(members)) != 1 or not members \
                else types.NamedUniTuple(members[0], len(members), type(a))
        return types.BaseTuple.from_types(members)
    if isinstance(a, enum.Enum):
        from numba.cuda.typing.typeof import Purpose, typeof

        return typeof(a, Purpose.argument)
    if isinstance(a, (bool, np.bool_)):
        return types.boolean
    if isinstance(a, np.generic):
        return _element_type(a.dtype)
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
