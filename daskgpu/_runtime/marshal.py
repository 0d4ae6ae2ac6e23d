"""Kernel parameters as Numba's data model lays them out, packed into one buffer.

Numba flattens every kernel argument into PTX parameters: an array of rank n
becomes ``meminfo, parent, nitems, itemsize, data, shape[n], strides[n]`` (all
64-bit), a complex scalar becomes two floats, a bool one byte. The layout of an
image's parameters is computed once; each launch packs its values into a
reusable buffer whose parameter addresses go to ``cuLaunchKernel`` unchanged.

A record passed by value is, in Numba's data model, a pointer to its bytes: the
launcher copies the record to the device and passes that address (64-bit), as
numba-cuda's dispatcher does. datetime64 and timedelta64 are int64 counts.

Repeat launches on device arrays use a function generated per shape of
signature (:func:`fast_source`): its matching and packing is straight-line
code, one ``pack_into`` call with the values as arguments, with no loop,
list or dictionary per launch. On the H200 host this Python work takes about
1.5 us a launch (3 CuPy arrays), beside 3.5 us in ``cuLaunchKernel`` itself.
"""

from __future__ import annotations

import math
import struct
import threading

import numpy as np

from daskgpu._image.argspec import BFLOAT16, passed_value
from daskgpu._image.array_info import has_layout

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
        nitems = 1
        for n in shape:
            nitems *= n
        out += (0, 0, nitems, itemsize, ptr)
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


# -- a matcher and packer generated per signature -----------------------------------

def fast_struct(specs) -> struct.Struct:
    """:class:`ParamLayout`'s struct with an array's meminfo and parent pointers (always
    0) as pad bytes, which ``pack_into`` zero-fills: two values fewer to pass per array."""
    fmt, pos = ["="], 0
    for spec in specs:
        for j, code in enumerate(param_codes(spec)):
            size = struct.calcsize("=" + code)
            pad = -pos % size
            if pad:
                fmt.append(f"{pad}x")
                pos += pad
            fmt.append("8x" if spec.is_array and j < 2 else code)
            pos += size
    return struct.Struct("".join(fmt))


#: What a generated launch function is bound to (arguments of its factory), besides
#: the per-parameter constants ``D<i>`` (an array's dtype) and ``S<i>``, ``T<i>``,
#: ``NP<i>``, ``LO<i>``, ``HI<i>`` (a scalar's spec, exact types and range).
FAST_NAMES = (
    "kernel", "state", "device_thread", "local", "layout", "buffers", "pack_into",
    "launch", "function", "stream", "g0", "g1", "g2", "b0", "b1", "b2", "shm",
    "name", "images", "CUPY", "NUMBA", "device_info", "sync_producer", "failed", "SUCCESS",
)


def fast_constants(specs, exact=False) -> dict:
    """The per-parameter constants a generated launch function of ``specs`` needs.

    ``exact``: only the Python type that Numba types as the parameter's own
    dtype is taken as it is (``float`` for float64, ``int`` for int64).
    """
    consts = {}
    for i, spec in enumerate(specs):
        dtype = spec.np_dtype
        if spec.is_array:
            consts[f"D{i}"] = dtype
            continue
        consts[f"S{i}"] = spec
        consts[f"NP{i}"] = dtype.type
        kind = dtype.kind
        # A value of this Python type (or NP) fits, and packs as it is.
        if kind == "f":
            exact_type = float if not exact or dtype == np.float64 else None
        elif kind in "iu":
            exact_type = int if not exact or dtype == np.int64 else None
        elif kind == "c":
            exact_type = complex if dtype == np.complex128 else None
        else:
            exact_type = bool if kind == "b" else None
        consts[f"T{i}"] = exact_type
        if kind in "iu":
            info = np.iinfo(dtype)
            consts[f"LO{i}"], consts[f"HI{i}"] = int(info.min), int(info.max)
    return consts


def fast_source(specs, writes, exact=False) -> str:
    """Python source of the factory of a launch function for one shape of signature.

    The function matches each argument against its spec, packs the flattened
    values into this thread's parameter buffer with one ``pack_into`` and
    launches; what it does not cover returns ``NotImplemented``. Arrays of the
    CuPy or Numba device array type it is bound to are read by their own
    attributes (building their ``__cuda_array_interface__`` dictionary costs
    more than the rest of a launch), others through ``device_info``; scalars of
    the exact types take no further check.

    Without ``exact`` it takes what the spec :meth:`~ArgSpec.matches`, right
    while the kernel has this one image (``images``, its container, is
    checked on every call). With ``exact`` it takes only what needs no
    conversion at all, which the first of several images is picked for.
    """
    names = [f"v{i}" for i in range(len(specs))]
    consts = list(FAST_NAMES) + list(fast_constants(specs, exact))
    body, packed = [], []
    for i, spec in enumerate(specs):
        v = names[i]
        if spec.is_array:
            itemsize = spec.np_dtype.itemsize
            body += [
                f"if type({v}) is CUPY:",
                f"    shape{i} = {v}.shape; strides{i} = {v}.strides",
                f"    dtype{i} = {v}.dtype; ptr{i} = {v}.data.ptr",
                f"elif type({v}) is NUMBA:",
                f"    shape{i} = {v}.shape; strides{i} = {v}.strides",
                f"    dtype{i} = {v}.dtype; ptr{i} = {v}.device_ctypes_pointer.value or 0",
                f"    if {v}.stream != 0:  # bound to a stream: wait for it, as Numba does",
                f"        sync_producer({v})",
                "else:",
                f"    info = device_info({v})",
                "    if info is None:",
                "        return NotImplemented",
                f"    dtype{i}, shape{i}, strides{i}, ptr{i} = info",
                f"if dtype{i} is not D{i} and dtype{i} != D{i}:",
                "    return NotImplemented",
            ]
            if spec.ndim == 1:
                check = f"len(shape{i}) != 1"
                if spec.layout != "A":  # C or F: the element stride, unless at most one
                    check += f" or (strides{i}[0] != {itemsize} and shape{i}[0] > 1)"
                packed += [f"shape{i}[0]", str(itemsize), f"ptr{i}",
                           f"shape{i}[0]", f"strides{i}[0]"]
            else:
                check = f"len(shape{i}) != {spec.ndim}"
                if spec.layout != "A":
                    check += (f" or not has_layout(shape{i}, strides{i}, {itemsize}, "
                              f"{spec.layout!r})")
                packed += [f"_prod(shape{i})", str(itemsize), f"ptr{i}",
                           f"*shape{i}", f"*strides{i}"]
            body += [f"if {check}:", "    return NotImplemented"]
            continue
        kind = spec.np_dtype.kind
        two = kind == "c"  # a complex scalar is two parameters
        convert = (f"x{i}, y{i} = _scalar_values(S{i}, {v})" if two
                   else f"(x{i},) = _scalar_values(S{i}, {v})")
        if kind in "iuf" and not spec.enum:  # an enum member goes through matches()
            fast = f"type({v}) is NP{i} or type({v}) is T{i}"
            if kind in "iu":
                fast = f"type({v}) is NP{i} or (type({v}) is T{i} and LO{i} <= {v} <= HI{i})"
            body += [f"if {fast}:", f"    x{i} = {v}"]
            if exact:
                body += ["else:", "    return NotImplemented"]
            else:
                body += ["else:", f"    if not S{i}.matches(None, {v}):",
                         "        return NotImplemented", "    " + convert]
        else:
            check = f"S{i}.matches(None, {v})"
            if exact:
                check = f"(type({v}) is NP{i} or type({v}) is T{i}) and {check}"
            body += [f"if not ({check}):", "    return NotImplemented", convert]
        packed += [f"x{i}", f"y{i}"] if two else [f"x{i}"]
    if not writes:
        result = "None"
    elif len(writes) == 1:
        result = names[writes[0]]
    else:
        result = "(" + ", ".join(names[i] for i in writes) + ",)"
    if names:
        unpack = [
            "try:",
            f"    {', '.join(names)}{',' if len(names) == 1 else ''} = args",
            "except ValueError:  # another number of arguments",
            "    return NotImplemented",
        ]
    else:
        unpack = ["if args:", "    return NotImplemented"]
    lines = [
        f"def make({', '.join(consts)}):",
        "    def fast(args):",
        "        try:",
        "            data, address = local.bufs",
        "        except AttributeError:  # this thread's first call",
        "            if getattr(device_thread, 'state', None) is not state:",
        "                return NotImplemented  # another device: the general path",
        "            data, address = local.bufs = buffers()",
        *([] if exact else [
            "        if len(images) != 1:  # compiled another since: the general path picks",
            "            return NotImplemented",
        ]),
        *["        " + line for line in unpack + body],
        f"        pack_into(data, 0, {', '.join(packed)})",
        "        err = launch(function, g0, g1, g2, b0, b1, b2, shm, stream, address, 0)[0]",
        "        if err is not SUCCESS and err != SUCCESS:",
        "            failed(err, name)",
        f"        return {result}",
        "    return fast",
    ]
    return "\n".join(lines) + "\n"


class FastFactories:
    """Compiled factories of :func:`fast_source`, keyed by the source text.

    One source serves every kernel whose signature has the same shape, so
    compiling (about 0.1 ms) happens once per shape, not per launch object.
    A full cache starts afresh, which is safe while other threads read it.
    """

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self._entries: dict = {}
        self._lock = threading.Lock()

    def get(self, source: str):
        make = self._entries.get(source)
        if make is None:
            namespace = {"has_layout": has_layout, "_prod": math.prod,
                         "_scalar_values": _scalar_values}
            exec(compile(source, "<daskgpu launch>", "exec"), namespace)  # noqa: S102
            make = namespace["make"]
            with self._lock:
                if len(self._entries) >= self.maxsize:
                    self._entries.clear()
                self._entries[source] = make
        return make

    def clear(self):
        with self._lock:
            self._entries.clear()


def _scalar_values(spec, value) -> list:
    values = []
    flatten(spec, value, values)
    return values
