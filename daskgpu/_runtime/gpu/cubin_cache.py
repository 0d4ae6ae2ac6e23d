"""Caches of linked kernels: in memory per (image hash, device), and cubins on disk."""

from __future__ import annotations

import hashlib
import os

from daskgpu._bounded import BoundedCache
from daskgpu._files import atomic_write


class ModuleCache(BoundedCache):
    """Linked kernels keyed by ``(image hash, device id)``, least recently used out.

    A :class:`~daskgpu._bounded.BoundedCache` of at most ``maxsize`` entries
    over all devices, where a hit also marks the entry recently used. The
    entries are :class:`~daskgpu._runtime.gpu.linked_kernel.LinkedKernel`
    objects; an evicted one stays loaded while a launch still holds it.

    Parameters
    ----------
    maxsize : int
        How many linked kernels to keep over all devices
        (``daskgpu.module-cache-size``).
    """

    def __init__(self, maxsize: int = 256):
        super().__init__(maxsize, "linked kernels")

    @property
    def links(self) -> int:
        """How many times a miss linked, for tests and diagnostics."""
        return self.made

    def get(self, key, build):
        """The entry for ``key``, calling ``build()`` once on a miss.

        Linking under the cache's lock keeps two threads from linking the same
        kernel twice; links are rare and short.
        """
        entry = self.lookup(key)
        if entry is not None:
            return entry
        return super().get(key, build)


class DiskCache:
    """Cubins on disk, keyed by image hash, compute capability and tool versions.

    The versions of the driver and nvJitLink are part of the key, so an upgrade
    links afresh rather than loading a cubin an older toolchain made. Each
    entry is a header (:data:`MAGIC`, the cubin's length and sha256) followed
    by the cubin; :meth:`load` returns only an entry whose length and hash
    match, so a torn, truncated or corrupt file (a crash mid-write, a partial
    copy on a network filesystem, a bad disk) reads as missing: the caller
    links afresh and :meth:`store` replaces it.

    Examples
    --------
    >>> import tempfile
    >>> disk = DiskCache(tempfile.mkdtemp())
    >>> disk.store("abc", (9, 0), ("12.8",), b"\\x7fELF...")
    >>> disk.load("abc", (9, 0), ("12.8",))
    b'\\x7fELF...'
    >>> with open(disk.path("abc", (9, 0), ("12.8",)), "r+b") as f:
    ...     _ = f.seek(-1, 2); _ = f.write(b"!")  # one byte changed
    >>> disk.load("abc", (9, 0), ("12.8",)) is None
    True
    """

    #: The first bytes of every entry: format name and version.
    MAGIC = b"daskgpu-cubin-1\n"

    def __init__(self, directory: str):
        self.directory = os.path.abspath(os.path.expanduser(directory))

    def path(self, image_hash: str, cc: tuple, versions: tuple) -> str:
        key = hashlib.sha256(f"{image_hash}|{cc}|{versions}".encode()).hexdigest()
        return os.path.join(self.directory, f"{key}.cubin")

    def load(self, image_hash, cc, versions) -> bytes | None:
        """The stored cubin, or None when missing or damaged (then relink and store)."""
        try:
            with open(self.path(image_hash, cc, versions), "rb") as f:
                data = f.read()
        except OSError:
            return None
        if not data.startswith(self.MAGIC):
            return None
        header, sep, cubin = data[len(self.MAGIC):].partition(b"\n")
        try:
            size, digest = header.decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            return None
        if (not sep or size != str(len(cubin)) or not cubin.startswith(b"\x7fELF")
                or hashlib.sha256(cubin).hexdigest() != digest):
            return None
        return cubin

    def store(self, image_hash, cc, versions, cubin: bytes) -> None:
        """Write an entry whole: a synced temporary sibling, renamed over the old one.

        Readers on other machines see the old entry or the new one; a reader
        that sees neither whole (some network filesystems) fails the hash.
        """
        cubin = bytes(cubin)
        os.makedirs(self.directory, exist_ok=True)
        header = self.MAGIC + f"{len(cubin)} {hashlib.sha256(cubin).hexdigest()}\n".encode()
        atomic_write(self.path(image_hash, cc, versions), header + cubin)
