"""Kernels that ``daskgpu bench`` runs, importable so that Dask workers and fresh
processes can rebuild the Numba baselines by reference.

Each kernel function is compiled twice: by :func:`daskgpu.jit` (``add``,
``saxpy``, ...) and as a plain Numba dispatcher, the baseline (``numba_add``,
...). :func:`add_constant` makes a kernel function that is new code each time.
"""

import math
import types

from numba import cuda, int32, int64

import daskgpu as dg

ADD_SIG = "void(float32[::1], float32[::1], float32[::1])"


def _add(out, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


def _add_c(out, x, y):
    # The code of add_constant's functions: C is a global of each one's own.
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i] + C  # noqa: F821


def add_constant(c: float) -> types.FunctionType:
    """A new ``out = x + y + c`` kernel function, into whose code Numba freezes ``c``.

    Every such function runs the same code with globals of its own: ``cuda``,
    which the simulator swaps there, and ``C = c``. Not an attribute of this
    module, the function is pickled by value, so a Numba dispatcher of it
    compiles wherever it is unpickled.

    Examples
    --------
    >>> add_c = add_constant(7.0)
    >>> add_c.__name__, add_c.__globals__["C"]
    ('add_c', 7.0)
    >>> add_constant(8.0).__globals__ is add_c.__globals__
    False
    """
    function = types.FunctionType(_add_c.__code__, {"__name__": __name__, "cuda": cuda, "C": c},
                                  "add_c")
    function.__qualname__ = "add_c"
    return function


def _saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def _compute(out, x, iters):
    # Compute-bound: many dependent transcendental steps per element.
    i = cuda.grid(1)
    if i < out.size:
        v = x[i]
        for _ in range(iters):
            v = math.sin(v) * 0.5 + math.cos(v) * 0.5
        out[i] = v


def _hist256(counts, x, low, high):
    # A 256-bin histogram, privatised per block in shared memory as users write it.
    local = cuda.shared.array(256, int32)
    t = cuda.threadIdx.x
    for b in range(t, 256, cuda.blockDim.x):
        local[b] = 0
    cuda.syncthreads()
    i = cuda.grid(1)
    if i < x.size:
        b = int((x[i] - low) / (high - low) * 256)
        if 0 <= b < 256:
            cuda.atomic.add(local, b, 1)
    cuda.syncthreads()
    for b in range(t, 256, cuda.blockDim.x):
        if local[b]:
            cuda.atomic.add(counts, b, int64(local[b]))


def _heat(out, u, a):
    # One explicit step of the 2-D heat equation; the array's edge is copied.
    i, j = cuda.grid(2)
    n, m = u.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        out[i, j] = u[i, j] + a * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                                   - 4 * u[i, j])
    elif i < n and j < m:
        out[i, j] = u[i, j]


SAXPY_SIG = "void(float32[::1], float32, float32[::1], float32[::1])"
HIST_SIG = "void(int64[::1], float32[::1], float32, float32)"
COMPUTE_SIG = "void(float32[::1], float32[::1], int32)"
HEAT_SIG = "void(float32[:, ::1], float32[:, ::1], float32)"

# daskgpu kernels
add = dg.jit(ADD_SIG)(_add)
saxpy = dg.jit(SAXPY_SIG)(_saxpy)
compute = dg.jit(COMPUTE_SIG)(_compute)
hist256 = dg.jit(HIST_SIG)(_hist256)
heat = dg.jit(HEAT_SIG)(_heat)

# The same functions as plain Numba dispatchers: the baselines.
numba_add = cuda.jit(_add)
numba_saxpy = cuda.jit(_saxpy)
numba_compute = cuda.jit(_compute)
numba_hist256 = cuda.jit(_hist256)
numba_heat = cuda.jit(_heat)
