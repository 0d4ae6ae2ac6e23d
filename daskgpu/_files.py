"""File reads and writes that cannot be turned against their caller.

Writes are durable: a file is there whole, or not at all, also after a crash.
Reads take regular files only and a bounded number of bytes: a FIFO, a device
or a huge file at a path that should hold a small one is refused without
blocking and without being read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

#: Flags of every read: never wait on a FIFO's writer, never adopt a terminal,
#: never leak the descriptor into a child process.
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))

_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def atomic_write(path, data: bytes = b"", *, mode: int = 0o644,
                 sync_folder: bool = True) -> None:
    """Write ``path`` whole or not at all, durably.

    The bytes go to a temporary sibling, which is synced, renamed over ``path``,
    and then the directory is synced, so that the rename itself survives a
    power cut. Readers (other workers sharing a directory, on a network
    filesystem too) see the old file or the new one, never part of one; a
    failed write leaves no temporary file behind.

    Parameters
    ----------
    path : str or os.PathLike
    data : bytes
    mode : int
        The new file's permissions (before the umask).
    sync_folder : bool
        False leaves syncing the directory to the caller, who writes several
        files into it and then syncs it once (:func:`fsync`): until then a
        power cut may lose the rename, never leave part of a file.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "note")
    >>> atomic_write(path, b"done")
    >>> open(path, "rb").read(), os.listdir(os.path.dirname(path))
    (b'done', ['note'])
    """
    _publish(path, data, mode, os.replace, sync_folder)


def write_new(path, data: bytes, *, mode: int = 0o600) -> bool:
    """Write ``path`` whole and durably, only if nothing is there yet.

    Like :func:`atomic_write`, but the synced temporary file is hard-linked to
    ``path``, which fails when ``path`` exists: of several processes creating
    one file at once, exactly one wins and all read the winner's bytes.

    Returns
    -------
    bool
        Whether this call created ``path`` (False: something was there).

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "secret")
    >>> write_new(path, b"first"), write_new(path, b"second"), open(path, "rb").read()
    (True, False, b'first')
    """
    try:
        _publish(path, data, mode, os.link)
    except FileExistsError:
        return False
    return True


def _publish(path, data: bytes, mode: int, move, sync_folder: bool = True) -> None:
    """Write ``data`` to a synced temporary sibling of ``path``, then ``move`` it there."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        move(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):  # renamed away, or a link to drop
            os.unlink(tmp)
    if sync_folder:
        fsync(folder)


@contextlib.contextmanager
def open_regular(path, limit: int, *, follow: bool = True):
    """Open ``path`` for reading only when it is a regular file of at most ``limit`` bytes.

    The open never blocks (a FIFO without a writer would block a plain
    ``open`` forever), and the checks are made with ``fstat`` on the opened
    descriptor, so the file checked is the file read.

    Parameters
    ----------
    path : str or os.PathLike
    limit : int
        The largest size accepted, in bytes; a larger file is refused unread.
    follow : bool
        Whether a symbolic link at ``path`` is followed (False: refused).

    Yields
    ------
    (int, os.stat_result)
        The open descriptor (closed on exit) and its status, for the caller's
        own checks (owner, permissions).

    Raises
    ------
    OSError
        ``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``; with
        ``follow=False`` a link fails with ``ELOOP``; a FIFO, device, socket or
        too large a file raises a plain ``OSError`` whose message names it.
    """
    flags = _READ_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{os.fspath(path)!r} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise OSError(f"{os.fspath(path)!r} is {kind}, not a regular file; "
                          "name the file itself")
        if st.st_size > limit:
            raise OSError(f"{os.fspath(path)!r} is {st.st_size} bytes, more than the "
                          f"{limit} bytes such a file may be")
        yield fd, st
    finally:
        os.close(fd)


def read_rest(fd: int, limit: int) -> bytes:
    """The bytes of ``fd`` from its position to the end, refused past ``limit`` of them.

    Reads what ``fstat`` says is left in one call, then checks for the end;
    a file that grows past ``limit`` while being read raises instead of
    filling memory.
    """
    left = os.fstat(fd).st_size - os.lseek(fd, 0, os.SEEK_CUR)
    parts, total = [], 0
    while True:
        chunk = os.read(fd, min(max(left - total, 1 << 16), limit + 1 - total))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise OSError(f"the file grew past {limit} bytes while it was read")


def read_regular(path, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, read without blocking.

    See :func:`open_regular` for what is refused and how.

    Examples
    --------
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "small"), "wb") as f:
    ...     _ = f.write(b"data")
    >>> read_regular(os.path.join(folder, "small"), 16)
    b'data'
    >>> os.mkfifo(os.path.join(folder, "pipe"))
    >>> read_regular(os.path.join(folder, "pipe"), 16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    OSError: '...pipe' is a named pipe (FIFO), not a regular file; name the file itself
    """
    with open_regular(path, limit, follow=follow) as (fd, _):
        return read_rest(fd, limit)


def fsync(path) -> None:
    """Flush a file or directory to disk, where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
    except OSError:  # absent (zarr stores no chunk that is all fill value), or Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse to sync a directory
        pass
    finally:
        os.close(fd)


#: The most syncs :func:`at_once` issues together.
SYNC_THREADS = 16


def at_once(fn, items) -> list:
    """``[fn(item) for item in items]``, up to :data:`SYNC_THREADS` calls at a time.

    For writes that each end in a sync: syncs issued together to one disk
    coalesce (a journal commits them in one transaction), so a few hundred
    small files cost a fraction of syncing them one after another (a third
    here), with the same guarantee for each. The first error is raised once
    every call has ended.

    Examples
    --------
    >>> at_once(len, ["a", "bb", "ccc"])
    [1, 2, 3]
    """
    items = list(items)
    if len(items) <= 1:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(SYNC_THREADS, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
    return [f.result() for f in futures]


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
