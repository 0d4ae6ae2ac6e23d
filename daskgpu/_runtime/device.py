"""The device a launch runs on, and the limits it enforces."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

from cuda.bindings import driver
from cuda.core import Device

from daskgpu import _config
from daskgpu._errors import LaunchConfigError
from daskgpu._runtime._cuda import check


@dataclass(frozen=True)
class DeviceLimits:
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
                + (" (limited by its register use)" if kernel_max_threads < self.max_threads_per_block else "")
            )
        if any(b > m for b, m in zip(blockdim, self.max_block_dim)):
            problems.append(f"block {blockdim} exceeds the device's block limits {self.max_block_dim}")
        if any(g > m for g, m in zip(griddim, self.max_grid_dim)):
            problems.append(f"grid {griddim} exceeds the device's grid limits {self.max_grid_dim}")
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


@dataclass(frozen=True)
class DeviceState:
    """A device and its facts, made current for the calling thread by :func:`current`."""

    device: Device
    id: int
    cc: tuple
    limits: DeviceLimits


_thread = threading.local()


def current() -> DeviceState:
    """This thread's device, made current (cuda.core's current device is per thread)."""
    state = getattr(_thread, "state", None)
    if state is None:
        state = _state(Device().device_id)
        state.device.set_current()
        _thread.state = state
    return state


@functools.cache
def _state(device_id: int) -> DeviceState:
    dev = Device(device_id)
    dev.set_current()
    p = dev.properties
    limits = DeviceLimits(
        max_threads_per_block=p.max_threads_per_block,
        max_block_dim=(p.max_block_dim_x, p.max_block_dim_y, p.max_block_dim_z),
        max_grid_dim=(p.max_grid_dim_x, p.max_grid_dim_y, p.max_grid_dim_z),
        max_shared_memory_per_block=p.max_shared_memory_per_block_optin,
    )
    cc = dev.compute_capability
    _keep_freed_memory(device_id, int(_config.get("device-pool-bytes", 0)))
    return DeviceState(dev, device_id, (cc.major, cc.minor), limits)


def _keep_freed_memory(device_id: int, nbytes: int) -> None:
    # By default the pool returns freed memory to the driver at every
    # synchronisation, so each chunk's allocation would map fresh pages.
    pool = check(driver.cuDeviceGetDefaultMemPool(device_id), "cuDeviceGetDefaultMemPool")
    check(
        driver.cuMemPoolSetAttribute(
            pool, driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            driver.cuuint64_t(nbytes),
        ),
        "cuMemPoolSetAttribute",
    )


def thread_stream():
    """A non-blocking stream of this thread's own, for launches that stage host arrays.

    Worker threads then copy and compute concurrently instead of queueing on
    the legacy default stream.
    """
    stream = getattr(_thread, "stream", None)
    if stream is None:
        current()
        stream = check(
            driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )
        _thread.stream = stream
    return stream
