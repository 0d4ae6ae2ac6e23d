"""Which compiled image a launch runs: Numba's dispatcher rules, from plain data.

:func:`select_image` picks, as Numba's dispatcher does, the image whose
argument specs take the arguments with the fewest and least lossy conversions
(:func:`conversion_cost`), and for kernels that cannot compile more
signatures also one reached by Numba's unsafe casts.
"""

from __future__ import annotations

import numpy as np

from daskgpu._image.argspec import describe, mismatch, passed_value, signature_str
from daskgpu._image.array_info import array_info, has_layout


def select_image(name, images, args, infos=None, unsafe=True, names=None):
    """The image that Numba's dispatcher would pick for ``args``; else ``TypeError``.

    ``infos`` are the arguments' :func:`array_info`, when already read. As
    Numba: an image that takes every argument as it is wins, the one needing
    the fewest and least lossy conversions first (a Python float takes float64
    over float32). With none, and ``unsafe`` (a kernel that cannot compile
    more signatures: Numba's eager dispatchers, every kernel on a worker), an
    image reached by unsafe casts is taken: integers of any width or sign
    wrap as C casts do, and an integer array is read as the signature's
    integer dtype of the same size (numba-cuda's single-signature kernels
    pass arrays unchecked; daskgpu reinterprets nothing else). ``names``, the
    kernel's parameter names where known (on the client), name the argument that
    no image takes in the error.
    """
    if infos is None:
        infos = [array_info(a) for a in args]
    best, best_cost = None, None
    for image in images:
        specs = image.args
        if len(specs) == len(args) and all(
            spec.matches(info, a) for spec, info, a in zip(specs, infos, args)
        ):
            if len(images) == 1:
                return image
            cost = conversion_cost(specs, infos, args)
            if best is None or cost < best_cost:
                best, best_cost = image, cost
                if not any(cost):
                    break
    if best is None and unsafe:
        for image in images:
            specs = image.args
            if len(specs) == len(args) and all(
                spec.matches(info, a) or _casts_unsafely(spec, info, a)
                for spec, info, a in zip(specs, infos, args)
            ):
                cost = (sum(not spec.matches(info, a) for spec, info, a in zip(specs, infos, args)),
                        conversion_cost(specs, infos, args))
                if best is None or cost < best_cost:
                    best, best_cost = image, cost
    if best is not None:
        return best
    received = "(" + ", ".join(describe(a) for a in args) + ")"
    shipped = "\n  ".join(
        signature_str(im.args) + _why_not(im, args, names) for im in images
    ) or "(none)"
    raise TypeError(
        # "No matching definition" first, as numba-cuda's message starts.
        f"No matching definition: no compiled signature of kernel {name!r} matches the "
        f"arguments {received}.\n"
        f"Compiled signatures:\n  {shipped}\n"
        "Pass arguments of one of these types (arrays of that dtype, rank and layout), "
        "or compile the signature on the client first: kernel.compile(sig) or "
        "kernel.specialize(*args)."
    )


# What each parameter kind takes by an unsafe cast, as numba-cuda's ctypes
# conversion of that value succeeds: Python and numpy numbers of these kinds.
_UNSAFE_SOURCES = {"i": "biu", "u": "biu", "f": "biuf", "c": "biufc"}


def _casts_unsafely(spec, info, value) -> bool:
    """Whether ``value`` reaches ``spec`` by one of Numba's unsafe casts."""
    if spec.enum:  # nothing converts to an enum member
        return False
    want = spec.np_dtype if spec.kind in ("array", "scalar") else None
    if spec.kind == "array":
        return (info is not None and len(info.shape) == spec.ndim
                and info.dtype.kind in "iu" and want.kind in "iu"
                and info.dtype.itemsize == want.itemsize
                and (spec.layout == "A" or has_layout(info.shape, info.strides, info.dtype.itemsize,
                                                       spec.layout)))
    if spec.kind == "tuple":
        members = spec.members
        value = passed_value(value)
        return info is None and isinstance(value, tuple) and len(value) == len(members) and all(
            m.matches(array_info(v), v) or _casts_unsafely(m, array_info(v), v)
            for m, v in zip(members, value))
    if spec.kind != "scalar" or info is not None:
        return False
    have = _numba_scalar_dtype(value)
    return have is not None and have.kind in _UNSAFE_SOURCES.get(want.kind, "")


def conversion_cost(specs, infos, args) -> tuple:
    """How far ``args`` are from ``specs``: counts of (unsafe, safe, promoting) casts.

    Python scalars are typed as Numba types them (int64, float64, complex128);
    an "A"-layout array parameter given a contiguous array counts as promoting.
    """
    unsafe = safe = promote = 0
    for spec, info, value in zip(specs, infos, args):
        if spec.kind == "array":
            if spec.layout == "A" and info is not None and len(info.shape) > 1:
                promote += 1
            continue
        if spec.kind != "scalar":
            continue
        have = _numba_scalar_dtype(value)
        want = spec.np_dtype
        if have is None or have == want:
            continue
        if np.can_cast(have, want, "safe"):
            if have.kind == want.kind or (have.kind in "iu" and want.kind in "iu"):
                promote += 1
            else:
                safe += 1
        else:
            unsafe += 1
    return (unsafe, safe, promote)


def _numba_scalar_dtype(value):
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(bool)
    if isinstance(value, np.generic):
        return value.dtype
    if isinstance(value, int):
        return np.dtype(np.int64)
    if isinstance(value, float):
        return np.dtype(np.float64)
    if isinstance(value, complex):
        return np.dtype(np.complex128)
    return None


def _why_not(image, args, names=None) -> str:
    if len(image.args) != len(args):
        return f": takes {len(image.args)} arguments, got {len(args)}"
    for i, (spec, a) in enumerate(zip(image.args, args)):
        reason = mismatch(spec, a)
        if reason:
            named = f" ({names[i]!r})" if names is not None and len(names) == len(args) else ""
            return f": argument {i}{named} {reason}"
    return ""
