"""Kernel bundles: a compiled kernel saved as a data-only file.

A bundle is one JSON document (UTF-8), so reading it can never run code::

    {"format": "daskgpu-bundle", "version": 1, "daskgpu": "0.1.0",
     "images": [{"name": ..., "entry": ..., "ptx": [[[7, 5], "<PTX text>"]],
                 "args": [["array", "float32", 1, "C"]], "writes": [0],
                 "grid_ndim": 1, "links": [{"name": ..., "kind": ..., "data": "<base64>"}],
                 "options": [["fastmath", false]], "versions": [["numba-cuda", "0.30.4"]],
                 "exceptions": [[1, "ValueError", ["n too big"], ["k", "k.py", 8]]]}],
     "sha256": "<hex>", "hmac-sha256": "<hex>"}

``sha256`` is taken over the canonical serialization of everything else (keys
sorted, no whitespace), so corruption is caught on load. It is no seal: whoever
can change the file can recompute it. With a secret key (the ``key=``
argument, or the ``daskgpu.bundle-key`` setting), :func:`save` adds
``hmac-sha256`` over the same bytes and :func:`load` refuses a bundle whose
HMAC is missing or does not match, so only holders of the key can make a
bundle that loads. Before anything is parsed, a file is bounded in size
(:data:`MAX_BYTES`) and nesting depth (:data:`MAX_DEPTH`). Exception classes
named in a bundle resolve only from an allow-list of ordinary exception types
(:data:`~daskgpu._runtime.faults.EXCEPTION_CLASSES`), or as ``module:qualname``
from a module already imported, and only to ``Exception`` subclasses. The Python function is never stored: a bundle is PTX-only even while
``daskgpu.simulate`` is on. This module imports neither numba nor a GPU
library, so loading works on a worker that has neither a compiler nor numba.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass

from daskgpu._errors import BundleError, PicklingError
from daskgpu._files import atomic_write
from daskgpu._image.image import KernelImage, _fields, _rebuild_image
from daskgpu._runtime.launch import PTXKernel

FORMAT = "daskgpu-bundle"
VERSION = 1

#: The largest bundle file read, and the deepest nesting of JSON arrays and objects
#: parsed (a bundle nests 5 deep); both checked before the JSON parser runs.
MAX_BYTES = 256 << 20
MAX_DEPTH = 16

_TOP_KEYS = {"format", "version", "daskgpu", "images", "sha256"}
_HMAC = "hmac-sha256"
_IMAGE_KEYS = {"name", "entry", "ptx", "args", "writes", "grid_ndim", "links",
               "options", "versions", "exceptions"}
_LINK_KEYS = {"name", "kind", "data"}
_LINK_KINDS = {"ptx", "cubin", "fatbin", "ltoir", "object", "library"}
# Link options a KernelImage carries, with the JSON types each may take. Other
# option names are refused: an unknown option could change the linked code.
_OPTION_TYPES = {
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
# A JSON string (skipped whole), or one bracket: enough to measure nesting depth.
_DEPTH_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_PICKLE_PROTOCOLS = tuple(bytes([0x80, p]) for p in range(2, 6))


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle file holds besides its images: for ``daskgpu inspect``."""

    path: str
    version: int
    producer: str
    sha256: str
    size: int
    signed: bool = False


# -- saving -------------------------------------------------------------------
def save(kernel, path, *, key=None) -> str:
    """Write a compiled kernel to a bundle file: data only, with an integrity hash.

    The bundle holds every compiled signature of the kernel as PTX text and
    argument specs, never the Python function, and loads with
    :func:`load` on any machine, with or without numba.

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        A kernel from :func:`daskgpu.jit` / :func:`daskgpu.kernel` with at
        least one compiled signature, or a kernel from :func:`load`.
    path : str or os.PathLike
        The file to write (by convention ``*.dgk``); replaced atomically.
    key : str or bytes, optional
        A secret to sign the bundle with (HMAC-SHA256), so that :func:`load`
        with the same key detects tampering. Default: the ``daskgpu.bundle-key``
        setting; unsigned when neither is set.

    Returns
    -------
    str
        The bundle's sha256, as stored in the file.

    Raises
    ------
    PicklingError
        When the kernel has no compiled signature (the message says how to
        give one).

    Examples
    --------
    >>> import os, tempfile, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1])")
    ... def fill(out):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = i
    >>> path = os.path.join(tempfile.mkdtemp(), "fill.dgk")
    >>> digest = dg.save(fill, path)
    >>> dg.load(path).signatures
    ['(float32[::1])']
    """
    images = _images_of(kernel)
    content = {
        "format": FORMAT,
        "version": VERSION,
        "daskgpu": _daskgpu_version(),
        "images": [_encode_image(im) for im in images],
    }
    path = os.fspath(path)
    for i, encoded in enumerate(content["images"]):  # never write what load refuses
        _decode_image(encoded, i, path)
    digest = _digest(content)
    document = dict(content, sha256=digest)
    secret = _key(key)
    if secret is not None:
        document[_HMAC] = _hmac(secret, content)
    text = json.dumps(document, sort_keys=True, indent=1, ensure_ascii=False)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write the bundle {path!r}: the directory "
                                f"{directory!r} does not exist")
    atomic_write(path, (text + "\n").encode("utf-8"))
    return digest


def _images_of(kernel) -> tuple:
    if isinstance(kernel, PTXKernel):
        return kernel.images
    ptx_kernel = getattr(kernel, "ptx_kernel", None)
    if callable(ptx_kernel):
        # With the simulator off, ptx_kernel() carries no Python function; it
        # raises PicklingError naming the fix when nothing is compiled.
        import dask.config

        with dask.config.set({"daskgpu.simulate": False}):
            return ptx_kernel().images
    if hasattr(kernel, "py_func") and hasattr(kernel, "targetoptions"):
        raise PicklingError(
            f"dg.save takes a daskgpu kernel, got a numba dispatcher "
            f"{getattr(kernel, '__name__', kernel)!r}; wrap it first: "
            "dg.save(dg.kernel(dispatcher, ['void(float32[::1])']), path)"
        )
    raise PicklingError(
        f"dg.save takes a daskgpu Kernel or PTXKernel, got {type(kernel).__name__}; "
        "compile a function with dg.jit('void(...)') first"
    )


def _encode_image(image: KernelImage) -> dict:
    fields = _fields(image)
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
    }


def _normalize_option(key, value):
    # Numba's dispatcher options spell flags as 0/1; a bundle stores booleans.
    if _OPTION_TYPES.get(key) == (bool,) and type(value) is int and value in (0, 1):
        return bool(value)
    return value


def _canonical(content: dict) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def _digest(content: dict) -> str:
    return hashlib.sha256(_canonical(content)).hexdigest()


def _hmac(secret: bytes, content: dict) -> str:
    return hmac.new(secret, _canonical(content), hashlib.sha256).hexdigest()


def _key(key):
    """The signing key as bytes: ``key``, else the ``daskgpu.bundle-key`` setting, else None."""
    if key is None:
        from daskgpu import _config

        key = _config.get("bundle-key")
    if key is None:
        return None
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, bytes | bytearray) or not key:
        raise BundleError(f"a bundle key is a non-empty str or bytes, got {type(key).__name__}")
    return bytes(key)


def _daskgpu_version() -> str:
    from daskgpu import __version__

    return __version__


# -- loading ------------------------------------------------------------------
def load(path, *, key=None) -> PTXKernel:
    """Read a kernel bundle written by :func:`save`.

    The file is parsed as JSON only (nothing is unpickled or executed), after
    its size and nesting depth are checked; its integrity hash is checked, its
    HMAC too when a key is set, and every field is validated before the kernel
    is rebuilt. The hash detects corruption; only the key detects tampering. Loading needs neither numba nor a GPU; the returned kernel
    launches like a Numba kernel on any machine with a driver.

    Parameters
    ----------
    path : str or os.PathLike
    key : str or bytes, optional
        The secret the bundle was signed with; a bundle without a matching
        HMAC is refused. Default: the ``daskgpu.bundle-key`` setting; with
        neither set, signatures are not checked.

    Returns
    -------
    PTXKernel

    Raises
    ------
    BundleError
        When the file is not a daskgpu bundle, was written by a newer daskgpu,
        is too large or too deeply nested, is corrupt, fails its HMAC, or
        holds an invalid field.

    Examples
    --------
    >>> import os, tempfile, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1])")
    ... def fill(out):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = i
    >>> path = os.path.join(tempfile.mkdtemp(), "fill.dgk")
    >>> _ = dg.save(fill, path)
    >>> k = dg.load(path)
    >>> k
    <PTXKernel fill signatures=['(float32[::1])']>
    >>> k.images[0].writes
    (0,)
    """
    return read(path, key=key)[0]


def read(path, *, key=None) -> tuple:
    """``(PTXKernel, BundleInfo)`` of a bundle file; what :func:`load` and the CLI use."""
    path = os.fspath(path)
    secret = _key(key)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise BundleError(f"{path!r} is {size} bytes, more than a kernel bundle may "
                                  f"be ({MAX_BYTES}); it is not a daskgpu bundle")
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise BundleError(f"no kernel bundle at {path!r}: the file does not exist") from None
    except IsADirectoryError:
        raise BundleError(f"{path!r} is a directory, not a kernel bundle file") from None
    document = _parse(raw, path)
    _check_header(document, path)
    digest = document.get("sha256")
    if not isinstance(digest, str) or not _HEX64_RE.fullmatch(digest):
        raise BundleError(f"{path!r} has no valid 'sha256' integrity hash; it is corrupt. "
                          "Write it again with dg.save or daskgpu compile.")
    signature = document.get(_HMAC)
    content = {k: v for k, v in document.items() if k not in ("sha256", _HMAC)}
    if _digest(content) != digest:
        raise BundleError(
            f"{path!r} is corrupt: its content does not match its sha256 integrity hash. "
            "Write it again with dg.save or daskgpu compile."
        )
    if secret is not None:
        if signature is None:
            raise BundleError(
                f"{path!r} is not signed, but a bundle key is set (key= or "
                "daskgpu.bundle-key), so only signed bundles load; sign it with "
                "dg.save(kernel, path, key=...) or daskgpu compile with the key set")
        if not (isinstance(signature, str)
                and hmac.compare_digest(signature, _hmac(secret, content))):
            raise BundleError(
                f"{path!r} fails its HMAC: it was changed after it was signed, or signed "
                "with another key. Load only bundles signed with your key; write it again "
                "with dg.save(kernel, path, key=...)")
    _check_keys(document, _TOP_KEYS, "the bundle", path, optional={_HMAC})
    if signature is not None and not (isinstance(signature, str)
                                      and _HEX64_RE.fullmatch(signature)):
        raise BundleError(f"{path!r}: field {_HMAC} must be 64 hex digits")
    producer = _check_type(document["daskgpu"], str, "daskgpu", path)
    images = _check_type(document["images"], list, "images", path)
    if not images:
        raise BundleError(f"{path!r} holds no compiled image")
    kernel = PTXKernel(tuple(_decode_image(im, i, path) for i, im in enumerate(images)))
    info = BundleInfo(path=path, version=document["version"], producer=producer,
                      sha256=digest, size=len(raw), signed=signature is not None)
    return kernel, info


def _parse(raw: bytes, path: str) -> dict:
    if raw.startswith(_PICKLE_PROTOCOLS):
        raise BundleError(
            f"{path!r} is a pickle, not a daskgpu bundle; daskgpu never unpickles a bundle. "
            "Bundles are JSON files written by dg.save or daskgpu compile."
        )
    _check_depth(raw, path)
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                              parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(
            f"{path!r} is not a daskgpu bundle (not a JSON document: {exc}). "
            "Bundles are written by dg.save or daskgpu compile."
        ) from None
    if not isinstance(document, dict):
        raise BundleError(f"{path!r} is not a daskgpu bundle (a JSON {type(document).__name__}, "
                          "not an object)")
    return document


def _check_depth(raw: bytes, path: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH`, which the JSON parser would recurse into."""
    depth = 0
    for match in _DEPTH_RE.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise BundleError(f"{path!r} nests JSON more than {MAX_DEPTH} levels deep; it "
                                  "is not a daskgpu bundle (bundles nest 5 deep)")
        elif token in (b"]", b"}"):
            depth -= 1


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def _check_header(document: dict, path: str) -> None:
    if document.get("format") != FORMAT:
        raise BundleError(
            f"{path!r} is not a daskgpu bundle (format {document.get('format')!r}, "
            f"expected {FORMAT!r})"
        )
    version = document.get("version")
    if type(version) is not int or version < 1:
        raise BundleError(f"{path!r} has an invalid bundle version {version!r}")
    if version > VERSION:
        raise BundleError(
            f"{path!r} is a version {version} bundle (written by daskgpu "
            f"{document.get('daskgpu', 'unknown')}), but this daskgpu "
            f"({_daskgpu_version()}) reads bundle version {VERSION} and older. "
            "Upgrade daskgpu: pip install -U daskgpu"
        )


def _check_keys(obj: dict, allowed: set, where: str, path: str, optional=frozenset()) -> None:
    missing = allowed - obj.keys()
    unknown = obj.keys() - allowed - optional
    if unknown:
        raise BundleError(f"{path!r}: {where} has unknown fields {sorted(unknown)}")
    if missing:
        raise BundleError(f"{path!r}: {where} lacks the fields {sorted(missing)}")


def _check_type(value, types, what: str, path: str):
    types = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass in Python, but not in a bundle.
    if not any(type(value) is t for t in types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise BundleError(f"{path!r}: field {what} must be {names}, got {value!r:.80}")
    return value


def _check_int(value, lo: int, hi: int, what: str, path: str) -> int:
    _check_type(value, int, what, path)
    if not lo <= value <= hi:
        raise BundleError(f"{path!r}: field {what} must be in {lo}..{hi}, got {value}")
    return value


def _check_pair(value, what: str, path: str) -> list:
    _check_type(value, list, what, path)
    if len(value) != 2:
        raise BundleError(f"{path!r}: field {what} must be a pair, got {len(value)} items")
    return value


def _decode_image(obj, index: int, path: str) -> KernelImage:
    where = f"images[{index}]"
    _check_type(obj, dict, where, path)
    _check_keys(obj, _IMAGE_KEYS, where, path)

    name = _check_type(obj["name"], str, f"{where}.name", path)
    entry = _check_type(obj["entry"], str, f"{where}.entry", path)
    if not name:
        raise BundleError(f"{path!r}: field {where}.name is empty")
    if not _ENTRY_RE.fullmatch(entry):
        raise BundleError(f"{path!r}: field {where}.entry {entry!r:.80} is not a PTX symbol")

    ptx = []
    for i, item in enumerate(_check_type(obj["ptx"], list, f"{where}.ptx", path)):
        what = f"{where}.ptx[{i}]"
        cc, text = _check_pair(item, what, path)
        _check_pair(cc, f"{what} compute capability", path)
        cc = tuple(_check_int(c, 0, 99, f"{what} compute capability", path) for c in cc)
        _check_type(text, str, f"{what} PTX text", path)
        if ".entry" not in text or entry not in text:
            raise BundleError(f"{path!r}: {what} is not PTX defining the entry {entry!r:.60}")
        ptx.append((cc, text))
    ccs = [cc for cc, _ in ptx]
    if not ptx or ccs != sorted(set(ccs)):
        raise BundleError(f"{path!r}: field {where}.ptx must list one PTX per target, "
                          f"targets ascending, got targets {ccs}")

    args = []
    for i, item in enumerate(_check_type(obj["args"], list, f"{where}.args", path)):
        what = f"{where}.args[{i}]"
        _check_type(item, list, what, path)
        if len(item) not in (4, 5):
            raise BundleError(
                f"{path!r}: field {what} must be [kind, dtype, ndim, layout] or, for an "
                "enum, [kind, dtype, ndim, layout, enum class]")
        kind = _check_type(item[0], str, f"{what} kind", path)
        dtype = _check_type(item[1], str, f"{what} dtype", path)
        ndim = _check_int(item[2], 0, 0 if kind == "scalar" else 32, f"{what} ndim", path)
        layout = _check_type(item[3], str, f"{what} layout", path)
        enum = [_check_type(item[4], str, f"{what} enum class", path)] if len(item) == 5 else []
        args.append((kind, dtype, ndim, layout, *enum))

    writes = [_check_int(w, 0, max(len(args) - 1, 0), f"{where}.writes", path)
              for w in _check_type(obj["writes"], list, f"{where}.writes", path)]
    if writes != sorted(set(writes)):
        raise BundleError(f"{path!r}: field {where}.writes must be ascending and unique, "
                          f"got {writes}")
    grid_ndim = _check_int(obj["grid_ndim"], 0, 3, f"{where}.grid_ndim", path)

    links = []
    for i, item in enumerate(_check_type(obj["links"], list, f"{where}.links", path)):
        what = f"{where}.links[{i}]"
        _check_type(item, dict, what, path)
        _check_keys(item, _LINK_KEYS, what, path)
        lname = _check_type(item["name"], str, f"{what}.name", path)
        kind = _check_type(item["kind"], str, f"{what}.kind", path)
        if kind not in _LINK_KINDS:
            raise BundleError(f"{path!r}: field {what}.kind must be one of "
                              f"{sorted(_LINK_KINDS)}, got {kind!r:.40}")
        try:
            data = base64.b64decode(_check_type(item["data"], str, f"{what}.data", path),
                                    validate=True)
        except binascii.Error:
            raise BundleError(f"{path!r}: field {what}.data is not base64") from None
        links.append((lname, kind, data))

    options = []
    seen = set()
    for i, item in enumerate(_check_type(obj["options"], list, f"{where}.options", path)):
        what = f"{where}.options[{i}]"
        key, value = _check_pair(item, what, path)
        _check_type(key, str, f"{what} name", path)
        if key not in _OPTION_TYPES:
            raise BundleError(f"{path!r}: field {what} is an unknown option {key!r:.40}; "
                              f"this daskgpu knows {sorted(_OPTION_TYPES)}")
        if key in seen:
            raise BundleError(f"{path!r}: option {key!r} appears twice in {where}.options")
        seen.add(key)
        _check_type(value, _OPTION_TYPES[key], f"{what} ({key})", path)
        if key == "max_registers" and value is not None:
            _check_int(value, 1, 255, f"{what} (max_registers)", path)
        options.append((key, value))

    versions = []
    for i, item in enumerate(_check_type(obj["versions"], list, f"{where}.versions", path)):
        what = f"{where}.versions[{i}]"
        key, value = _check_pair(item, what, path)
        versions.append((_check_type(key, str, what, path), _check_type(value, str, what, path)))

    exceptions = []
    for i, item in enumerate(_check_type(obj["exceptions"], list, f"{where}.exceptions", path)):
        what = f"{where}.exceptions[{i}]"
        _check_type(item, list, what, path)
        if len(item) != 4:
            raise BundleError(f"{path!r}: field {what} must be [code, class, args, location]")
        code = _check_int(item[0], 1, 2**31 - 1, f"{what} code", path)
        cls = _check_type(item[1], str, f"{what} class", path)
        if not _CLASS_RE.fullmatch(cls):
            raise BundleError(f"{path!r}: field {what} class {cls!r:.80} is not a class name")
        exc_args = [_check_type(a, (str, int, float, bool), f"{what} args", path)
                    for a in _check_type(item[2], list, f"{what} args", path)]
        loc = item[3]
        if loc is not None:
            _check_type(loc, list, f"{what} location", path)
            if len(loc) != 3:
                raise BundleError(f"{path!r}: field {what} location must be [function, file, line]")
            loc = (_check_type(loc[0], str, f"{what} location", path),
                   _check_type(loc[1], str, f"{what} location", path),
                   _check_int(loc[2], 0, 2**31 - 1, f"{what} location line", path))
        exceptions.append((code, cls, tuple(exc_args), loc))

    fields = {"name": name, "entry": entry, "ptx": ptx, "args": args, "writes": writes,
              "grid_ndim": grid_ndim, "links": links, "options": options,
              "versions": versions, "exceptions": exceptions}
    try:
        return _rebuild_image(fields)
    except (TypeError, ValueError, IndexError) as exc:
        raise BundleError(f"{path!r}: {where} is not a valid kernel image: {exc}") from None
