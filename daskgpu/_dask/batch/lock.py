"""One writer per batch output: a lock that a run holds from start to end.

The lock is a sibling file of the output (``.NAME.daskgpu-lock``), not a
file inside it, so that it survives ``--no-resume`` replacing the output
directory. It is taken with ``flock``, which the kernel releases when the
holding process dies: a crashed or killed run never blocks the next one. The
file names the holder (host, pid, job nonce) for the refusal message and is
removed when the run ends. A lock file that cannot be removed then (its folder
turned read-only) is a warning, not a failure: the run's chunks are written,
and a left-over ``flock`` file blocks no later run.

A second lock, :func:`writers`, orders the chunk tasks' writes against a run
that replaces the output: tasks of a run whose client died can outlive it on
the workers.

Some network filesystems refuse ``flock`` (Lustre without ``-o flock``, NFS
without a lock manager). There the lock is the file itself, created with
``O_CREAT | O_EXCL``; a holder on this host whose process is gone is taken
over, and one on another host can only be removed by hand, once no run is
alive there (the message says so).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import warnings

from daskgpu._dask.batch.ledger import LEDGER
from daskgpu._errors import BatchError

__all__ = ["OutputLock", "WRITERS", "lock_path", "writers"]

#: ``flock`` errors meaning "this filesystem does not do it", not "someone holds it".
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def lock_path(output) -> str:
    """The lock file of the output ``output``: a hidden sibling.

    Examples
    --------
    >>> lock_path("/data/z.zarr")
    '/data/.z.zarr.daskgpu-lock'
    """
    folder, name = os.path.split(os.path.abspath(os.fspath(output)))
    return os.path.join(folder, f".{name}.daskgpu-lock")


class OutputLock:
    """An exclusive lock on one batch output, for one run; a context manager.

    Parameters
    ----------
    output : path
        The output zarr array (which need not exist yet).
    nonce : str
        The job instance taking it, recorded for the refusal message.

    Raises
    ------
    BatchError
        From :meth:`acquire`, when another live run holds the output; its
        ``__cause__`` is a :class:`BlockingIOError`.

    Examples
    --------
    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "z.zarr")
    >>> with OutputLock(out, "job-a"):
    ...     OutputLock(out, "job-b").acquire()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskgpu._errors.BatchError: another daskgpu batch run (pid ...) is writing ...
    >>> os.path.exists(lock_path(out))
    False
    """

    def __init__(self, output, nonce):
        self.output, self.path = os.fspath(output), lock_path(output)
        self._holder = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                   "job": nonce}).encode()
        self._fd = None
        self._exclusive = False

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise :class:`BatchError` naming the run that holds it."""
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise BatchError(f"cannot create the output {self.output!r}: the directory "
                             f"{folder!r} does not exist")
        fd = self._flock()
        if fd is None:  # the filesystem has no flock
            self._take_exclusive()
            self._exclusive = True
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._holder, 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock back and remove its file; a no-op when not held.

        A file that cannot be removed is left, with a :class:`RuntimeWarning`
        that says whether it blocks a later run; the lock is released anyway.
        """
        if self._fd is None and not self._exclusive:
            return
        try:  # removed while still held, so no one locks a file on its way out
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            warnings.warn(self._left_behind(exc), RuntimeWarning, stacklevel=2)
        finally:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._exclusive = None, False

    def _left_behind(self, exc) -> str:
        reason = exc.strerror or type(exc).__name__
        if self._fd is not None:  # flock: the next run locks the file as it is
            return (f"could not remove the lock file {self.path!r} of {self.output!r} "
                    f"({reason}); it blocks no later run, remove it when its folder is "
                    "writable again")
        return (f"could not remove the lock file {self.path!r} of {self.output!r} "
                f"({reason}); a later run on this host takes it over, one on another host "
                "is refused until it is removed by hand")

    def _flock(self):
        """The open, locked lock file; None where the filesystem refuses flock."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                os.close(fd)
                raise self._busy() from exc
            except OSError as exc:
                os.close(fd)
                if exc.errno in _NO_FLOCK:
                    return None
                raise
            # The holder before us may have removed the file after we opened it.
            try:
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def _take_exclusive(self) -> None:
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_holder(self.path)
                if holder and holder.get("host") == socket.gethostname() and not _alive(
                        holder.get("pid")):
                    _unlink(self.path)  # its run died: the lock is stale
                    continue
                raise self._busy(stale_hint=True) from BlockingIOError(errno.EEXIST, self.path)
            try:
                os.write(fd, self._holder)
            finally:
                os.close(fd)
            return
        raise self._busy() from BlockingIOError(errno.EEXIST, self.path)

    def _busy(self, stale_hint=False) -> BatchError:
        holder = _read_holder(self.path) or {}
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', 'an unknown host')}"
        hint = (f"; if no run is alive there, remove {self.path!r}" if stale_hint else "")
        return BatchError(f"another daskgpu batch run ({who}) is writing {self.output!r}: "
                          f"wait for it to end, or choose another output{hint}")


def _read_holder(path):
    try:
        with open(path, "rb") as f:
            holder = json.loads(f.read(4096).decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


#: The file, in the output's ledger folder, that orders chunk writes against replacing it.
WRITERS = "writers.lock"


@contextlib.contextmanager
def writers(output, exclusive: bool = False):
    """Hold ``output``'s writers' lock: shared (a chunk task) or exclusive (replacing it).

    A chunk task holds it shared from checking its job's nonce to recording the
    chunk; a run that replaces the output holds it exclusive while it swaps the
    directories. A write already in flight so lands in the old output, deleted
    after, and any later one reads the new job's nonce and writes nothing: a task
    of a run whose client died, on workers that lived on, cannot put its chunk in
    a new job's output. The file lives in the output's ledger folder and goes with
    it; where there is none yet, or the filesystem refuses ``flock``, nothing is held.

    Examples
    --------
    >>> import tempfile
    >>> with writers(tempfile.mkdtemp()):  # no ledger folder: nothing to hold
    ...     pass
    """
    import fcntl

    try:
        fd = os.open(os.path.join(os.fspath(output), LEDGER, WRITERS), os.O_RDWR | os.O_CREAT,
                     0o644)
    except (FileNotFoundError, NotADirectoryError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
