"""Launch configurations: grid and block, or forall-style task counts, and their geometry.

Plain values that compare, hash and pickle by their dimensions; checked here
against what any device accepts, and against a device's own limits
(:class:`DeviceLimits`) by the runtime that launches them. A forall's grid and
block (:func:`launch_dims`) are pure arithmetic over the task counts and the
block size the occupancy API gives, so the simulator and the GPU share them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from daskgpu._errors import LaunchConfigError, PicklingError


def _dims(value: object, what: str) -> tuple[int, ...]:
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


def _whole(value: Any, what: str, fix: str) -> int:
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

    griddim: tuple[int, ...] | None  # 3 ints; None for a forall launch
    blockdim: tuple[int, ...] | None
    stream: Any
    sharedmem: int
    ntasks: int | Sequence[int] | None
    tpb: int

    def __init__(self, griddim: int | Sequence[int] | None = None,
                 blockdim: int | Sequence[int] | None = None, stream: object = 0,
                 sharedmem: int = 0, *, ntasks: int | Sequence[int] | None = None,
                 tpb: int = 0) -> None:
        grid: tuple[int, ...] | None
        block: tuple[int, ...] | None
        if ntasks is None:
            if griddim is None or blockdim is None:
                raise LaunchConfigError("a launch needs both griddim and blockdim")
            grid, block = _dims(griddim, "griddim"), _dims(blockdim, "blockdim")
        else:
            grid = block = None  # a forall's come from the occupancy API where it runs
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
        self.griddim, self.blockdim = grid, block
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

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, LaunchConfig) and self._identity() == other._identity()
        )

    def __hash__(self) -> int:
        return self._key

    def __repr__(self) -> str:
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


def task_counts(config) -> tuple | None:
    """A forall config's task counts as a tuple; None for a grid-and-block config.

    Examples
    --------
    >>> task_counts(LaunchConfig(ntasks=10)), task_counts(LaunchConfig(ntasks=(4, 5)))
    ((10,), (4, 5))
    >>> task_counts(LaunchConfig(1, 32)) is None
    True
    """
    ntasks = config.ntasks
    if ntasks is None:
        return None
    return ntasks if isinstance(ntasks, tuple) else (ntasks,)


@dataclass(frozen=True)
class DeviceLimits:
    """What a device accepts: threads per block, block and grid sizes, shared memory."""

    max_threads_per_block: int
    max_block_dim: tuple
    max_grid_dim: tuple
    max_shared_memory_per_block: int

    def check(self, griddim, blockdim, sharedmem, kernel_max_threads, name):
        """Raise :class:`LaunchConfigError` for a configuration the device refuses."""
        threads = blockdim[0] * blockdim[1] * blockdim[2]
        limit = min(self.max_threads_per_block, kernel_max_threads)
        problems = []
        if threads > limit:
            problems.append(
                f"block {blockdim} has {threads} threads, but kernel {name!r} allows at "
                f"most {limit} per block on this device"
                + (" (limited by its register use)"
                   if kernel_max_threads < self.max_threads_per_block else "")
            )
        if any(b > m for b, m in zip(blockdim, self.max_block_dim)):
            problems.append(
                f"block {blockdim} exceeds the device's block limits {self.max_block_dim}")
        if any(g > m for g, m in zip(griddim, self.max_grid_dim)):
            problems.append(
                f"grid {griddim} exceeds the device's grid limits {self.max_grid_dim}")
        if sharedmem > self.max_shared_memory_per_block:
            problems.append(
                f"dynamic shared memory of {sharedmem} bytes exceeds the device's "
                f"{self.max_shared_memory_per_block} bytes per block"
            )
        if problems:
            raise LaunchConfigError(
                "; ".join(problems) + ". Choose a smaller configuration, or use "
                "kernel.forall(n) to let daskgpu pick the block size."
            )


# -- the geometry of a forall launch -----------------------------------------------

def launch_dims(config, block_size, max_grid=(2**31 - 1, 65535, 65535)):
    """``(griddim, blockdim)`` as 3-tuples; forall configs get occupancy blocks.

    ``block_size`` is the occupancy API's block size for the kernel: an int, or
    a callable taking the dynamic shared memory in bytes, called only when
    the config gives no ``tpb``.

    Examples
    --------
    >>> launch_dims(LaunchConfig(ntasks=1000), 256)
    ((4, 1, 1), (256, 1, 1))
    >>> launch_dims(LaunchConfig(ntasks=(100, 3)), lambda sharedmem: 1024)
    ((1, 1, 1), (256, 4, 1))
    """
    ntasks = task_counts(config)
    if ntasks is None:
        return config.griddim, config.blockdim
    size = config.tpb or (block_size(config.sharedmem) if callable(block_size) else block_size)
    block = fit_grid(ntasks, block_shape(size, ntasks), max_grid)
    grid = tuple(max(1, -(-n // b)) for n, b in zip(ntasks, block))
    return pad3(grid), pad3(block)


_MAX_BLOCK = (1024, 1024, 64)


def fit_grid(ntasks: tuple, block: tuple, max_grid: tuple) -> tuple:
    """``block`` reshaped, its thread count kept, so that no grid axis exceeds its limit.

    The y and z grid axes take at most 65535 blocks: an axis of more tasks
    gets more threads of the block, taken from the axes that need them least.
    """
    shape = list(block)
    total = math.prod(shape)
    for axis, n in enumerate(ntasks):
        need = -(-n // max_grid[axis])
        while shape[axis] < need:
            if shape[axis] * 2 > _MAX_BLOCK[axis]:
                raise LaunchConfigError(
                    f"forall over {ntasks} tasks needs more than {max_grid[axis]} blocks "
                    f"along axis {axis} even with {shape[axis]} threads of each block there; "
                    "the device cannot launch that grid. Put the longest axis first "
                    "(grid x allows 2**31 - 1 blocks) or split the launch."
                )
            shape[axis] *= 2
            others = [a for a in range(len(shape)) if a != axis and shape[a] > 1]
            if math.prod(shape) > total and others:
                widest = max(others, key=lambda a: shape[a])
                shape[widest] //= 2
    return tuple(shape)


def block_shape(size: int, ntasks: tuple) -> tuple:
    """A block of at most ``size`` threads for an N-D forall over ``ntasks``.

    Kernels index ``a[i, j]`` with ``i, j = cuda.grid(2)``, so the last axis is
    the contiguous one of a C-ordered chunk. A warp is 32 consecutive threads
    in x-fastest order; blocks one thread wide in x (and y, for 3-D) make each
    warp run along the last axis, where its loads coalesce.
    """
    if len(ntasks) == 1:
        return (size,)
    inner_limit = 1024 if len(ntasks) == 2 else 64  # the device's block y / z limits
    last = _pow2_at_least(ntasks[-1])
    if last >= 32:  # a whole warp fits along the last axis: give it all of x (and y)
        return (1,) * (len(ntasks) - 1) + (min(size, inner_limit, last),)
    rest = max(1, size // last)
    if len(ntasks) == 2:
        return (rest, last)
    middle = min(rest, _pow2_at_least(ntasks[1]))
    return (max(1, rest // middle), middle, last)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def pad3(dims) -> tuple:
    """``dims`` with trailing 1s up to three axes.

    Examples
    --------
    >>> pad3((4, 2))
    (4, 2, 1)
    """
    return tuple(dims) + (1,) * (3 - len(dims))
