"""The kernels many tests launch, defined once.

Import them by name (``from kit.kernels import saxpy``): tests/conftest.py puts
tests/ on ``sys.path``, and worker processes a test starts inherit it, so a
kernel's Python function, which simulated launches run, unpickles there too.

Each kernel's name (``saxpy``) is what launches report, errors name and
metrics label, whichever module launches it. The eager kernels compile once a
process, when this module is first imported; the lazy one compiles once per
argument types and keeps what it compiled for the tests after.

A kernel a command runs from a file of its own exists here as source too
(``SAXPY_FILE``), for ``daskgpu batch MODULE.py:FUNCTION`` and worker scripts.
"""

from numba import cuda
from numba.cuda.random import xoroshiro128p_uniform_float32

import daskgpu as dg

SAXPY_SIG = "void(float32[::1], float32, float32[::1], float32[::1])"
AFFINE_SIG = "void(float64[::1], float64, float64[::1])"
SCALE_SIG = "void(float32[::1], float32, float32[::1])"
SCALE64_SIG = "void(float64[::1], float64, float64[::1])"
DOUBLE_SIG = "void(float32[::1], float32[::1])"

SAXPY_FILE = '''
from numba import cuda

def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]
'''

AFFINE_FILE = '''
from numba import cuda

def affine(out, a, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0
'''


@dg.jit(SAXPY_SIG)
def saxpy(out, a, x, y):
    """``out = a * x + y`` in float32, compiled when this module is imported."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


#: The same function compiled lazily, for the argument types of each first launch.
saxpy_lazy = dg.jit(saxpy.py_func)


@dg.jit(SCALE_SIG)
def scale(out, a, x):
    """``out = a * x`` in float32."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i]


#: The same function in float64.
scale64 = dg.jit(SCALE64_SIG)(scale.py_func)

#: The same function compiled lazily, for the argument types of each first launch. A
#: test that counts what a lazy kernel compiled makes its own: ``dg.jit(scale.py_func)``.
scale_lazy = dg.jit(scale.py_func)


@dg.jit(DOUBLE_SIG)
def double(out, x):
    """``out = 2 * x`` in float32."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i]


@dg.jit(AFFINE_SIG)
def affine(out, a, x):
    """``out = a * x + 1`` in float64."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0


@dg.jit
def sum_diff(s, d, x, y):
    """``s = x + y`` and ``d = x - y`` over 2-D arrays: two outputs, compiled lazily."""
    i, j = cuda.grid(2)
    if i < s.shape[0] and j < s.shape[1]:
        s[i, j] = x[i, j] + y[i, j]
        d[i, j] = x[i, j] - y[i, j]


@dg.jit
def smooth(out, x):
    """``out[i] = x[i - 1] + x[i] + x[i + 1]`` inside the chunk, compiled lazily: with a
    halo (``depth=1``), a three-point stencil over the whole array."""
    i = cuda.grid(1)
    if 0 < i < x.size - 1:
        out[i] = x[i - 1] + x[i] + x[i + 1]


# -- time steps (dg.iterate) ------------------------------------------------------
#
# Each kernel copies the cells on its array's edge and updates the rest, so a step
# over a chunk extended by a halo is a step over the whole array; kit.stencils
# holds the same steps in NumPy.

@dg.jit
def heat_1d(out, u, a):
    """One explicit step of the 1-D heat equation, ``a`` the diffusion number."""
    i = cuda.grid(1)
    n = u.shape[0]
    if 0 < i < n - 1:
        out[i] = u[i] + a * (u[i - 1] - 2 * u[i] + u[i + 1])
    elif i < n:
        out[i] = u[i]


@dg.jit
def heat_2d(out, u, a):
    """One explicit step of the 2-D heat equation (five points)."""
    i, j = cuda.grid(2)
    n, m = u.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        out[i, j] = u[i, j] + a * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                                   - 4 * u[i, j])
    elif i < n and j < m:
        out[i, j] = u[i, j]


@dg.jit
def heat_3d(out, u, a):
    """One explicit step of the 3-D heat equation (seven points)."""
    i, j, k = cuda.grid(3)
    n, m, p = u.shape
    if 0 < i < n - 1 and 0 < j < m - 1 and 0 < k < p - 1:
        out[i, j, k] = u[i, j, k] + a * (
            u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] + u[i, j + 1, k]
            + u[i, j, k - 1] + u[i, j, k + 1] - 6 * u[i, j, k])
    elif i < n and j < m and k < p:
        out[i, j, k] = u[i, j, k]


@dg.jit
def wave_1d(u_next, u, u_prev, c2):
    """One leapfrog step of the 1-D wave equation: two states that rotate
    (``u_next`` becomes ``u``, ``u`` becomes ``u_prev``) over a fixed ``c2`` map."""
    i = cuda.grid(1)
    n = u.shape[0]
    if 0 < i < n - 1:
        u_next[i] = 2 * u[i] - u_prev[i] + c2[i] * (u[i - 1] - 2 * u[i] + u[i + 1])
    elif i < n:
        u_next[i] = u[i]


@dg.jit
def life(out, board):
    """One generation of Conway's Game of Life on a board of 0s and 1s."""
    i, j = cuda.grid(2)
    n, m = board.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        alive = 0
        for di in range(-1, 2):
            for dj in range(-1, 2):
                alive += board[i + di, j + dj]
        alive -= board[i, j]
        if alive == 3 or (alive == 2 and board[i, j]):
            out[i, j] = 1
        else:
            out[i, j] = 0
    elif i < n and j < m:
        out[i, j] = board[i, j]

@dg.jit
def hist(counts, x):
    """An 8-bin histogram of ``x`` (integers), counted atomically into ``counts``."""
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(counts, x[i] % 8, 1)


@dg.jit
def uniform(out, states):
    """``out[i]``: a uniform float32 drawn from random state ``i``."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = xoroshiro128p_uniform_float32(states, i)


@dg.jit
def where_am_i(out, start):
    """``out[i] = start + i``: each element's global index, given ``dg.offset``."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = start + i


@dg.jit
def fails_at_85(out, x, start):
    """``out[i] = x[i]``, raising at global element 85 (``start`` is ``dg.offset``)."""
    i = cuda.grid(1)
    if i < out.size:
        if start + i == 85:
            raise ValueError("element 85 is bad")
        out[i] = x[i]


# -- kernels whose results depend on where their launch begins or ends -------------
# map_kernel launches them once per chunk by default: grouping chunks would change them.

@dg.jit
def chunk_index(out):
    """``out[i] = i``: each element's index within its chunk (a tile-local index)."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


@dg.jit
def minus_first(out, x):
    """``out[i] = x[i] - x[0]``: each element against its chunk's first one."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] - x[0]


@dg.jit
def chunk_cumsum(out, x):
    """A scan within each chunk: ``out[i] = x[0] + ... + x[i]`` of the chunk."""
    i = cuda.grid(1)
    if i < out.size:
        total = 0.0
        for k in range(i + 1):
            total += x[k]
        out[i] = total
