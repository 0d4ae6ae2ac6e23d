"""What a launch reads off each argument at run time: dtype, shape, strides, where it lives.

:func:`array_info` recognises host (numpy) and device arrays (anything with
``__cuda_array_interface__``: CuPy, Numba, PyTorch) without importing their
libraries, and returns an :class:`ArrayInfo`; every other argument gives None.
The layout helpers say whether strides are C- or Fortran-contiguous, as Numba's
layout letters do. An :class:`~daskgpu._image.argspec.ArgSpec` matches these
facts; the runtime marshals them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "ArrayInfo", "CAI_READERS", "READERS", "Zeroed", "array_info", "c_strides", "has_layout",
    "layout_of", "read_cupy",
]


class ArrayInfo(NamedTuple):
    """The facts of one array argument.

    Examples
    --------
    >>> info = array_info(np.zeros((2, 3), np.float32))
    >>> info.shape, info.strides, info.on_host
    ((2, 3), (12, 4), True)
    """

    dtype: np.dtype
    shape: tuple
    strides: tuple
    #: The device pointer; None for a host (numpy) array.
    ptr: int | None

    @property
    def on_host(self) -> bool:
        """Whether the array is in host memory (copied to the device for a launch)."""
        return self.ptr is None


def array_info(value) -> ArrayInfo | None:
    """The :class:`ArrayInfo` of an array argument, else None.

    Device arrays are read through ``__cuda_array_interface__``, so CuPy, Numba
    and PyTorch arrays are recognised without importing them; CuPy's own
    attributes are read directly because building its interface dict costs
    more than the rest of a launch.
    """
    if isinstance(value, np.ndarray):
        return ArrayInfo(value.dtype, value.shape, value.strides, None)
    reader = READERS.get(type(value))
    if reader is None:
        reader = READERS.setdefault(type(value), _reader_for(type(value)))
    return reader(value)


class Zeroed:
    """A host array passed to a launch as a fresh output: on the device it starts
    as zeros instead of being copied in; it is copied back when written.

    ``map_kernel`` wraps the outputs it allocates in this, saving one copy of
    every output chunk to the GPU. A GPU launch may replace ``array`` with a
    page-locked array of the same shape, dtype and layout, which comes back
    from the GPU without a host copy: read the result from ``array`` after.
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


def _read_zeroed(value):
    a = value.array
    return ArrayInfo(a.dtype, a.shape, a.strides, None)


def _read_cai(value):
    cai = value.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    if dtype.kind == "V" and cai.get("descr"):
        dtype = _dtype_from_descr(cai["descr"], dtype)
    shape = tuple(cai["shape"])
    strides = cai.get("strides") or c_strides(shape, dtype.itemsize)
    return ArrayInfo(dtype, shape, tuple(strides), cai["data"][0])


def _dtype_from_descr(descr, plain):
    # numpy's own reader of descr lists, padding fields included.
    try:
        from numpy.lib.format import descr_to_dtype

        dtype = descr_to_dtype([tuple(d) for d in descr])
    except Exception:  # a descr numpy cannot read: the record spec decides by size
        return plain
    return dtype if dtype.itemsize == plain.itemsize else plain


def read_cupy(value) -> ArrayInfo:
    """A CuPy array's facts, from its own attributes."""
    return ArrayInfo(value.dtype, value.shape, value.strides, value.data.ptr)


def _read_nothing(value):
    return None


def _read_instance_cai(value):
    # The interface may be an instance attribute (CAI allows any attribute).
    if hasattr(value, "__cuda_array_interface__"):
        return _read_cai(value)
    return None


def _read_hint(value):
    return array_info(value.value)


def _reader_for(cls):
    if cls.__module__ == "numba.cuda.args" and cls.__name__ in ("In", "Out", "InOut"):
        return _read_hint  # numba-cuda's copy hints: the array they wrap
    if not hasattr(cls, "__cuda_array_interface__"):
        # Instances without a __dict__ (numbers, numpy scalars) cannot carry
        # the interface; others may, one by one.
        return _read_instance_cai if cls.__dictoffset__ else _read_nothing
    if cls.__module__.startswith("cupy") and cls.__name__ == "ndarray":
        return read_cupy
    return _read_cai


#: How to read each argument type seen so far: one entry per Python type. The
#: repeat-launch path reads it to send types it has not seen to the general path.
READERS: dict = {Zeroed: _read_zeroed}

#: The readers of arrays whose interface may name a producer stream to wait for
#: (CuPy's own attributes are read without it).
CAI_READERS = frozenset({_read_cai, _read_instance_cai})


def c_strides(shape, itemsize) -> tuple:
    """The strides of a C-contiguous array of ``shape`` and ``itemsize``.

    Examples
    --------
    >>> c_strides((2, 3), 4)
    (12, 4)
    """
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def layout_of(shape, strides, itemsize) -> str:
    """Numba's layout letter for an array: "C", "F" or "A"."""
    if has_layout(shape, strides, itemsize, "C"):
        return "C"
    return "F" if has_layout(shape, strides, itemsize, "F") else "A"


def has_layout(shape, strides, itemsize, layout) -> bool:
    """Whether an array of ``shape`` and ``strides`` has Numba layout ``layout``."""
    if layout == "A":
        return True
    if len(shape) == 1:  # the common case, on every launch
        return shape[0] <= 1 or strides[0] == itemsize
    if layout == "C":
        return _contiguous(shape, strides, itemsize, reversed(range(len(shape))))
    return _contiguous(shape, strides, itemsize, range(len(shape)))


def _contiguous(shape, strides, itemsize, order) -> bool:
    if 0 in shape:  # an empty array is contiguous in every order, as numpy says
        return True
    step = itemsize
    for axis in order:
        if shape[axis] != 1 and strides[axis] != step:
            return False
        step *= shape[axis]
    return True
