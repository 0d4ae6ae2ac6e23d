"""Kernel parameters as Numba's data model lays them out, packed into one buffer.

Numba flattens every kernel argument into PTX parameters: an array of rank n
becomes ``meminfo, parent, nitems, itemsize, data, shape[n], strides[n]`` (all
64-bit), a complex scalar becomes two floats, a bool one byte. The layout of an
image's parameters is computed once; each launch packs its values into a
reusable buffer whose parameter addresses go to ``cuLaunchKernel`` unchanged.

A record passed by value is, in Numba's data model, a pointer to its bytes: the
launch copies the record to the device and passes that address (64-bit), as
numba-cuda's dispatcher does. datetime64 and timedelta64 are int64 counts.

Repeat launches on device arrays pack the same bytes by generated code instead
(:mod:`~daskgpu._runtime.gpu.fast_path`).
"""

from __future__ import annotations

import math
import struct
import threading

import numpy as np

from daskgpu._image.argspec import BFLOAT16, passed_value

# struct codes of one scalar parameter (complex: two of them).
_SCALAR_CODES = {
    "bool": "B", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
    "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q",
    "float16": "e", "float32": "f", "float64": "d", BFLOAT16: "H",
    "complex64": "ff", "complex128": "dd",
}


def param_codes(spec) -> str:
    """The struct codes of the PTX parameters one argument spec flattens to."""
    if spec.is_array:
        return "q" * (5 + 2 * spec.ndim)
    if spec.kind == "record":
        return "Q"
    if spec.kind == "tuple":  # numba flattens a tuple into its members' parameters
        return "".join(param_codes(m) for m in spec.members)
    code = _SCALAR_CODES.get(spec.dtype)
    if code is None and spec.dtype.startswith(("datetime64", "timedelta64")):
        return "q"
    return code


class ParamLayout:
    """Where each flattened parameter of an image sits in a packed buffer."""

    def __init__(self, specs):
        self.specs = tuple(specs)
        fmt, offsets, pos = ["="], [], 0
        for spec in self.specs:
            for code in param_codes(spec):
                size = struct.calcsize("=" + code)
                pad = -pos % size  # each parameter at its natural alignment
                if pad:
                    fmt.append(f"{pad}x")
                    pos += pad
                offsets.append(pos)
                fmt.append(code)
                pos += size
        self.format = struct.Struct("".join(fmt))
        self.offsets = tuple(offsets)
        self.size = max(pos, 8)
        self._local = threading.local()

    def buffers(self):
        """This thread's ``(param bytes, pointer array, its address)``, made once per thread.

        ``cuLaunchKernel`` copies parameters when called, so a buffer can be
        reused for the next launch as soon as the call returns.
        """
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            data = np.zeros(self.size, dtype=np.uint8)
            base = data.ctypes.data
            ptrs = np.array([base + o for o in self.offsets] or [0], dtype=np.uint64)
            bufs = self._local.bufs = (data, ptrs, ptrs.ctypes.data)
        return bufs

    def pack(self, values) -> int:
        """Pack flattened ``values``; return the address of the pointer array.

        An integer out of its parameter's range wraps, as numba-cuda's ctypes
        conversion does (an eager kernel takes it as an unsafe cast).
        """
        data, _, address = self.buffers()
        try:
            self.format.pack_into(data, 0, *values)
        except struct.error:  # only then: no cost on launches whose values fit
            self.format.pack_into(data, 0, *_wrapped(values, self.codes))
        return address

    @property
    def codes(self) -> str:
        """The struct code of each flattened parameter, in order."""
        return "".join(param_codes(spec) for spec in self.specs)


def _wrapped(values, codes):
    out = []
    for v, code in zip(values, codes):
        if code in "bBhHiIqQ" and isinstance(v, int) and not isinstance(v, bool):
            bits = 8 * struct.calcsize("=" + code)
            v &= (1 << bits) - 1
            if code.islower() and v >= 1 << (bits - 1):
                v -= 1 << bits
        out.append(v)
    return out


def flatten(spec, value, out: list) -> None:
    """Append the flattened parameter values of one argument to ``out``.

    Arrays come as ``(pointer, shape, strides, itemsize)``; records as the
    device address of their copy; scalars as Python or numpy scalars already
    matched against ``spec``.
    """
    if spec.is_array:
        ptr, shape, strides, itemsize = value
        out += (0, 0, math.prod(shape), itemsize, ptr)
        out += shape
        out += strides
        return
    if spec.kind == "record":
        out.append(value)
        return
    dtype = spec.dtype
    value = passed_value(value)
    if dtype.startswith(("datetime64", "timedelta64")):
        out.append(int(value.view(np.int64)))
    elif dtype.startswith("complex"):
        c = complex(value)
        out += (c.real, c.imag)
    elif dtype == "bool":
        out.append(1 if value else 0)
    elif dtype == BFLOAT16:  # its two bytes as they are: a __nv_bfloat16 parameter
        out.append(int(np.asarray(value).view(np.uint16)))
    elif dtype.startswith("float"):
        out.append(float(value))
    else:
        out.append(int(value))
