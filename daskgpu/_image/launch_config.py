"""Launch configurations: grid and block, or forall-style task counts.

Plain values that compare, hash and pickle by their dimensions; checked here
against what any device accepts, and against a device's own limits by the
runtime that launches them.
"""

from __future__ import annotations

import operator

from daskgpu._errors import LaunchConfigError, PicklingError


def _dims(value, what: str) -> tuple:
    dims = value if isinstance(value, tuple | list) else (value,)
    if not 1 <= len(dims) <= 3:
        raise LaunchConfigError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    try:
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise LaunchConfigError(f"{what} must be integers, got {value!r}") from None
    if any(d < 1 for d in dims):
        raise LaunchConfigError(
            f"{what} {value!r} has a dimension below 1; every dimension must be at least 1"
        )
    return dims + (1,) * (3 - len(dims))


def _whole(value, what: str, fix: str) -> int:
    """``value`` as an int; a float (``8.0``) or other non-integer is a LaunchConfigError."""
    try:
        return operator.index(value)
    except TypeError:
        raise LaunchConfigError(f"{what} must be a whole number (an int), got {value!r}; "
                                f"{fix}") from None


class LaunchConfig:
    """How to launch: ``griddim``/``blockdim``, or forall-style ``ntasks``/``tpb``.

    Parameters
    ----------
    griddim, blockdim : int or tuple of int
        Blocks per grid and threads per block (1 to 3 dimensions).
    stream : int or stream object, optional
        The CUDA stream; 0 or None is the legacy default stream.
    sharedmem : int
        Dynamic shared memory per block, in bytes.
    ntasks : int or tuple of int, optional
        For a forall launch: the number of tasks per dimension; the block size
        then comes from the occupancy API of the linked kernel.
    tpb : int
        Threads per block for a forall launch; 0 asks the occupancy API.

    Examples
    --------
    >>> LaunchConfig(4, 128)
    LaunchConfig(griddim=(4, 1, 1), blockdim=(128, 1, 1))
    >>> LaunchConfig(ntasks=1000)
    LaunchConfig(ntasks=1000)
    """

    __slots__ = ("griddim", "blockdim", "stream", "sharedmem", "ntasks", "tpb", "_key")

    def __init__(self, griddim=None, blockdim=None, stream=0, sharedmem=0, *,
                 ntasks=None, tpb=0):
        if ntasks is None:
            if griddim is None or blockdim is None:
                raise LaunchConfigError("a launch needs both griddim and blockdim")
            griddim, blockdim = _dims(griddim, "griddim"), _dims(blockdim, "blockdim")
        else:
            if isinstance(ntasks, list):
                ntasks = tuple(ntasks)
            counts = ntasks if isinstance(ntasks, tuple) else (ntasks,)
            if not 1 <= len(counts) <= 3 or any(
                    _whole(n, "forall ntasks", "write forall(8), not forall(8.0)") < 0
                    for n in counts):
                # Numba's words first: code written against numba matches them.
                raise LaunchConfigError(
                    f"Can't create ForAll with negative task count: {ntasks!r} (forall "
                    f"ntasks must be 1 to 3 non-negative integers, got {ntasks!r})"
                    if 1 <= len(counts) <= 3 else
                    f"forall ntasks must be 1 to 3 non-negative integers, got {ntasks!r}"
                )
            if _whole(tpb, "tpb", "write e.g. tpb=128, or 0 for automatic") < 0:
                raise LaunchConfigError(f"tpb must be 0 (automatic) or positive, got {tpb!r}")
        if _whole(sharedmem, "sharedmem", "give dynamic shared memory in bytes") < 0:
            raise LaunchConfigError(f"sharedmem must be non-negative, got {sharedmem!r}")
        self.griddim, self.blockdim = griddim, blockdim
        self.stream, self.sharedmem = stream, int(sharedmem)
        self.ntasks, self.tpb = ntasks, int(tpb)
        # Configs key the runtime's per-kernel caches on every launch: hash once.
        self._key = hash(self._identity())

    def _identity(self):
        # An int stream is a handle, equal by value; a stream object by identity.
        stream = 0 if self.stream is None else self.stream
        if not isinstance(stream, int):
            stream = ("object", id(stream))
        return (self.griddim, self.blockdim, self.sharedmem, self.ntasks, self.tpb, stream)

    def __eq__(self, other):
        return self is other or (
            isinstance(other, LaunchConfig) and self._identity() == other._identity()
        )

    def __hash__(self):
        return self._key

    def __repr__(self):
        if self.ntasks is not None:
            parts = [f"ntasks={self.ntasks}"] + ([f"tpb={self.tpb}"] if self.tpb else [])
        else:
            parts = [f"griddim={self.griddim}", f"blockdim={self.blockdim}"]
        if self.sharedmem:
            parts.append(f"sharedmem={self.sharedmem}")
        if self.stream not in (None, 0):
            parts.append(f"stream={self.stream!r}")
        return f"LaunchConfig({', '.join(parts)})"

    def __reduce__(self):
        if self.stream not in (None, 0):
            raise PicklingError(
                "a launch bound to a CUDA stream cannot be shipped to another process; "
                "configure it without a stream (kernel.configure(griddim, blockdim))"
            )
        return _rebuild_config, (self.griddim, self.blockdim, self.sharedmem,
                                 self.ntasks, self.tpb)


def _rebuild_config(griddim, blockdim, sharedmem, ntasks, tpb):
    return LaunchConfig(griddim, blockdim, 0, sharedmem, ntasks=ntasks, tpb=tpb)
