"""Caches of linked kernels: in memory per (image hash, device), and on disk."""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

from daskgpu._files import atomic_write


class ModuleCache:
    """Linked kernels keyed by ``(image hash, device id)``, least recently used out.

    Parameters
    ----------
    maxsize : int
        How many linked kernels to keep over all devices.
    """

    def __init__(self, maxsize: int = 256):
        if maxsize < 1:
            raise ValueError(f"ModuleCache maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.links = 0  # how many times a miss linked, for tests and diagnostics

    def lookup(self, key):
        """The entry for ``key``, or None; lock-free, since dict reads are atomic."""
        entry = self._entries.get(key)
        if entry is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: still valid
                pass
        return entry

    def get(self, key, build):
        """The entry for ``key``, calling ``build()`` once on a miss."""
        entry = self.lookup(key)
        if entry is not None:
            return entry
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
            # Linking under the lock keeps two threads from linking the same
            # kernel twice; links are rare and short.
            entry = build()
            self.links += 1
            self._entries[key] = entry
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
            return entry

    def __len__(self):
        return len(self._entries)

    def __contains__(self, key):
        return key in self._entries

    def clear(self):
        with self._lock:
            self._entries.clear()


class DiskCache:
    """Cubins on disk, keyed by image hash, compute capability and tool versions.

    The versions of the driver and nvJitLink are part of the key, so an upgrade
    links afresh rather than loading a cubin an older toolchain made.
    """

    def __init__(self, directory: str):
        self.directory = os.path.abspath(os.path.expanduser(directory))

    def path(self, image_hash: str, cc: tuple, versions: tuple) -> str:
        key = hashlib.sha256(f"{image_hash}|{cc}|{versions}".encode()).hexdigest()
        return os.path.join(self.directory, f"{key}.cubin")

    def load(self, image_hash, cc, versions) -> bytes | None:
        """The stored cubin, or None when missing or not an ELF file (then relink)."""
        try:
            with open(self.path(image_hash, cc, versions), "rb") as f:
                data = f.read()
        except OSError:
            return None
        return data if data.startswith(b"\x7fELF") else None

    def store(self, image_hash, cc, versions, cubin: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        # A concurrent reader sees the whole cubin or none.
        atomic_write(self.path(image_hash, cc, versions), cubin)
