"""The kernels that give a block's cells outside the array their boundary again, per step.

``dg.iterate`` advances a chunk several steps in one task over a halo as deep as
those steps need. Where the halo lies outside the whole array, a loop of single
steps would fill it afresh from the boundary rule before every step; a step
computes those cells from their neighbours instead, so after each step of a
block these kernels fill them again: one launch per side of each axis the rule
applies to, over just those cells. They are compiled here, on the client, once
per dtype and rank, and ship as PTX like any kernel.

Modes (:data:`CONSTANT`, :data:`REFLECT`, :data:`NEAREST`) are Dask's
``map_overlap`` boundaries: ``reflect`` repeats the edge element (NumPy's
``"symmetric"``), ``nearest`` copies it (NumPy's ``"edge"``).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda

__all__ = ["CONSTANT", "NEAREST", "REFLECT", "fill_kernel"]

#: Fill modes, as the kernels take them.
CONSTANT, REFLECT, NEAREST = 0, 1, 2


def _fill_1d(a, axis, first, count, lo, hi, mode, value):
    """Cells ``first .. first + count`` of ``a`` along ``axis``: outside ``[lo, hi)``, the
    array's own cells, they take the boundary's value (``mode``; ``value`` for a constant)."""
    t = cuda.grid(1)
    if t >= count:
        return
    k = first + t
    if k >= a.shape[0]:
        return
    if mode == CONSTANT:
        a[k] = value
        return
    src = lo if k < lo else hi - 1
    if mode == REFLECT:
        src = 2 * lo - 1 - k if k < lo else 2 * hi - 1 - k
    a[k] = a[src]


def _fill_2d(a, axis, first, count, lo, hi, mode, value):
    """:func:`_fill_1d` along ``axis`` of a 2-D ``a``, over the whole other axis."""
    i, j = cuda.grid(2)
    t = i if axis == 0 else j
    if t >= count:
        return
    if axis == 0:
        i += first
    else:
        j += first
    if i >= a.shape[0] or j >= a.shape[1]:
        return
    if mode == CONSTANT:
        a[i, j] = value
        return
    k = i if axis == 0 else j
    src = lo if k < lo else hi - 1
    if mode == REFLECT:
        src = 2 * lo - 1 - k if k < lo else 2 * hi - 1 - k
    if axis == 0:
        a[i, j] = a[src, j]
    else:
        a[i, j] = a[i, src]


def _fill_3d(a, axis, first, count, lo, hi, mode, value):
    """:func:`_fill_1d` along ``axis`` of a 3-D ``a``, over the whole other axes."""
    i, j, m = cuda.grid(3)
    t = i if axis == 0 else (j if axis == 1 else m)
    if t >= count:
        return
    if axis == 0:
        i += first
    elif axis == 1:
        j += first
    else:
        m += first
    if i >= a.shape[0] or j >= a.shape[1] or m >= a.shape[2]:
        return
    if mode == CONSTANT:
        a[i, j, m] = value
        return
    k = i if axis == 0 else (j if axis == 1 else m)
    src = lo if k < lo else hi - 1
    if mode == REFLECT:
        src = 2 * lo - 1 - k if k < lo else 2 * hi - 1 - k
    if axis == 0:
        a[i, j, m] = a[src, j, m]
    elif axis == 1:
        a[i, j, m] = a[i, src, m]
    else:
        a[i, j, m] = a[i, j, src]


_FUNCTIONS = {1: _fill_1d, 2: _fill_2d, 3: _fill_3d}


class _Fills:
    """The fill kernels, compiled on first use per (dtype, rank, simulated), kept for the
    process: a handful at most."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kernels = {}

    def __call__(self, dtype, ndim: int, simulate: bool):
        from numba.np.numpy_support import from_dtype

        from daskgpu._compiler.kernel import Kernel

        dtype = np.dtype(dtype)
        key = (dtype.str, int(ndim), bool(simulate))
        with self._lock:
            if key not in self._kernels:
                element = str(from_dtype(dtype))
                dims = ", ".join([":"] * (ndim - 1) + ["::1"])
                sig = f"void({element}[{dims}], int64, int64, int64, int64, int64, int64, " \
                      f"{element})"
                kernel = Kernel(_FUNCTIONS[ndim], [sig])
                self._kernels[key] = kernel.ptx_kernel(with_function=simulate)
        return self._kernels[key]


#: ``fill_kernel(dtype, ndim, simulate)``: the PTX-only fill kernel for C-ordered arrays
#: of ``dtype`` and ``ndim`` (1 to 3), with its Python function where ``simulate``.
fill_kernel = _Fills()
