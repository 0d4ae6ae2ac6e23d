"""The xoroshiro128+ jump table and host reference, against numba.cuda.random on the CPU."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from numba.cuda.random import (
    init_xoroshiro128p_states_cpu,
    xoroshiro128p_dtype,
    xoroshiro128p_jump,
    xoroshiro128p_next,
)

from daskgpu._image.random_states import (
    CHAR_POLY,
    JUMP_TABLE,
    STATE_DTYPE,
    RandomStates,
    _apply,
    host_states,
    splitmix64,
)

SEEDS = [0, 1, 12345, 2**63 + 7, 2**64 - 1]


def numba_states(seed, n, start=0):
    states = np.empty(n, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, np.uint64(seed), start)
    return states


def test_state_dtype_is_numbas():
    assert STATE_DTYPE == xoroshiro128p_dtype


def test_char_poly_from_the_generators_output():
    # Berlekamp-Massey on one output bit of Numba's own generator.
    state = np.array([(1, 2)], dtype=xoroshiro128p_dtype)
    bits = [int(xoroshiro128p_next(state, 0)) & 1 for _ in range(512)]
    c, b, length, m = [1] + [0] * 511, [1] + [0] * 511, 0, -1
    for i in range(512):
        d = bits[i]
        for j in range(1, length + 1):
            d ^= c[j] & bits[i - j]
        if d:
            t = c[:]
            for j in range(512 - i + m):
                c[i - m + j] ^= b[j]
            if length <= i // 2:
                length, m, b = i + 1 - length, i, t
    assert length == 128
    assert CHAR_POLY == sum(1 << (length - j) for j in range(length + 1) if c[j])


def test_first_table_entry_is_numbas_jump():
    rng = np.random.default_rng(0)
    states = np.empty(16, xoroshiro128p_dtype)
    states["s0"] = rng.integers(0, 2**63, 16, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    states["s1"] = rng.integers(0, 2**63, 16, dtype=np.uint64)
    want = states.copy()
    for i in range(16):
        xoroshiro128p_jump(want, i)
    poly = int(JUMP_TABLE[0, 0]) | int(JUMP_TABLE[0, 1]) << 64
    s0, s1 = _apply(poly, states["s0"], states["s1"])
    np.testing.assert_array_equal(s0, want["s0"])
    np.testing.assert_array_equal(s1, want["s1"])
    assert int(JUMP_TABLE[0, 0]) == 0xBEAC0467EBA5FACB
    assert int(JUMP_TABLE[0, 1]) == 0xD86B048B86AA9922
    assert not JUMP_TABLE.flags.writeable


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("start", [0, 1, 777, 40_000])
def test_host_states_equal_numbas(seed, start):
    np.testing.assert_array_equal(
        host_states(seed, np.arange(start, start + 300, dtype=np.uint64)),
        numba_states(seed, 300, start))


@pytest.mark.parametrize("chunks", [(300,), (1, 299), (7, 93, 100, 100), (150, 150)])
def test_any_chunking_gives_the_same_states(chunks):
    want = numba_states(99, 300)
    edges = np.cumsum((0,) + chunks)
    got = np.concatenate([host_states(99, np.arange(a, b, dtype=np.uint64))
                          for a, b in zip(edges[:-1], edges[1:])])
    np.testing.assert_array_equal(got, want)


def _jump_matrix_powers(count):
    """Numba's jump as a 128x128 GF(2) matrix (columns), squared ``count`` times."""
    cols, state = [], np.zeros(1, xoroshiro128p_dtype)
    for b in range(128):
        state["s0"], state["s1"] = (np.uint64(1 << b), 0) if b < 64 else (0, np.uint64(1 << (b - 64)))
        xoroshiro128p_jump(state, 0)
        cols.append(int(state[0]["s0"]) | int(state[0]["s1"]) << 64)

    def apply(m, v):
        r = 0
        for b in range(128):
            if v >> b & 1:
                r ^= m[b]
        return r

    powers = [cols]
    for _ in range(count - 1):
        powers.append([apply(powers[-1], c) for c in powers[-1]])
    return powers, apply


@pytest.mark.parametrize("g", [2**32, 2**32 + 12345, 2**40 + 3, 2**50 - 1, 2**63 + 2**33 + 5])
def test_offsets_above_2_32_against_numbas_jump_by_matrix_powers(g):
    # An independent route to state g: Numba's own jump, as a matrix, raised to g.
    powers, apply = _jump_matrix_powers(64)
    z = splitmix64(31)
    v, k, rest = z | z << 64, 0, g
    while rest:
        if rest & 1:
            v = apply(powers[k], v)
        rest >>= 1
        k += 1
    got = host_states(31, [g, g + 1])
    assert (int(got[0]["s0"]), int(got[0]["s1"])) == (v & (2**64 - 1), v >> 64)
    # And the next state is Numba's jump of this one, as create_xoroshiro128p_states makes it.
    after = got[:1].copy()
    xoroshiro128p_jump(after, 0)
    assert after[0] == got[1]


def test_random_states_placeholder():
    s = RandomStates(-1, 10, start=2**40)
    assert s.seed == 2**64 - 1 and (s.n, s.start) == (10, 2**40)
    assert pickle.loads(pickle.dumps(s)) == s
    assert repr(RandomStates(3)) == "random_states(seed=3)"
    with pytest.raises(TypeError, match="integer seed"):
        RandomStates(1.5)
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        RandomStates(2**64)
    with pytest.raises(ValueError, match="non-negative integer n"):
        RandomStates(1, -3)
    with pytest.raises(ValueError, match=r"past state 2\*\*64"):
        RandomStates(1, 10, start=2**64 - 5)
