"""The device a launch runs on: made current per thread, with its facts and limits.

The limits themselves (:class:`~daskgpu._image.launch_config.DeviceLimits`) are
plain values beside the launch configurations they check.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

from cuda.bindings import driver
from cuda.core import Device

from daskgpu import _config
from daskgpu._image.launch_config import DeviceLimits
from daskgpu._runtime.gpu.driver import check, require_gpu


@dataclass(frozen=True)
class DeviceState:
    """A device and its facts, made current for the calling thread by :func:`current`."""

    device: Device
    id: int
    cc: tuple
    limits: DeviceLimits


#: This thread's :class:`DeviceState` (``state``) and stream (``stream``), once made.
this_thread = threading.local()


def current() -> DeviceState:
    """This thread's device, made current (cuda.core's current device is per thread)."""
    state = getattr(this_thread, "state", None)
    if state is None:
        require_gpu()  # once per thread: a clear error instead of the driver loader's
        state = _state(Device().device_id)
        state.device.set_current()
        this_thread.state = state
    return state


@functools.cache  # keyed by device id: one entry per device of the process
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


def total_memory(state: DeviceState) -> int:
    """The memory of ``state``'s device, in bytes."""
    handle = check(driver.cuDeviceGet(state.id), "cuDeviceGet")
    return int(check(driver.cuDeviceTotalMem(handle), "cuDeviceTotalMem"))


def thread_stream():
    """A non-blocking stream of this thread's own, for launches that stage host arrays.

    Worker threads then copy and compute concurrently instead of queueing on
    the legacy default stream.
    """
    stream = getattr(this_thread, "stream", None)
    if stream is None:
        current()
        stream = check(
            driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )
        this_thread.stream = stream
    return stream
