"""Argument specifications: what one kernel parameter accepts, as plain data.

An :class:`ArgSpec` is how a compiled signature describes a parameter without
Numba's type objects, so the worker can match and marshal arguments with numpy
alone.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace

import numpy as np

from daskgpu._image.array_info import array_info, has_layout, layout_of

# Numba spells a few dtypes differently from numpy.
_NUMBA_DTYPE_NAMES = {"bool": "boolean"}

#: The code of numba-cuda's bfloat16, the dtype of ``ml_dtypes.bfloat16`` arrays.
BFLOAT16 = "bfloat16"
#: What :func:`dtype_of` gives for it: two bytes, matched by :func:`dtype_fits`
#: against ml_dtypes' dtype (or an interface's ``"<V2"``) without importing ml_dtypes.
_BFLOAT16_BYTES = np.dtype((np.void, 2))

SCALAR_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 float32 float64 complex64 complex128".split()
)


#: Parameter kinds: arrays (host or device), numbers by value, and records by
#: value (passed as a pointer to a device copy, as Numba does).
KINDS = ("array", "scalar", "record", "tuple")

#: How a tuple's members are spelled in an :class:`ArgSpec`: this prefix, then the
#: JSON list of the members' ``[kind, dtype, ndim, layout]``.
TUPLE_PREFIX = "tuple"

#: How a record dtype is spelled in an :class:`ArgSpec`: this prefix, then JSON.
RECORD_PREFIX = "record"


@dataclass(frozen=True, repr=False)
class ArgSpec:
    """One kernel parameter.

    Parameters
    ----------
    kind : {"array", "scalar", "record", "tuple"}
        "record" is a structured scalar (``np.record``/``np.void``) passed by value;
        "tuple" a tuple, whose members' specs ``dtype`` spells (:func:`tuple_code`).
    dtype : str
        The dtype of the scalar or of the array's elements, as :func:`dtype_code`
        spells it: a numpy dtype name (``"float32"``, ``"datetime64[ns]"``), or
        ``"record"`` followed by the JSON of a structured dtype's fields.
    ndim : int
        Array rank; 0 for scalars.
    layout : {"C", "F", "A"}
        Contiguity the signature requires; "A" takes any strides.
    enum : str
        For an enum member, passed as its value (``dtype``), the enum class as
        ``module.qualname``: Numba types each enum class apart, so a member of
        another class, even of an equal value, is not taken. Empty otherwise.
    """

    kind: str
    dtype: str
    ndim: int = 0
    layout: str = "A"
    enum: str = ""

    def __repr__(self) -> str:
        # Without the enum when there is none: image hashes hold this repr.
        extra = f", enum={self.enum!r}" if self.enum else ""
        return (f"ArgSpec(kind={self.kind!r}, dtype={self.dtype!r}, ndim={self.ndim!r}, "
                f"layout={self.layout!r}{extra})")

    def as_tuple(self) -> tuple:
        """``(kind, dtype, ndim, layout)``, and ``enum`` when set: the plain-data form."""
        base = (self.kind, self.dtype, self.ndim, self.layout)
        return base + (self.enum,) if self.enum else base

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"ArgSpec kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "tuple":
            tuple_members(self.dtype)  # raises for what is not a tuple of specs
            return
        dtype = dtype_of(self.dtype)  # raises for what daskgpu cannot marshal
        if (self.kind == "record") != (dtype.names is not None) and self.kind != "array":
            raise ValueError(
                f"an ArgSpec of kind {self.kind!r} cannot have dtype {self.dtype!r}: records "
                "by value have kind 'record', numbers kind 'scalar'"
            )
        if self.layout not in ("C", "F", "A"):
            raise ValueError(f"ArgSpec layout must be 'C', 'F' or 'A', got {self.layout!r}")

    @property
    def is_array(self) -> bool:
        return self.kind == "array"

    @property
    def np_dtype(self) -> np.dtype:
        return dtype_of(self.dtype)

    @property
    def members(self) -> tuple:
        """A tuple's member specs, in order (numba flattens them in this order)."""
        return tuple_members(self.dtype) if self.kind == "tuple" else ()

    def __str__(self) -> str:
        if self.enum:  # as Numba prints the type: Enum<int64>(Color)
            value = str(replace(self, enum=""))
            return f"Enum<{value}>({self.enum.rpartition('.')[2]})"
        if self.kind == "tuple":
            return "Tuple(" + ", ".join(str(m) for m in self.members) + ")"
        name = _NUMBA_DTYPE_NAMES.get(self.dtype) or _readable(self.np_dtype)
        if not self.is_array:
            return name
        dims = [":"] * self.ndim
        if self.ndim and self.layout == "C":
            dims[-1] = "::1"
        elif self.ndim and self.layout == "F":
            dims[0] = "::1"
        return f"{name}[{', '.join(dims)}]"

    # -- matching -----------------------------------------------------------
    def accepts(self, value) -> bool:
        """Whether ``value`` can be passed for this parameter without a lossy cast."""
        return self.matches(array_info(value), value)

    def matches(self, info, value) -> bool:
        """:meth:`accepts` for a value whose :func:`array_info` is already known."""
        if self.enum and enum_class_name(value) != self.enum:
            return False
        if self.kind == "array":
            return (
                info is not None
                and dtype_fits(info.dtype, dtype_of(self.dtype))
                and len(info.shape) == self.ndim
                and (self.layout == "A"
                     or has_layout(info.shape, info.strides, info.dtype.itemsize, self.layout))
            )
        if self.kind == "record":
            return (info is None and isinstance(value, np.void)
                    and value.dtype == dtype_of(self.dtype))
        if self.kind == "tuple":
            members = tuple_members(self.dtype)
            value = passed_value(value)
            return info is None and isinstance(value, tuple) and len(value) == len(members) and all(
                m.matches(array_info(v), v) for m, v in zip(members, value))
        return info is None and _scalar_fits(value, dtype_of(self.dtype))


_DTYPES = {name: np.dtype(name) for name in SCALAR_DTYPES}
_DTYPES[BFLOAT16] = _BFLOAT16_BYTES


def _two_plain_bytes(dtype: np.dtype) -> bool:
    """Whether ``dtype`` can hold a bfloat16: ml_dtypes' bfloat16, or its ``"<V2"`` spelling."""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None \
        and dtype.subdtype is None


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ``ml_dtypes.bfloat16`` (told by name: ml_dtypes is not imported)."""
    return dtype.name == BFLOAT16 and _two_plain_bytes(dtype)


_MEMBERS: dict = {}


def tuple_code(members) -> str:
    """The :class:`ArgSpec` dtype of a tuple of ``members`` (ArgSpecs)."""
    return TUPLE_PREFIX + json.dumps(
        [list(m.as_tuple()) for m in members], separators=(",", ":"))


def tuple_members(code: str) -> tuple:
    """The member ArgSpecs that :func:`tuple_code` spelled as ``code``."""
    members = _MEMBERS.get(code)
    if members is None:
        try:
            if not code.startswith(TUPLE_PREFIX):
                raise ValueError("no tuple prefix")
            members = tuple(ArgSpec(*m) for m in json.loads(code[len(TUPLE_PREFIX):]))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"cannot read tuple members {code!r:.80} ({exc})") from None
        if len(_MEMBERS) < 4096:
            _MEMBERS[code] = members
    return members


def dtype_fits(have: np.dtype, want: np.dtype) -> bool:
    """Whether array elements of dtype ``have`` can be passed where ``want`` is compiled.

    The CUDA array interface spells a record dtype ``"|V<itemsize>"`` and its
    ``descr`` is optional (Numba's device arrays leave it out), so an
    unstructured void dtype of the record's size is taken for the record.
    """
    if have is want or have == want:
        return True
    if want is _BFLOAT16_BYTES:
        return _two_plain_bytes(have)
    return (want.names is not None and have.kind == "V" and have.names is None
            and have.subdtype is None and have.itemsize == want.itemsize)


def dtype_code(dtype) -> str:
    """The plain-data spelling of a dtype in an :class:`ArgSpec`.

    Numbers, bool, datetime64 and timedelta64 are their numpy names. A
    structured dtype is ``"record"`` followed by JSON of its ``names``,
    ``formats`` (each spelled likewise, a sub-array as ``[code, shape]``),
    ``offsets``, ``itemsize`` and ``aligned``: the bytes as Numba's data
    model lays them out, which is numpy's layout of the same dtype.

    Examples
    --------
    >>> dtype_code(np.float32)
    'float32'
    >>> dtype_code(np.dtype([("s0", np.uint64), ("s1", np.uint64)], align=True))
    'record{"names":["s0","s1"],"formats":["uint64","uint64"],"offsets":[0,8],"itemsize":16,"aligned":true}'
    """
    dtype = np.dtype(dtype)
    if dtype.names is None:
        if dtype.subdtype is not None:
            base, shape = dtype.subdtype
            return json.dumps([dtype_code(base), list(shape)], separators=(",", ":"))
        if is_bfloat16(dtype):
            return BFLOAT16
        if dtype.byteorder == ">" or dtype.kind not in "biufcmMSU":
            raise ValueError(
                f"daskgpu passes numbers, bool, datetime64, timedelta64, fixed-width "
                f"strings and records of them in native byte order, not dtype {dtype!r}"
            )
        if dtype.kind in "SU":  # Numba's CharSeq and UnicodeCharSeq: "S12", "U12"
            return dtype.str[1:]
        return dtype.name
    fields = {
        "names": list(dtype.names),
        "formats": [_field_code(dtype.fields[n][0]) for n in dtype.names],
        "offsets": [int(dtype.fields[n][1]) for n in dtype.names],
        "itemsize": int(dtype.itemsize),
        "aligned": bool(dtype.isalignedstruct),
    }
    return RECORD_PREFIX + json.dumps(fields, separators=(",", ":"))


def _field_code(dtype):
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return [_field_code(base), list(shape)]
    return dtype_code(dtype)


def _field_dtype(code):
    if isinstance(code, list):
        return (_field_dtype(code[0]), tuple(code[1]))
    return dtype_of(code)


def dtype_of(code: str) -> np.dtype:
    """The numpy dtype that :func:`dtype_code` spelled as ``code``."""
    dtype = _DTYPES.get(code)
    if dtype is not None:
        return dtype
    try:
        if code.startswith(RECORD_PREFIX):
            f = json.loads(code[len(RECORD_PREFIX):])
            spec = {"names": f["names"], "formats": [_field_dtype(c) for c in f["formats"]],
                    "offsets": f["offsets"], "itemsize": f["itemsize"]}
            dtype = np.dtype(spec, align=bool(f.get("aligned")))
        elif code.startswith(("datetime64", "timedelta64")) or (
                code[:1] in ("S", "U") and code[1:].isdigit()):
            dtype = np.dtype(code)
        else:
            raise ValueError("not a dtype daskgpu passes")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"daskgpu supports parameters of dtypes {sorted(SCALAR_DTYPES)}, bfloat16, datetime64, "
            f"timedelta64, fixed-width strings (S<n>, U<n>) and records of those; cannot read "
            f"dtype {code!r} ({exc})"
        ) from None
    if len(_DTYPES) < 4096:  # bounded: codes come from images, not from data
        _DTYPES[code] = dtype
    return dtype


def _readable(dtype: np.dtype) -> str:
    # Numba's spelling, shortened: Record(a:int8@0,b:float64@8;16;aligned)
    if dtype.names is None:
        if dtype is _BFLOAT16_BYTES:
            return BFLOAT16
        if not dtype.isnative:  # else ">f4" reads as "float32", like the wanted "<f4"
            order = "big" if dtype.byteorder == ">" else "little"
            return f"{dtype.name} in {order}-endian byte order ({dtype.str})"
        return dtype.str[1:] if dtype.kind in "SU" else dtype.name
    fields = ",".join(
        f"{n}:{_readable(dtype.fields[n][0])}@{dtype.fields[n][1]}" for n in dtype.names
    )
    return f"Record({fields};{dtype.itemsize}{';aligned' if dtype.isalignedstruct else ''})"


def mismatch(spec: ArgSpec, value) -> str | None:
    """Why ``value`` does not fit ``spec``, in words, or None when it fits."""
    info = array_info(value)
    if spec.matches(info, value):
        return None
    if spec.enum and enum_class_name(value) != spec.enum:
        return f"expects a member of enum {spec.enum}, got {describe(value)} {value!r}"
    if spec.is_array:
        if info is None:
            return f"expects an array {spec}, got {describe(value)}"
        dtype, shape, strides, _ = info
        if not dtype_fits(dtype, spec.np_dtype):
            want = _readable(spec.np_dtype)
            if spec.np_dtype.names is not None:
                return (f"expects elements of dtype {want}, got {_readable(dtype)}; a record "
                        "array must have the same fields, offsets and itemsize")
            fix = "ml_dtypes.bfloat16" if spec.dtype == BFLOAT16 else repr(want)
            return f"expects dtype {want}, got {_readable(dtype)}; convert with .astype({fix})"
        if len(shape) != spec.ndim:
            return f"expects a {spec.ndim}-D array, got {len(shape)}-D of shape {tuple(shape)}"
        fix = "np.ascontiguousarray(a)" if spec.layout == "C" else "np.asfortranarray(a)"
        return (f"expects a {spec.layout}-contiguous array, got a "
                f"{layout_of(shape, strides, dtype.itemsize)}-layout one; pass {fix}")
    if spec.kind == "tuple":
        value = passed_value(value)
        if info is not None or not isinstance(value, tuple):
            return f"expects a tuple {spec}, got {describe(value)}"
        if len(value) != len(spec.members):
            return f"expects a tuple of {len(spec.members)}, got one of {len(value)}"
        for j, (m, v) in enumerate(zip(spec.members, value)):
            why = mismatch(m, v)
            if why:
                return f"member {j} {why}"
        return None
    if info is not None:
        return f"expects a scalar {_readable(spec.np_dtype)}, got an array"
    dtype = spec.np_dtype
    if spec.kind == "record" or dtype.kind in "mM":
        return (f"expects a {_readable(dtype)} scalar of exactly that dtype, got "
                f"{describe(value)}")
    if dtype.kind in "iu" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        info_ = np.iinfo(dtype)
        return f"value {value} overflows {spec.dtype} (range {info_.min}..{info_.max})"
    if spec.dtype == BFLOAT16:
        return (f"expects a bfloat16 scalar, got {describe(value)} {value!r}; pass "
                "ml_dtypes.bfloat16(value), rounded as you choose")
    return f"expects {spec.dtype}, got {describe(value)} {value!r}"


def class_name(cls) -> str:
    """``module.qualname``: how an :class:`ArgSpec` names an enum class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def enum_class_name(value) -> str:
    """:func:`class_name` of an enum member's class; empty for anything else."""
    return class_name(type(value)) if isinstance(value, enum.Enum) else ""


def passed_value(value):
    """What Numba passes for ``value``: an enum member's value (a number or a tuple)."""
    return value.value if isinstance(value, enum.Enum) else value


def _scalar_fits(value, dtype: np.dtype) -> bool:
    if dtype is _BFLOAT16_BYTES:  # only a bfloat16 value: a cast would have to round
        return isinstance(value, np.generic) and is_bfloat16(value.dtype)
    value = passed_value(value)
    if dtype.kind in "mM":  # a unit is part of the type, as in Numba
        return isinstance(value, (np.datetime64, np.timedelta64)) and value.dtype == dtype
    if isinstance(value, (bool, np.bool_)):
        return dtype.kind == "b"
    if isinstance(value, np.generic):
        if value.dtype.kind in "iu" and dtype.kind in "iu":
            # Between signed and unsigned, as for Python ints, the value decides.
            return _in_range(value, dtype)
        return np.can_cast(value.dtype, dtype, casting="same_kind") and (
            dtype.kind != "b"
        ) and _in_range(value, dtype)
    if isinstance(value, int):
        return dtype.kind in "iufc" and _in_range(value, dtype)
    if isinstance(value, float):
        return dtype.kind in "fc"
    if isinstance(value, complex):
        return dtype.kind == "c"
    return False


def _in_range(value, dtype: np.dtype) -> bool:
    if dtype.kind in "iu":
        if isinstance(value, np.generic) and value.dtype.kind not in "iub":
            return False
        info = np.iinfo(dtype)
        return info.min <= int(value) <= info.max
    return True


def describe(value) -> str:
    """A short type description of an argument for error messages."""
    info = array_info(value)
    if info is not None:
        dtype, shape, strides, _ = info
        layout = layout_of(shape, strides, dtype.itemsize)
        where = "host" if isinstance(value, np.ndarray) else "device"
        try:
            spelled = str(ArgSpec("array", dtype_code(dtype), len(shape), layout))
        except ValueError:
            spelled = f"array({dtype}, {len(shape)}d, {layout})"
        return spelled + f" ({where})"
    if isinstance(value, np.generic):
        return _readable(value.dtype)
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return type(value).__name__


def signature_str(specs) -> str:
    return "(" + ", ".join(str(s) for s in specs) + ")"
