"""Random states built on this thread's GPU by the PTX-only states kernel.

The worker needs no numba: the client compiled the states kernel
(:func:`~daskgpu._compiler.random_states.builder`), and :func:`device_states`
launches it to fill a :class:`DeviceStates`, state *g* equal to state *g* of
Numba's ``create_xoroshiro128p_states(n, seed)``.
"""

from __future__ import annotations

import math

import numpy as np
from cuda.bindings import driver

from daskgpu._image.launch_config import pad3
from daskgpu._image.random_states import JUMP_TABLE, STATE_DTYPE, splitmix64
from daskgpu._runtime.gpu import device as _device
from daskgpu._runtime.gpu.chains.device_chain import DeviceView
from daskgpu._runtime.gpu.driver import check

__all__ = ["DeviceStates", "device_states"]

_TABLE_BYTES = JUMP_TABLE.nbytes  # the table travels in front of the states


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
        # Views of the table and of the states as words, for the states kernel.
        self.table = DeviceView(base, JUMP_TABLE.shape, np.uint64, owner=self)
        self.words = DeviceView(base + _TABLE_BYTES, (self.n, 2), np.uint64, owner=self)
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


def device_states(seed: int, base: int, shape: tuple, strides: tuple, builder) -> DeviceStates:
    """The states of a launch of ``shape``, built on the device by ``builder``.

    Element ``i`` gets state ``base + i . strides``; ``shape`` and ``strides``
    have up to 3 axes (row-major; ``strides`` count states). ``builder`` is
    the shipped states kernel, a PTX-only kernel launched here.
    """
    n = math.prod(shape)
    states = DeviceStates(n)
    if n:
        shape3 = pad3(shape)
        strides3 = tuple(strides) + (0,) * (3 - len(strides))
        u = np.uint64
        builder.forall(n)(states.words, states.table, u(splitmix64(seed)), u(base),
                          u(shape3[1]), u(shape3[2]), *(u(s) for s in strides3))
    return states
