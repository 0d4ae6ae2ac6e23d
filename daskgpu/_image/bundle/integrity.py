"""A bundle's integrity hash and its optional HMAC seal.

Both are taken over the canonical serialization of the bundle's content
(everything but the two hashes: keys sorted, no whitespace). The sha256 catches
corruption but seals nothing: whoever can change the file can recompute it.
The HMAC, with a secret key, lets only holders of the key make a bundle that
loads.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

from daskgpu._errors import BundleError

#: The document fields that hold the hashes; everything else is content.
DIGEST_FIELD = "sha256"
HMAC_FIELD = "hmac-sha256"
HEX64_RE = re.compile(r"[0-9a-f]{64}")


def canonical(content: dict) -> bytes:
    """The bytes the hashes are taken over: sorted keys, no whitespace, UTF-8."""
    return json.dumps(content, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")


def digest(content: dict) -> str:
    """The sha256 (hex) of the canonical serialization of ``content``."""
    return hashlib.sha256(canonical(content)).hexdigest()


def seal(secret: bytes, content: dict) -> str:
    """The HMAC-SHA256 (hex) of the canonical serialization of ``content`` under ``secret``."""
    return hmac.new(secret, canonical(content), hashlib.sha256).hexdigest()


def signing_key(key):
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


def check_integrity(document: dict, path: str, secret) -> dict:
    """The content of ``document`` once its sha256, and with ``secret`` its HMAC, match.

    Raises
    ------
    BundleError
        When the hash is missing or does not match (corrupt), the HMAC field
        is present but not 64 hex digits, a string is not valid Unicode, or, with a
        secret, the bundle is unsigned or its HMAC does not match (changed, or
        signed with another key).
    """
    expected = document.get(DIGEST_FIELD)
    if not isinstance(expected, str) or not HEX64_RE.fullmatch(expected):
        raise BundleError(f"{path!r} has no valid 'sha256' integrity hash; it is corrupt. "
                          "Write it again with dg.save or daskgpu compile.")
    check_signature_field(document, path)
    signature = document.get(HMAC_FIELD)
    content = {k: v for k, v in document.items() if k not in (DIGEST_FIELD, HMAC_FIELD)}
    if _digest_of_parsed(content, path) != expected:
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
                and hmac.compare_digest(signature, seal(secret, content))):
            raise BundleError(
                f"{path!r} fails its HMAC: it was changed after it was signed, or signed "
                "with another key. Load only bundles signed with your key; write it again "
                "with dg.save(kernel, path, key=...)")
    return content


def _digest_of_parsed(content: dict, path: str) -> str:
    try:
        return digest(content)
    except UnicodeEncodeError as exc:  # a lone surrogate escape such as \\ud800
        raise BundleError(
            f"{path!r} is not a daskgpu bundle: it holds a string that is not valid Unicode "
            f"({exc.object[exc.start:exc.end]!r}: {exc.reason}). Bundles are written by "
            "dg.save or daskgpu compile.") from None


def check_signature_field(document: dict, path: str) -> None:
    """Refuse an ``hmac-sha256`` field that is present but not 64 hex digits."""
    signature = document.get(HMAC_FIELD)
    if signature is not None and not (isinstance(signature, str)
                                      and HEX64_RE.fullmatch(signature)):
        raise BundleError(f"{path!r}: field {HMAC_FIELD} must be 64 hex digits")
