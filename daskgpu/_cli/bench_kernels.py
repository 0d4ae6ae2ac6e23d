"""Kernels that ``daskgpu bench`` runs, importable so that Dask workers and fresh
processes can rebuild the Numba baselines by reference."""

import math

from numba import cuda

import daskgpu as dg

ADD_SIG = "void(float32[::1], float32[::1], float32[::1])"


def _add(out, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


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


SAXPY_SIG = "void(float32[::1], float32, float32[::1], float32[::1])"
COMPUTE_SIG = "void(float32[::1], float32[::1], int32)"

# daskgpu kernels
add = dg.jit(ADD_SIG)(_add)
saxpy = dg.jit(SAXPY_SIG)(_saxpy)
compute = dg.jit(COMPUTE_SIG)(_compute)

# The same functions as plain Numba dispatchers: the baselines.
numba_add = cuda.jit(_add)
numba_saxpy = cuda.jit(_saxpy)
numba_compute = cuda.jit(_compute)
