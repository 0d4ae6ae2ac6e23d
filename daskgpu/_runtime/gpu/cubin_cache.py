"""Caches of linked kernels: in memory per (image hash, device), and cubins on disk."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
import time
import warnings

from daskgpu._bounded import BoundedCache
from daskgpu._files import atomic_write, open_regular, read_rest, write_new


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
        kernel twice; links are rare and short. ``build`` must not touch files:
        the disk cache is read and written outside the lock.
        """
        entry = self.lookup(key)
        if entry is not None:
            return entry
        return super().get(key, build)


class DiskCache:
    """Cubins on disk, keyed by image hash, compute capability and tool versions.

    The versions of the driver and nvJitLink are part of the key, so an upgrade
    links afresh rather than loading a cubin an older toolchain made.

    It loads only entries it can prove this user wrote. Before first use the
    directory is made (mode 0700) and checked: owned by this user, and not
    writable by group or others; otherwise the cache is off for this object,
    with one warning, and kernels are linked in memory. Each entry is a header
    (:data:`MAGIC`, the cubin's length and an HMAC-SHA256 of the entry's key
    and cubin, keyed by a secret kept in the directory's :data:`SECRET` file,
    mode 0600) followed by the cubin. :meth:`load` opens only regular files
    that this user owns, without following links or blocking, refuses any over
    :data:`MAX_ENTRY_BYTES` unread, and reads the rest of an entry only after
    its header fits its size. A planted, torn, truncated or corrupt entry
    reads as missing: the caller links afresh and :meth:`store` replaces it.
    A store that fails (a full disk, a read-only directory) warns once and
    is otherwise ignored: the cache never fails a launch.

    The entries' total size stays within ``max_bytes``: before a store, and
    once on this object's first load (a directory filled under a larger bound
    is brought within this one even while every load hits), the entries of
    other driver or nvJitLink versions go first (their file names start with a
    tag of the versions), then the least recently used (a load that hits
    touches its entry's modification time, before that first eviction). Several
    processes may share the directory: evictions and stores take turns under
    an exclusive lock on the file :data:`LOCK` (``flock``; where there is none,
    Windows, two stores at once may exceed the bound by one entry), so
    processes with one bound keep it; files that vanish meanwhile are skipped,
    and another process's temporary files are not counted (those left by a
    crash are removed after :data:`STALE_TEMPORARY_SECONDS`). A store that
    waits over :data:`LOCK_SECONDS` for the lock is dropped, with a warning. A
    reader keeps the entry it has opened even when it is evicted meanwhile.

    Parameters
    ----------
    directory : str
        Where the entries live (``daskgpu.cache-dir``); ``~`` is expanded.
    max_bytes : int
        The bound on the entries' total size (``daskgpu.cache-bytes``); a
        cubin larger than it is not stored.

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
    MAGIC = b"daskgpu-cubin-2\n"
    #: The largest entry read; a larger file at an entry's path is a miss, unread.
    MAX_ENTRY_BYTES = 256 << 20
    #: The file in the directory holding this user's secret for the entries' HMACs.
    SECRET = "secret.key"
    #: The bytes read for an entry's header: MAGIC, a length, 64 hex digits.
    HEADER_BYTES = 128
    #: Seconds after which another process's temporary file is taken for a crash's leftover.
    STALE_TEMPORARY_SECONDS = 3600
    #: The file in the directory whose lock evictions and stores hold.
    LOCK = "store.lock"
    #: Seconds a store waits for another process's eviction or store before it is dropped.
    LOCK_SECONDS = 10.0

    def __init__(self, directory: str, max_bytes: int = 1 << 30):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.max_bytes = int(max_bytes)
        self._secret = None  # bytes once checked; False when the cache is off
        self._warned = set()
        self._bounded = False  # whether the entries were brought within max_bytes here

    def path(self, image_hash: str, cc: tuple, versions: tuple) -> str:
        """The file of the entry for this image, compute capability and tool versions.

        Its name is ``<versions tag>-<key>.cubin``: eviction tells the entries
        of other tool versions by the tag alone, without opening them.
        """
        name = f"{_versions_tag(versions)}-{_key(image_hash, cc, versions).hex()}.cubin"
        return os.path.join(self.directory, name)

    def load(self, image_hash, cc, versions) -> bytes | None:
        """The stored cubin, or None when missing, damaged or not ours (then relink and store)."""
        secret = self._ready()
        if not secret:
            return None
        cubin = self._verified(secret, image_hash, cc, versions)
        if cubin is not None:
            with contextlib.suppress(OSError, NotImplementedError):  # gone meanwhile
                # Used now: the last to be evicted.
                os.utime(self.path(image_hash, cc, versions), follow_symlinks=False)
        if not self._bounded:  # once: a cache filled under a larger bound comes within this
            self._bounded = True
            self._evict_to_bound(0, _versions_tag(versions))
        return cubin

    def _verified(self, secret, image_hash, cc, versions) -> bytes | None:
        """The entry's cubin when it is ours and whole; else None."""
        try:
            entry = self._read(self.path(image_hash, cc, versions))
        except OSError:  # absent, a link, a FIFO, a device, too large, unreadable
            return None
        if entry is None:
            return None
        mac, cubin = entry
        expected = _mac(secret, _key(image_hash, cc, versions), cubin)
        if not hmac.compare_digest(mac, expected) or not cubin.startswith(b"\x7fELF"):
            return None
        return cubin

    def store(self, image_hash, cc, versions, cubin: bytes) -> None:
        """Write an entry whole: a synced temporary sibling, renamed over the old one.

        Readers on other machines see the old entry or the new one; a reader
        that sees neither whole (some network filesystems) fails the HMAC. A
        write the filesystem refuses warns once per cache and is dropped.
        """
        cubin = bytes(cubin)
        secret = self._ready()
        if not secret or len(cubin) > self.MAX_ENTRY_BYTES - self.HEADER_BYTES:
            return
        mac = _mac(secret, _key(image_hash, cc, versions), cubin)
        header = self.MAGIC + f"{len(cubin)} {mac}\n".encode()
        if len(header) + len(cubin) > self.max_bytes:
            self._warn("large", f"daskgpu did not store a linked kernel of "
                                f"{len(header) + len(cubin)} bytes in its cubin cache "
                                f"{self.directory!r}: daskgpu.cache-bytes bounds the whole "
                                f"cache at {self.max_bytes} bytes. Raise that setting to keep "
                                "kernels this large.")
            return
        self._bounded = True  # every store evicts what its own room needs
        self._evict_to_bound(len(header) + len(cubin), _versions_tag(versions),
                             write=(self.path(image_hash, cc, versions), header + cubin))

    def _evict_to_bound(self, size: int, tag: str, write=None) -> None:
        """Under the directory's lock, make room for ``size`` bytes, then write
        ``write`` (``(path, bytes)``) if given; a failure warns once and is dropped."""
        try:
            with self._locked() as held:
                if not held:
                    self._warn("lock", f"daskgpu's cubin cache {self.directory!r} was locked "
                                       f"by another process for over {self.LOCK_SECONDS:g} "
                                       "s, so a linked kernel was not stored (or the cache "
                                       "not trimmed to daskgpu.cache-bytes) this time; if "
                                       "no daskgpu process is stuck, remove "
                                       f"{os.path.join(self.directory, self.LOCK)!r}.")
                    return
                self.make_room(size, tag)
                if write is not None:
                    atomic_write(write[0], write[1], mode=0o600)
        except OSError as exc:
            self._warn("store", f"daskgpu could not store a linked kernel in its cubin cache "
                                f"{self.directory!r} ({exc}); kernels that cannot be stored "
                                "are linked again in each new process. Free space in or "
                                "grant write access to that directory, or unset "
                                "daskgpu.cache-dir.")

    @contextlib.contextmanager
    def _locked(self):
        """Hold the directory's exclusive lock; yields whether it was got in time.

        ``flock`` on a file of the directory: released when the descriptor
        closes, also when a process dies holding it. Without ``fcntl``
        (Windows) nothing is locked.
        """
        try:
            import fcntl
        except ImportError:
            yield True
            return
        flags = (os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0))
        fd = os.open(os.path.join(self.directory, self.LOCK), flags, 0o600)
        try:
            deadline, got = time.monotonic() + self.LOCK_SECONDS, False
            while not got:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    got = True
                except BlockingIOError:  # another process evicts or stores: short
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
            yield got
        finally:
            os.close(fd)  # releases the lock

    def entries(self) -> list:
        """``(name, size, mtime_ns)`` of every entry file now in the directory.

        Only names that entries have count (the secret and temporary files
        do not); files that vanish while the directory is read are left out.
        """
        return self._scan(stale_before=None)

    def make_room(self, size: int, tag: str) -> int:
        """Evict entries until ``size`` more bytes fit in :attr:`max_bytes`; the bytes freed.

        Entries whose versions tag is not ``tag`` (other driver or nvJitLink
        versions, or older file names) go first, then the least recently
        used. A file another process evicted first counts as freed.
        """
        entries = self._scan(stale_before=time.time() - self.STALE_TEMPORARY_SECONDS)
        room = self.max_bytes - size - sum(e[1] for e in entries)
        if room >= 0:
            return 0
        # Oldest first within each group; the name breaks ties, so processes agree.
        entries.sort(key=lambda e: (e[0].startswith(tag + "-"), e[2], e[0]))
        freed = 0
        for name, entry_size, _ in entries:
            if freed + room >= 0:
                break
            with contextlib.suppress(FileNotFoundError):  # another process was first
                os.unlink(os.path.join(self.directory, name))
            freed += entry_size
        return freed

    def _scan(self, stale_before):
        """The entries, as :meth:`entries`; temporary files older than ``stale_before``
        (seconds since the epoch; None: none) are removed on the way."""
        found = []
        with os.scandir(self.directory) as scan:
            for item in scan:
                entry = _ENTRY_NAME.fullmatch(item.name) is not None
                if not entry and (stale_before is None
                                  or not _TEMPORARY_NAME.fullmatch(item.name)):
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                    if entry:
                        if stat.S_ISREG(st.st_mode):
                            found.append((item.name, st.st_size, st.st_mtime_ns))
                    elif st.st_mtime < stale_before:  # a crashed store's leftover
                        os.unlink(item.path)
                except FileNotFoundError:  # evicted, replaced or renamed by another process
                    continue
        return found

    def _read(self, path: str):
        """``(mac, cubin)`` of the entry file at ``path``, or None when it is not one of ours."""
        with open_regular(path, self.MAX_ENTRY_BYTES, follow=False) as (fd, st):
            if _foreign(st):
                return None
            head = os.read(fd, self.HEADER_BYTES)
            if not head.startswith(self.MAGIC):
                return None
            line, sep, _ = head[len(self.MAGIC):].partition(b"\n")
            try:
                size, mac = line.decode("ascii").split(" ")
                start = len(self.MAGIC) + len(line) + 1
                if not sep or not size.isdigit() or start + int(size) != st.st_size:
                    return None
            except (UnicodeDecodeError, ValueError):
                return None
            os.lseek(fd, start, os.SEEK_SET)
            cubin = read_rest(fd, int(size))
        return (mac, cubin) if len(cubin) == int(size) else None

    def _ready(self):
        """This user's secret once the directory passed its checks; False when the cache is off."""
        if self._secret is None:
            problem = _directory_problem(self.directory)
            secret = None
            if problem is None:
                secret, problem = self._load_secret()
            if problem is not None:
                self._warn("off", f"daskgpu's cubin cache {self.directory!r} is not used: "
                                  f"{problem}. Kernels are linked in memory instead.")
            self._secret = secret or False
        return self._secret

    def _load_secret(self) -> tuple:
        """``(secret, None)``, made on first use, or ``(None, problem)``."""
        path = os.path.join(self.directory, self.SECRET)
        try:
            try:
                secret = _read_secret(path)
            except FileNotFoundError:
                write_new(path, secrets.token_bytes(32), mode=0o600)
                secret = _read_secret(path)  # ours, or the one another process made first
        except OSError as exc:
            return None, (f"its secret {path!r} cannot be made or read ({exc}); make the "
                          "directory writable, or set daskgpu.cache-dir to one you own")
        if secret is None:
            return None, (f"its secret {path!r} is not a private file of yours of 32 bytes "
                          "(mode 0600); remove that file, and daskgpu makes a new one")
        return secret, None

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


#: An entry's file name: a versions tag and a key (or, from before tags, a key alone).
_ENTRY_NAME = re.compile(r"(?:[0-9a-f]{16}-)?[0-9a-f]{64}\.cubin")
#: A temporary entry file, as :func:`~daskgpu._files.atomic_write` names it.
_TEMPORARY_NAME = re.compile(r"\.(?:[0-9a-f]{16}-)?[0-9a-f]{64}\.cubin\.\d+-[0-9a-f]{8}\.tmp")


def _versions_tag(versions) -> str:
    """16 hex digits naming the driver and nvJitLink versions, the start of an entry's name."""
    return hashlib.sha256(f"{versions}".encode()).hexdigest()[:16]


def _key(image_hash, cc, versions) -> bytes:
    return hashlib.sha256(f"{image_hash}|{cc}|{versions}".encode()).digest()


def _mac(secret: bytes, key: bytes, cubin: bytes) -> str:
    """The HMAC of an entry: it binds the cubin to its key, so entries cannot be swapped."""
    return hmac.new(secret, DiskCache.MAGIC + key + cubin, hashlib.sha256).hexdigest()


def _read_secret(path: str) -> bytes | None:
    """The secret in ``path``; None when it is not 32 bytes that only this user may read."""
    with open_regular(path, 64, follow=False) as (fd, st):
        if _foreign(st) or st.st_mode & 0o077:
            return None
        secret = read_rest(fd, 64)
    return secret if len(secret) == 32 else None


def _foreign(st) -> bool:
    """Whether a file or directory is someone else's, or others may write it."""
    if not hasattr(os, "geteuid"):  # Windows: no POSIX owners or modes to check
        return False
    return st.st_uid != os.geteuid() or bool(st.st_mode & 0o022)


def _directory_problem(directory: str) -> str | None:
    """Why ``directory`` cannot hold trusted entries (making it 0700 if absent), or None."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.stat(directory)
    except OSError as exc:
        return (f"it cannot be made ({exc}); set daskgpu.cache-dir to a directory you "
                "own, or unset it")
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory; set daskgpu.cache-dir to a directory, or unset it"
    if _foreign(st) and st.st_uid != os.geteuid():
        return (f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}), so its "
                "owner could put GPU code in it; set daskgpu.cache-dir to a directory you own")
    if _foreign(st):
        return (f"group or others may write it (mode {oct(stat.S_IMODE(st.st_mode))}), so "
                f"they could put GPU code in it; run chmod go-w {directory!r} (or chmod 700)")
    return None
