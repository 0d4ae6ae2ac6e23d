"""The bundle document: its header and top-level fields, its serialization, and
parsing bounded in size and nesting before the JSON parser runs."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from daskgpu._errors import BundleError
from daskgpu._image.bundle.checks import check_keys, check_type
from daskgpu._image.bundle.images import decode_image, encode_image
from daskgpu._image.bundle.integrity import (
    DIGEST_FIELD,
    HMAC_FIELD,
    check_integrity,
    check_signature_field,
    digest,
    seal,
)

FORMAT = "daskgpu-bundle"
VERSION = 1

#: The largest bundle file read, and the deepest nesting of JSON arrays and objects
#: parsed (a bundle nests 5 deep); both checked before the JSON parser runs.
MAX_BYTES = 256 << 20
MAX_DEPTH = 16

TOP_KEYS = {"format", "version", "daskgpu", "images", DIGEST_FIELD}
# A JSON string (skipped whole), or one bracket: enough to measure nesting depth.
_DEPTH_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
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
    from daskgpu import __version__

    return __version__


# -- reading --------------------------------------------------------------------
def read_bundle_bytes(path: str) -> bytes:
    """The bytes of the file at ``path``, refused unread when larger than :data:`MAX_BYTES`."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise BundleError(f"{path!r} is {size} bytes, more than a kernel bundle may "
                                  f"be ({MAX_BYTES}); it is not a daskgpu bundle")
            return f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise BundleError(f"no kernel bundle at {path!r}: the file does not exist") from None
    except IsADirectoryError:
        raise BundleError(f"{path!r} is a directory, not a kernel bundle file") from None


def decode_bundle(raw: bytes, path: str, secret=None) -> tuple:
    """``(images, BundleInfo)`` of the bundle file ``raw`` read from ``path``.

    The bytes are parsed as JSON only, after their nesting depth is checked;
    then the header, the sha256 (and with ``secret`` the HMAC), the top-level
    fields and every image are validated.

    Raises
    ------
    BundleError
        Naming what is wrong and, where there is one, the fix.
    """
    document = _parse(raw, path)
    _check_header(document, path)
    content = check_integrity(document, path, secret)
    check_keys(document, TOP_KEYS, "the bundle", path, optional={HMAC_FIELD})
    check_signature_field(document, path)
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
            f"({daskgpu_version()}) reads bundle version {VERSION} and older. "
            "Upgrade daskgpu: pip install -U daskgpu"
        )
