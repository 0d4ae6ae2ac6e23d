"""xoroshiro128+ random states as plain data: jump polynomials and a host reference.

Numba's ``numba.cuda.random`` makes state *g* of ``create_xoroshiro128p_states(n,
seed)`` by jumping the seed's SplitMix64 state ``g`` times by 2**64 steps.
xoroshiro128+ is linear over GF(2), so advancing a state by ``m`` steps is
multiplying it by the polynomial ``x**m`` modulo the generator's characteristic
polynomial, and applying such a polynomial costs 128 generator steps (Numba's
own jump is the polynomial ``x**(2**64)``). :data:`JUMP_TABLE` holds
``x**(2**64 * 2**k)`` for ``k = 0..63``: state *g* then costs one polynomial per
set bit of ``g``, O(log g) work, where Numba's host loop costs ``g`` jumps.

This module is numpy and Python integers only: the states kernel, the worker,
the simulator and the tests share it, and none of them needs numba for it.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

__all__ = ["JUMP_TABLE", "STATE_DTYPE", "RandomStates", "host_states", "splitmix64"]

#: ``numba.cuda.random.xoroshiro128p_dtype``, spelled without numba.
STATE_DTYPE = np.dtype([("s0", np.uint64), ("s1", np.uint64)], align=True)

#: States are indexed by a uint64 jump count: at most 2**64 of them.
MAX_STATES = 1 << 64

_M64 = (1 << 64) - 1

#: The characteristic polynomial of xoroshiro128+ (55, 14, 36) over GF(2), bit i
#: the coefficient of x**i; found by Berlekamp-Massey on the generator's output
#: (tests/image/test_random_states.py derives it again).
CHAR_POLY = 0x100653CED7F29F88A5FD66762F0E1C001


def _mulmod(a: int, b: int) -> int:
    """``a * b`` modulo :data:`CHAR_POLY`, polynomials over GF(2) as integers."""
    r = 0
    while b:
        if b & 1:
            r ^= a
        b >>= 1
        a <<= 1
        if a >> 128:
            a ^= CHAR_POLY
    return r


def _jump_polynomials() -> list:
    p = 2  # the polynomial x
    for _ in range(64):
        p = _mulmod(p, p)  # x**(2**64): Numba's jump
    table = []
    for _ in range(64):
        table.append(p)
        p = _mulmod(p, p)
    return table


_POLYS = _jump_polynomials()

#: ``JUMP_TABLE[k]`` is the polynomial of ``2**k`` jumps of 2**64 steps, as two
#: uint64 words (coefficients of x**0..63, then x**64..127), the form of the
#: ``jump`` constant in Numba's ``xoroshiro128p_jump``.
JUMP_TABLE = np.array([[p & _M64, p >> 64] for p in _POLYS], dtype=np.uint64)
JUMP_TABLE.flags.writeable = False


def splitmix64(seed: int) -> int:
    """The word Numba's ``init_xoroshiro128p_state`` puts in both halves of state 0."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def check_seed(seed) -> int:
    """``seed`` as an int in ``0 .. 2**64-1`` (negative seeds wrap, as in Numba), else TypeError."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (Integral, np.integer)):
        raise TypeError(f"random states need an integer seed, got {seed!r}")
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"seed {seed} does not fit in 64 bits; use 0 <= seed < 2**64")
    return seed & _M64


def host_states(seed: int, indices) -> np.ndarray:
    """States ``indices`` (global, uint64) of ``create_xoroshiro128p_states(n, seed)``, on the host.

    Vectorised over the indices: 128 generator steps per bit of the largest
    index. The simulator builds states with it, and it is the reference the
    device kernel is tested against.

    Examples
    --------
    >>> from daskgpu._image.random_states import host_states
    >>> s = host_states(42, [0, 1, 2**40])
    >>> s.dtype.names, s.shape
    (('s0', 's1'), (3,))
    """
    g = np.asarray(indices, dtype=np.uint64).ravel()
    z = np.uint64(splitmix64(check_seed(seed)))
    s0 = np.full(g.shape, z)
    s1 = s0.copy()
    top = int(g.max()).bit_length() if g.size else 0
    with np.errstate(over="ignore"):
        for k in range(top):
            sel = np.nonzero((g >> np.uint64(k)) & np.uint64(1))[0]
            if sel.size:
                s0[sel], s1[sel] = _apply(_POLYS[k], s0[sel], s1[sel])
    out = np.empty(g.shape, STATE_DTYPE)
    out["s0"], out["s1"] = s0, s1
    return out


_U = {n: np.uint64(n) for n in (14, 36, 55, 28, 9)}


def _apply(poly: int, s0, s1):
    """Advance states ``(s0, s1)`` by the jump polynomial ``poly`` (numpy uint64 arrays)."""
    a0 = np.zeros_like(s0)
    a1 = np.zeros_like(s1)
    for b in range(128):
        if poly >> b & 1:
            a0 ^= s0
            a1 ^= s1
        t = s1 ^ s0
        s0 = ((s0 << _U[55]) | (s0 >> _U[9])) ^ t ^ (t << _U[14])
        s1 = (t << _U[36]) | (t >> _U[28])
    return a0, a1


class RandomStates:
    """Stands for an array of xoroshiro128+ states built where the kernel runs.

    Made by :func:`daskgpu.random_states`. In :func:`daskgpu.map_kernel` (no
    ``n``) it expands per chunk to one state per element of the chunk's
    launch; in a launch (``n`` given) to ``n`` states from global index
    ``start``. State *g* equals state *g* of Numba's
    ``create_xoroshiro128p_states(n, seed)``.

    ``builder`` is the PTX-only states kernel the worker launches, compiled on
    the client; it is plain data like any shipped kernel.
    """

    __slots__ = ("seed", "n", "start", "builder")

    def __init__(self, seed, n=None, start=0, builder=None):
        self.seed = check_seed(seed)
        if n is not None:
            if not isinstance(n, (Integral, np.integer)) or isinstance(n, bool) or n < 0:
                raise ValueError(f"random_states needs a non-negative integer n, got {n!r}")
            n = int(n)
        if not isinstance(start, (Integral, np.integer)) or isinstance(start, bool) or start < 0:
            raise ValueError(f"random_states needs a non-negative integer start, got {start!r}")
        start = int(start)
        if start + (n or 0) > MAX_STATES:
            raise ValueError(
                f"random_states(start={start}, n={n}) reaches past state 2**64, the "
                "last one a uint64 jump count reaches; use start + n <= 2**64"
            )
        self.seed, self.n, self.start, self.builder = self.seed, n, start, builder

    def __reduce__(self):
        return RandomStates, (self.seed, self.n, self.start, self.builder)

    def __eq__(self, other):
        return isinstance(other, RandomStates) and self._identity() == other._identity()

    def __hash__(self):
        return hash(self._identity())

    def _identity(self):
        return (self.seed, self.n, self.start)

    def __dask_tokenize__(self):
        return ("daskgpu.random_states",) + self._identity()

    def __repr__(self):
        if self.n is None:
            return f"random_states(seed={self.seed})"
        return f"random_states(seed={self.seed}, n={self.n}, start={self.start})"
