"""Durable file writes: a file is there whole, or not at all, also after a crash."""

from __future__ import annotations

import os
import secrets


def atomic_write(path, data: bytes = b"") -> None:
    """Write ``path`` whole or not at all, durably.

    The bytes go to a temporary sibling, which is synced, renamed over ``path``,
    and then the directory is synced, so that the rename itself survives a
    power cut. Readers (other workers sharing a directory, on a network
    filesystem too) see the old file or the new one, never part of one; a
    failed write leaves no temporary file behind.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "note")
    >>> atomic_write(path, b"done")
    >>> open(path, "rb").read(), os.listdir(os.path.dirname(path))
    (b'done', ['note'])
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync(folder)


def fsync(path) -> None:
    """Flush a file or directory to disk, where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # absent (zarr stores no chunk that is all fill value), or Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse to sync a directory
        pass
    finally:
        os.close(fd)


def fsync_up(path, root) -> None:
    """Flush ``path`` and every directory from its own up to ``root``, included.

    A file created in new nested directories (zarr's ``c/0/1``) survives a
    crash only once each new directory entry is on disk too.
    """
    path, root = os.path.abspath(path), os.path.abspath(root)
    fsync(path)
    folder = os.path.dirname(path)
    while True:
        fsync(folder)
        if len(folder) <= len(root) or folder == os.path.dirname(folder):
            break
        folder = os.path.dirname(folder)
