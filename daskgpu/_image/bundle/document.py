"""The bundle document: its header and top-level fields, its serialization, and
parsing bounded in size and nesting before the JSON parser runs.

Every bound is checked in time linear in the file's size, before the sha256 or
the HMAC can be, since both are taken over the parsed content: a file of
:data:`MAX_BYTES` is refused or parsed within seconds, whatever it holds.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import numpy as np

from daskgpu._errors import BundleError
from daskgpu._files import open_regular, read_rest
from daskgpu._image.bundle.checks import check_keys, check_type
from daskgpu._image.bundle.images import decode_image, encode_image
from daskgpu._image.bundle.integrity import (
    DIGEST_FIELD,
    HMAC_FIELD,
    check_integrity,
    digest,
    seal,
)

FORMAT = "daskgpu-bundle"
VERSION = 1

#: The largest bundle file read, and the deepest nesting of JSON arrays and objects
#: parsed (a bundle nests 5 deep); both checked before the JSON parser runs. A
#: bundle is PTX text and the user's link files (cudadevrt is linked on the
#: worker, not carried): tens of MB at most. 64 MiB bounds what parsing a hostile
#: file may cost to about a second and a GB of memory.
MAX_BYTES = 64 << 20
MAX_DEPTH = 16
#: The most digits a JSON integer may have: a bundle's are below 2**31, and
#: Python's int() of a long digit string takes time quadratic in its length.
MAX_INT_DIGITS = 20

TOP_KEYS = {"format", "version", "daskgpu", "images", DIGEST_FIELD}
# The nesting step of each byte: +1 opens an array or object, -1 closes one.
_STEPS = np.zeros(256, np.int8)
_STEPS[list(b"[{")] = 1
_STEPS[list(b"]}")] = -1
_QUOTE = ord('"')
_SCAN_CHUNK = 1 << 20  # bytes per step of the depth scan: bounds its memory
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


# -- writing --------------------------------------------------------------------
def encode_bundle(images, path: str) -> dict:
    """The content of a bundle of ``images`` (all but its hashes), checked to decode again.

    ``path`` is only for messages: the content is never one that
    :func:`decode_bundle` would refuse.
    """
    content = {
        "format": FORMAT,
        "version": VERSION,
        "daskgpu": daskgpu_version(),
        "images": [encode_image(im) for im in images],
    }
    for i, encoded in enumerate(content["images"]):  # never write what load refuses
        decode_image(encoded, i, path)
    return content


def bundle_bytes(content: dict, secret=None) -> tuple:
    """``(file bytes, sha256)`` of a bundle with ``content``, sealed with ``secret`` if given."""
    sha256 = digest(content)
    document = dict(content, **{DIGEST_FIELD: sha256})
    if secret is not None:
        document[HMAC_FIELD] = seal(secret, content)
    text = json.dumps(document, sort_keys=True, indent=1, ensure_ascii=False)
    return (text + "\n").encode("utf-8"), sha256


def daskgpu_version() -> str:
    """The version of daskgpu, as a bundle records its producer."""
    from daskgpu._version import __version__

    return __version__


# -- reading --------------------------------------------------------------------
def read_bundle_bytes(path: str) -> bytes:
    """The bytes of the regular file at ``path``, refused unread when larger than :data:`MAX_BYTES`.

    The file is opened without blocking and refused unless it is a regular
    file: a FIFO would block the read forever, and a device such as
    ``/dev/zero`` has no size to check.
    """
    try:
        with open_regular(path, limit=sys.maxsize) as (fd, st):
            if st.st_size > MAX_BYTES:
                raise _too_large(st.st_size, path)
            try:
                return read_rest(fd, MAX_BYTES)
            except OSError:  # it grew past the limit after it was measured
                raise _too_large(MAX_BYTES + 1, path) from None
    except FileNotFoundError:
        raise BundleError(f"no kernel bundle at {path!r}: the file does not exist") from None
    except IsADirectoryError:
        raise BundleError(f"{path!r} is a directory, not a kernel bundle file") from None
    except OSError as exc:  # a FIFO, device or socket; unreadable
        raise BundleError(f"cannot read a kernel bundle: {exc}; a kernel bundle is a file "
                          "written by dg.save or daskgpu compile") from None


def _too_large(size: int, path: str) -> BundleError:
    return BundleError(f"{path!r} is {size} bytes, more than a kernel bundle may be "
                       f"({MAX_BYTES}); it is not a daskgpu bundle")


def decode_bundle(raw: bytes, path: str, secret=None) -> tuple:
    """``(images, BundleInfo)`` of the bundle file ``raw`` read from ``path``.

    The bytes are parsed as JSON only, after their size and nesting depth are
    checked; then the header, the sha256 (and with ``secret`` the HMAC), the
    top-level fields and every image are validated.

    Raises
    ------
    BundleError
        Naming what is wrong and, where there is one, the fix; no other
        exception comes out of a malformed ``raw``.
    """
    document = _parse(raw, path)
    _check_header(document, path)
    content = check_integrity(document, path, secret)
    check_keys(document, TOP_KEYS, "the bundle", path, optional={HMAC_FIELD})
    producer = check_type(document["daskgpu"], str, "daskgpu", path)
    images = check_type(document["images"], list, "images", path)
    if not images:
        raise BundleError(f"{path!r} holds no compiled image")
    images = tuple(decode_image(im, i, path) for i, im in enumerate(images))
    info = BundleInfo(path=path, version=content["version"], producer=producer,
                      sha256=document[DIGEST_FIELD], size=len(raw),
                      signed=document.get(HMAC_FIELD) is not None)
    return images, info


def _parse(raw: bytes, path: str) -> dict:
    if raw.startswith(_PICKLE_PROTOCOLS):
        raise BundleError(
            f"{path!r} is a pickle, not a daskgpu bundle; daskgpu never unpickles a bundle. "
            "Bundles are JSON files written by dg.save or daskgpu compile."
        )
    if len(raw) > MAX_BYTES:
        raise _too_large(len(raw), path)
    _check_depth(raw, path)
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                              parse_constant=_no_constant, parse_float=_finite_float,
                              parse_int=_short_int)
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
    """Refuse nesting deeper than :data:`MAX_DEPTH`, which the JSON parser would recurse into.

    One vectorized pass, linear in ``len(raw)``: escaped backslashes, then
    escaped quotes, are dropped first (left to right, as JSON reads them), so
    that every quote left opens or closes a string, and a bracket counts
    where the quotes before it are even. Past the first place where ``raw``
    is not JSON the count may be wrong, but the parser stops there.
    """
    plain = np.frombuffer(raw.replace(b"\\\\", b"").replace(b'\\"', b""), np.uint8)
    depth, in_string = 0, False
    for start in range(0, plain.size, _SCAN_CHUNK):
        chunk = plain[start:start + _SCAN_CHUNK]
        inside = np.logical_xor.accumulate(chunk == _QUOTE)  # quote parity
        if in_string:
            np.logical_not(inside, out=inside)
        steps = _STEPS[chunk]
        steps[inside] = 0
        levels = np.cumsum(steps, dtype=np.int32)
        if depth + int(levels.max()) > MAX_DEPTH:
            raise BundleError(f"{path!r} nests JSON more than {MAX_DEPTH} levels deep; it "
                              "is not a daskgpu bundle (bundles nest 5 deep)")
        depth, in_string = depth + int(levels[-1]), bool(inside[-1])


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as inf, which no field holds
        raise ValueError(f"the number {text:.40} is out of range")
    return value


def _short_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} characters; no field holds more than "
                         f"{MAX_INT_DIGITS} digits")
    return int(text)


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
            f"({daskgpu_version()}) reads bundle version {VERSION} and older. "
            "Upgrade daskgpu: pip install -U daskgpu"
        )
