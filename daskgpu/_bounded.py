"""``BoundedCache``: the one bounded, thread-safe cache every daskgpu cache is built on."""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["BoundedCache"]


class BoundedCache:
    """At most ``maxsize`` entries by key; the least recently used goes first.

    Reads take no lock (a dict read is atomic), so a hit on a hot path costs a
    dictionary lookup; a miss makes its entry under the lock, so two threads
    never make the same entry twice. An evicted entry is only dropped from the
    cache: whoever still holds it may go on using it.

    Parameters
    ----------
    maxsize : int
        The most entries kept; at least 1.
    what : str
        What the entries are, for error messages.

    Examples
    --------
    >>> cache = BoundedCache(2, "squares")
    >>> cache.get(3, lambda: 3 * 3)
    9
    >>> _ = cache.get(4, lambda: 16); _ = cache.get(5, lambda: 25)
    >>> 3 in cache, len(cache)
    (False, 2)
    """

    def __init__(self, maxsize: int, what: str = "entries"):
        if int(maxsize) < 1:
            raise ValueError(f"a cache of {what} needs maxsize of at least 1, got {maxsize!r}")
        self.maxsize = int(maxsize)
        self.what = what
        self.made = 0  # how many misses made an entry, for tests and diagnostics
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, key, default=None):
        """The entry for ``key``, or ``default``; marks it recently used."""
        entry = self._entries.get(key, default)
        if entry is not default:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: still valid
                pass
        return entry

    def get(self, key, make):
        """The entry for ``key``, calling ``make()`` once on a miss."""
        entry = self._entries.get(key, _MISSING)
        if entry is not _MISSING:
            return entry
        with self._lock:
            entry = self._entries.get(key, _MISSING)
            if entry is _MISSING:
                entry = make()
                self.made += 1
                self._insert(key, entry)
            return entry

    def put(self, key, entry) -> None:
        """Keep ``entry`` for ``key``, evicting the least recently used when full."""
        with self._lock:
            self._insert(key, entry)

    def _insert(self, key, entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __repr__(self):
        return f"<BoundedCache of {self.what}: {len(self)}/{self.maxsize}>"


_MISSING = object()
