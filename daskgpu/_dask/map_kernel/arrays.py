"""What both halves of a map ask of an array: CuPy or NumPy, and its dtype.

The client's arguments and plan (:mod:`.arguments`, :mod:`.arg_kinds`,
:mod:`.keywords`) and what a task runs on a worker (:mod:`.chunk_params`,
:mod:`.chunk_task`) share these, so that neither side borrows from the other.
"""

from __future__ import annotations

import numpy as np

__all__ = ["array_module", "is_cupy", "native_fix", "plain_dtype"]


def is_cupy(value) -> bool:
    """Whether ``value`` is a CuPy array (told by its type's module: CuPy is not imported)."""
    return type(value).__module__.partition(".")[0] == "cupy"


def array_module(use_cupy: bool):
    """CuPy when ``use_cupy``, else NumPy: the module a chunk's outputs are made with."""
    if use_cupy:
        import cupy

        return cupy
    return np


def plain_dtype(dtype):
    """``dtype`` as its short string, which pickles small, unless that loses record fields."""
    dtype = np.dtype(dtype)
    return dtype.str if dtype.fields is None else dtype


def native_fix(dtype) -> str | None:
    """The ``.astype(...)`` that makes ``dtype`` native, when it is not; else None.

    Examples
    --------
    >>> native_fix(">f4"), native_fix("<f4")
    (".astype('float32')", None)
    """
    dtype = np.dtype(dtype)
    if _native(dtype):
        return None
    native = dtype.newbyteorder("=")
    return f".astype({(native.name if native.fields is None else native.descr)!r})"


def _native(dtype: np.dtype) -> bool:
    if dtype.fields is not None:
        return all(_native(f[0]) for f in dtype.fields.values())
    return (dtype.subdtype[0] if dtype.subdtype is not None else dtype).isnative
