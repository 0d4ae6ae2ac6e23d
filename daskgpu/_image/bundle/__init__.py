"""The kernel bundle format: compiled kernels as a data-only file.

A bundle is one JSON document (UTF-8), so reading it can never run code::

    {"format": "daskgpu-bundle", "version": 1, "daskgpu": "0.1.0",
     "images": [{"name": ..., "entry": ..., "ptx": [[[7, 5], "<PTX text>"]],
                 "args": [["array", "float32", 1, "C"]], "writes": [0],
                 "grid_ndim": 1, "links": [{"name": ..., "kind": ..., "data": "<base64>"}],
                 "options": [["fastmath", false]], "versions": [["numba-cuda", "0.30.4"]],
                 "exceptions": [[1, "ValueError", ["n too big"], ["k", "k.py", 8]]],
                 "positions": [["bound", 0, 0, 0, "k.py:6"]]}],
     "sha256": "<hex>", "hmac-sha256": "<hex>"}

``positions`` (optional: older bundles lack it) records how the kernel uses its thread's
position (:mod:`daskgpu._image.position_uses`), by which a map decides whether it may
group chunks; a bundle without it is mapped one launch per chunk unless asked otherwise.

``sha256`` is taken over the canonical serialization of everything else (keys
sorted, no whitespace), so corruption is caught on load. It is no seal: whoever
can change the file can recompute it. With a secret key (the ``key=`` argument
of :func:`daskgpu.save`, or the ``daskgpu.bundle-key`` setting), a bundle also
carries ``hmac-sha256`` over the same bytes, and with a key set a bundle whose
HMAC is missing or does not match is refused, so only holders of the key can
make a bundle that loads. Before anything is parsed, a file is bounded in size
(:data:`MAX_BYTES`) and, in one pass linear in its size, in nesting depth
(:data:`MAX_DEPTH`); whatever its bytes, a malformed file raises
:class:`~daskgpu.BundleError` and nothing else. Exception classes named in a
bundle are refused unless they are ordinary builtin exceptions
(:data:`BUILTIN_EXCEPTIONS`), by bare name, or ``module:qualname`` outside the
packages a worker runs on
(:data:`RESERVED_PACKAGES`: ``distributed:Reschedule`` would reschedule a
failing debug kernel forever); a worker resolves them only from modules
already imported, and only to ``Exception`` subclasses. The
Python function is never stored: a bundle is PTX-only even while
``daskgpu.simulate`` is on.

Modules: :mod:`.document` (header, top-level fields, bounded parsing,
serialization), :mod:`.images` (one image, field group by field group),
:mod:`.integrity` (sha256 and HMAC), :mod:`.checks` (the field checks, and the
exception classes a table may name). Like
the rest of the image layer, nothing here imports numba, a GPU library or
dask; the runtime's ``save``/``load`` turn kernels into bundles and back.
"""

from daskgpu._image.bundle.checks import (
    BUILTIN_EXCEPTIONS,
    RESERVED_PACKAGES,
    exception_name_refusal,
    reserved_module,
)
from daskgpu._image.bundle.document import (
    FORMAT,
    MAX_BYTES,
    MAX_DEPTH,
    VERSION,
    BundleInfo,
    bundle_bytes,
    decode_bundle,
    encode_bundle,
    read_bundle_bytes,
)
from daskgpu._image.bundle.images import decode_image, encode_image
from daskgpu._image.bundle.integrity import digest, signing_key

__all__ = [
    "BUILTIN_EXCEPTIONS",
    "FORMAT",
    "MAX_BYTES",
    "MAX_DEPTH",
    "RESERVED_PACKAGES",
    "VERSION",
    "BundleInfo",
    "bundle_bytes",
    "decode_bundle",
    "decode_image",
    "digest",
    "encode_bundle",
    "encode_image",
    "exception_name_refusal",
    "read_bundle_bytes",
    "reserved_module",
    "signing_key",
]
