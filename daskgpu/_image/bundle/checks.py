"""The field checks a bundle's decoder is built from.

Each raises :class:`~daskgpu.BundleError` naming the file, the field and the
value it got, and returns the value when it passes.
"""

from __future__ import annotations

from daskgpu._errors import BundleError


def check_keys(obj: dict, allowed: set, where: str, path: str, optional=frozenset()) -> None:
    """Refuse ``obj`` when it has keys beyond ``allowed | optional`` or lacks one of ``allowed``."""
    missing = allowed - obj.keys()
    unknown = obj.keys() - allowed - optional
    if unknown:
        raise BundleError(f"{path!r}: {where} has unknown fields {sorted(unknown)}")
    if missing:
        raise BundleError(f"{path!r}: {where} lacks the fields {sorted(missing)}")


def check_type(value, types, what: str, path: str):
    """``value`` when its JSON type is exactly one of ``types`` (a bool is no int here)."""
    types = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass in Python, but not in a bundle.
    if not any(type(value) is t for t in types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise BundleError(f"{path!r}: field {what} must be {names}, got {value!r:.80}")
    return value


def check_int(value, lo: int, hi: int, what: str, path: str) -> int:
    """``value`` when it is an int in ``lo..hi``."""
    check_type(value, int, what, path)
    if not lo <= value <= hi:
        raise BundleError(f"{path!r}: field {what} must be in {lo}..{hi}, got {value}")
    return value


def check_pair(value, what: str, path: str) -> list:
    """``value`` when it is a list of two items."""
    check_type(value, list, what, path)
    if len(value) != 2:
        raise BundleError(f"{path!r}: field {what} must be a pair, got {len(value)} items")
    return value
