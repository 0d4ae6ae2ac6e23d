"""Random states built where the kernel runs, by the PTX-only states kernel.

:func:`build` makes the xoroshiro128+ states of one launch: on a GPU by
launching the states kernel that the client compiled (the worker needs no
numba), in simulation on the host by the same jump table
(:func:`~daskgpu._image.random_states.host_states`). Either way state *g* is
state *g* of Numba's ``create_xoroshiro128p_states(n, seed)``.
"""

from __future__ import annotations

import math

import numpy as np
from cuda.bindings import driver

from daskgpu import _config
from daskgpu._image.random_states import JUMP_TABLE, STATE_DTYPE, host_states, splitmix64
from daskgpu._runtime import device as _device
from daskgpu._runtime._cuda import check

__all__ = ["DeviceStates", "build", "expand"]

_TABLE_BYTES = JUMP_TABLE.nbytes  # the table travels in front of the states


class _DeviceView:
    """A ``__cuda_array_interface__`` over part of a :class:`DeviceStates` allocation."""

    __slots__ = ("__cuda_array_interface__", "owner")

    def __init__(self, owner, ptr, shape, typestr, descr=None):
        self.owner = owner  # keeps the allocation alive while the view is used
        cai = {"shape": shape, "typestr": typestr, "data": (ptr, False), "strides": None,
               "version": 3, "stream": None}
        if descr is not None:
            cai["descr"] = descr
        self.__cuda_array_interface__ = cai


class DeviceStates:
    """``n`` xoroshiro128+ states in device memory, a record array to kernels.

    It exposes ``__cuda_array_interface__`` as Numba's own state arrays do
    (``|V16`` records), so a kernel takes it where Numba takes
    ``create_xoroshiro128p_states(n, seed)``; ``copy_to_host()`` reads it back.
    Memory is ordered on the legacy default stream and freed with the object,
    in the context it was allocated in, whichever thread frees it.
    """

    def __init__(self, n: int):
        self.n = int(n)
        # A Dask worker thread may have made no context current yet: a launch
        # would, but these states are allocated before it.
        _device.current()
        self._ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self._ptr = check(driver.cuMemAllocAsync(_TABLE_BYTES + 16 * max(self.n, 1), 0),
                          "cuMemAllocAsync")
        base = int(self._ptr)
        self.table = _DeviceView(self, base, JUMP_TABLE.shape, "<u8")
        self.words = _DeviceView(self, base + _TABLE_BYTES, (self.n, 2), "<u8")
        self.__cuda_array_interface__ = {
            "shape": (self.n,), "typestr": "|V16", "data": (base + _TABLE_BYTES, False),
            "strides": None, "version": 3, "stream": None,
            "descr": [("s0", "<u8"), ("s1", "<u8")],
        }
        table = np.ascontiguousarray(JUMP_TABLE)
        check(driver.cuMemcpyHtoDAsync(base, table.ctypes.data, _TABLE_BYTES, 0),
              "cuMemcpyHtoDAsync")

    @property
    def shape(self):
        return (self.n,)

    @property
    def dtype(self):
        return STATE_DTYPE

    def copy_to_host(self) -> np.ndarray:
        out = np.empty(self.n, STATE_DTYPE)
        if self.n:
            _device.current()
            check(driver.cuMemcpyDtoH(out.ctypes.data, int(self._ptr) + _TABLE_BYTES, out.nbytes),
                  "cuMemcpyDtoH")
        return out

    def __del__(self):
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr is not None:
            driver.cuCtxPushCurrent(self._ctx)
            driver.cuMemFreeAsync(ptr, 0)
            driver.cuCtxPopCurrent()

    def __repr__(self):
        return f"<DeviceStates n={self.n}>"


def _indices(base, shape, strides):
    """Global state indices of a launch of ``shape`` (row-major), as uint64."""
    g = np.full(shape, np.uint64(base), dtype=np.uint64)
    for axis, (n, st) in enumerate(zip(shape, strides)):
        step = np.arange(n, dtype=np.uint64) * np.uint64(st)
        g += step.reshape((n,) + (1,) * (len(shape) - axis - 1))
    return g.ravel()


def build(seed: int, base: int, shape: tuple, strides: tuple, builder=None):
    """The states of a launch of ``shape``: element ``i`` gets state ``base + i . strides``.

    ``shape`` and ``strides`` have up to 3 axes (row-major; ``strides`` count
    states). On a GPU ``builder`` (the shipped states kernel) runs on this
    thread's device and a :class:`DeviceStates` comes back; with no builder, or
    while simulating, a host array of ``STATE_DTYPE``.
    """
    if builder is None or _config.simulating():
        return host_states(seed, _indices(base, shape, strides))
    n = math.prod(shape)
    states = DeviceStates(n)
    if n:
        shape3 = tuple(shape) + (1,) * (3 - len(shape))
        strides3 = tuple(strides) + (0,) * (3 - len(strides))
        u = np.uint64
        builder.forall(n)(states.words, states.table, u(splitmix64(seed)), u(base),
                          u(shape3[1]), u(shape3[2]), *(u(s) for s in strides3))
    return states


def expand(args):
    """``args`` with each :class:`~daskgpu._image.random_states.RandomStates` built."""
    from daskgpu._image.random_states import RandomStates

    out = []
    for a in args:
        if type(a) is RandomStates:
            if a.n is None:
                raise TypeError(
                    f"{a!r} has no n: outside map_kernel, give the number of states, "
                    "dg.random_states(seed, n, start=0)"
                )
            a = build(a.seed, a.start, (a.n,), (1,), a.builder)
        out.append(a)
    return tuple(out)
