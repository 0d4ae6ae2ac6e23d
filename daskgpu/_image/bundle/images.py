"""One kernel image in a bundle: encoded to JSON-able data, and decoded field group by field group.

An encoded image is a JSON object with the keys :data:`IMAGE_KEYS`; the
decoder checks each group of fields (name and entry, PTX per target, argument
specs, write set and grid rank, link inputs, options, versions, exception
table) in one function, so that every refusal names the field, the value and
what it must be.
"""

from __future__ import annotations

import base64
import binascii
import re

from daskgpu._errors import BundleError
from daskgpu._image.bundle.checks import (
    check_exception_class,
    check_int,
    check_keys,
    check_pair,
    check_type,
)
from daskgpu._image.image import KernelImage, image_fields, image_from_fields

IMAGE_KEYS = {"name", "entry", "ptx", "args", "writes", "grid_ndim", "links",
              "options", "versions", "exceptions"}
LINK_KEYS = {"name", "kind", "data"}
LINK_KINDS = {"ptx", "cubin", "fatbin", "ltoir", "object", "library"}
#: Link options a KernelImage carries, with the JSON types each may take. Other
#: option names are refused: an unknown option could change the linked code.
OPTION_TYPES = {
    "debug": (bool,),
    "fastmath": (bool,),
    "lineinfo": (bool,),
    "max_registers": (int, type(None)),
    "opt": (bool,),
    "cooperative": (bool,),
    "lto": (bool,),
    "shared_memory_carveout": (int, type(None)),
}
_ENTRY_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_CLASS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:<>]{0,199}")
_INT32_MAX = 2**31 - 1


# -- encoding -------------------------------------------------------------------
def encode_image(image: KernelImage) -> dict:
    """``image`` as a JSON-able dict with the keys :data:`IMAGE_KEYS`; never its Python function."""
    fields = image_fields(image)
    return {  # py_func is never written
        "name": fields["name"],
        "entry": fields["entry"],
        "ptx": [[list(cc), text] for cc, text in fields["ptx"]],
        "args": [list(a) for a in fields["args"]],
        "writes": list(fields["writes"]),
        "grid_ndim": fields["grid_ndim"],
        "links": [
            {"name": name, "kind": kind, "data": base64.b64encode(data).decode("ascii")}
            for name, kind, data in fields["links"]
        ],
        "options": [[k, _normalize_option(k, v)] for k, v in fields["options"]],
        "versions": [list(kv) for kv in fields["versions"]],
        "exceptions": [
            [code, cls, list(args), list(loc) if loc is not None else None]
            for code, cls, args, loc in image.exceptions
        ],
        **({"positions": [list(use) for use in image.positions]}
           if image.positions is not None else {}),
    }


def _normalize_option(key, value):
    # Numba's dispatcher options spell flags as 0/1; a bundle stores booleans.
    if OPTION_TYPES.get(key) == (bool,) and type(value) is int and value in (0, 1):
        return bool(value)
    return value


# -- decoding -------------------------------------------------------------------
def decode_image(obj, index: int, path: str) -> KernelImage:
    """The :class:`KernelImage` that ``images[index]`` of the bundle at ``path`` encodes.

    Raises
    ------
    BundleError
        Naming the first field that is missing, unknown, of the wrong type or
        out of range, or the image's own objection to its fields.
    """
    where = f"images[{index}]"
    check_type(obj, dict, where, path)
    check_keys(obj, IMAGE_KEYS, where, path, optional={"positions"})
    name, entry = _name_and_entry(obj, where, path)
    ptx = _ptx(obj["ptx"], entry, where, path)
    args = _args(obj["args"], where, path)
    writes = _writes(obj["writes"], len(args), where, path)
    grid_ndim = check_int(obj["grid_ndim"], 0, 3, f"{where}.grid_ndim", path)
    fields = {"name": name, "entry": entry, "ptx": ptx, "args": args, "writes": writes,
              "grid_ndim": grid_ndim,
              "links": _links(obj["links"], where, path),
              "options": _options(obj["options"], where, path),
              "versions": _versions(obj["versions"], where, path),
              "exceptions": _exceptions(obj["exceptions"], where, path)}
    if "positions" in obj:  # checked with the other fields, by image_from_fields
        fields["positions"] = check_type(obj["positions"], list, f"{where}.positions", path)
    try:
        return image_from_fields(fields)
    except (TypeError, ValueError, IndexError) as exc:
        raise BundleError(f"{path!r}: {where} is not a valid kernel image: {exc}") from None


def _name_and_entry(obj: dict, where: str, path: str) -> tuple:
    name = check_type(obj["name"], str, f"{where}.name", path)
    entry = check_type(obj["entry"], str, f"{where}.entry", path)
    if not name:
        raise BundleError(f"{path!r}: field {where}.name is empty")
    if not _ENTRY_RE.fullmatch(entry):
        raise BundleError(f"{path!r}: field {where}.entry {entry!r:.80} is not a PTX symbol")
    return name, entry


def _ptx(value, entry: str, where: str, path: str) -> list:
    """``[[[major, minor], text], ...]``: one PTX per target, targets ascending."""
    ptx = []
    for i, item in enumerate(check_type(value, list, f"{where}.ptx", path)):
        what = f"{where}.ptx[{i}]"
        cc, text = check_pair(item, what, path)
        check_pair(cc, f"{what} compute capability", path)
        cc = tuple(check_int(c, 0, 99, f"{what} compute capability", path) for c in cc)
        check_type(text, str, f"{what} PTX text", path)
        if ".entry" not in text or entry not in text:
            raise BundleError(f"{path!r}: {what} is not PTX defining the entry {entry!r:.60}")
        ptx.append((cc, text))
    ccs = [cc for cc, _ in ptx]
    if not ptx or ccs != sorted(set(ccs)):
        raise BundleError(f"{path!r}: field {where}.ptx must list one PTX per target, "
                          f"targets ascending, got targets {ccs}")
    return ptx


def _args(value, where: str, path: str) -> list:
    """``[[kind, dtype, ndim, layout(, enum class)], ...]``: the argument specs."""
    args = []
    for i, item in enumerate(check_type(value, list, f"{where}.args", path)):
        what = f"{where}.args[{i}]"
        check_type(item, list, what, path)
        if len(item) not in (4, 5):
            raise BundleError(
                f"{path!r}: field {what} must be [kind, dtype, ndim, layout] or, for an "
                "enum, [kind, dtype, ndim, layout, enum class]")
        kind = check_type(item[0], str, f"{what} kind", path)
        dtype = check_type(item[1], str, f"{what} dtype", path)
        ndim = check_int(item[2], 0, 0 if kind == "scalar" else 32, f"{what} ndim", path)
        layout = check_type(item[3], str, f"{what} layout", path)
        enum = [check_type(item[4], str, f"{what} enum class", path)] if len(item) == 5 else []
        args.append((kind, dtype, ndim, layout, *enum))
    return args


def _writes(value, nargs: int, where: str, path: str) -> list:
    """Indices of the parameters the kernel writes, ascending and unique."""
    writes = [check_int(w, 0, max(nargs - 1, 0), f"{where}.writes", path)
              for w in check_type(value, list, f"{where}.writes", path)]
    if writes != sorted(set(writes)):
        raise BundleError(f"{path!r}: field {where}.writes must be ascending and unique, "
                          f"got {writes}")
    return writes


def _links(value, where: str, path: str) -> list:
    """``[{"name", "kind", "data": base64}, ...]``: the link inputs, as bytes."""
    links = []
    for i, item in enumerate(check_type(value, list, f"{where}.links", path)):
        what = f"{where}.links[{i}]"
        check_type(item, dict, what, path)
        check_keys(item, LINK_KEYS, what, path)
        name = check_type(item["name"], str, f"{what}.name", path)
        kind = check_type(item["kind"], str, f"{what}.kind", path)
        if kind not in LINK_KINDS:
            raise BundleError(f"{path!r}: field {what}.kind must be one of "
                              f"{sorted(LINK_KINDS)}, got {kind!r:.40}")
        try:
            data = base64.b64decode(check_type(item["data"], str, f"{what}.data", path),
                                    validate=True)
        except binascii.Error:
            raise BundleError(f"{path!r}: field {what}.data is not base64") from None
        links.append((name, kind, data))
    return links


def _options(value, where: str, path: str) -> list:
    """``[[name, value], ...]``: known link options, each once, of their types."""
    options = []
    seen = set()
    for i, item in enumerate(check_type(value, list, f"{where}.options", path)):
        what = f"{where}.options[{i}]"
        key, option = check_pair(item, what, path)
        check_type(key, str, f"{what} name", path)
        if key not in OPTION_TYPES:
            raise BundleError(f"{path!r}: field {what} is an unknown option {key!r:.40}; "
                              f"this daskgpu knows {sorted(OPTION_TYPES)}")
        if key in seen:
            raise BundleError(f"{path!r}: option {key!r} appears twice in {where}.options")
        seen.add(key)
        check_type(option, OPTION_TYPES[key], f"{what} ({key})", path)
        if key == "max_registers" and option is not None:
            check_int(option, 1, 255, f"{what} (max_registers)", path)
        options.append((key, option))
    return options


def _versions(value, where: str, path: str) -> list:
    """``[[tool, version], ...]``: what produced the PTX, as strings."""
    versions = []
    for i, item in enumerate(check_type(value, list, f"{where}.versions", path)):
        what = f"{where}.versions[{i}]"
        key, version = check_pair(item, what, path)
        versions.append((check_type(key, str, what, path), check_type(version, str, what, path)))
    return versions


def _exceptions(value, where: str, path: str) -> list:
    """``[[code, class name, args, location or null], ...]``: the exception table."""
    return [_exception(item, f"{where}.exceptions[{i}]", path)
            for i, item in enumerate(check_type(value, list, f"{where}.exceptions", path))]


def _exception(item, what: str, path: str) -> tuple:
    check_type(item, list, what, path)
    if len(item) != 4:
        raise BundleError(f"{path!r}: field {what} must be [code, class, args, location]")
    code = check_int(item[0], 1, _INT32_MAX, f"{what} code", path)
    cls = check_type(item[1], str, f"{what} class", path)
    if not _CLASS_RE.fullmatch(cls):
        raise BundleError(f"{path!r}: field {what} class {cls!r:.80} is not a class name")
    check_exception_class(cls, f"{what} class", path)
    args = [check_type(a, (str, int, float, bool), f"{what} args", path)
            for a in check_type(item[2], list, f"{what} args", path)]
    return code, cls, tuple(args), _location(item[3], what, path)


def _location(loc, what: str, path: str):
    """``[function, file, line]`` of an exception table entry, or None."""
    if loc is None:
        return None
    check_type(loc, list, f"{what} location", path)
    if len(loc) != 3:
        raise BundleError(f"{path!r}: field {what} location must be [function, file, line]")
    return (check_type(loc[0], str, f"{what} location", path),
            check_type(loc[1], str, f"{what} location", path),
            check_int(loc[2], 0, _INT32_MAX, f"{what} location line", path))
