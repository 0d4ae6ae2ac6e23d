"""The device a launch runs on: made current per thread, with its facts and limits.

Through ``cuda.bindings`` alone: a fresh worker's first launch then never
imports cuda.core (0.24 s of 0.75 s to a first result on the H200, under
cProfile). The limits themselves
(:class:`~daskgpu._image.launch_config.DeviceLimits`) are plain values beside
the launch configurations they check.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

from cuda.bindings import driver

from daskgpu import _config
from daskgpu._image.launch_config import DeviceLimits
from daskgpu._runtime.gpu.driver import check, nvjitlink_version, require_gpu

_A = driver.CUdevice_attribute


@dataclass(frozen=True)
class DeviceState:
    """A device and its facts, made current for the calling thread by :func:`current`.

    ``context`` is the device's primary context (CUDA's runtime, CuPy and
    Numba use the same one), retained for the life of the process.
    """

    id: int
    context: object
    cc: tuple
    limits: DeviceLimits
    multiprocessor_count: int


#: This thread's :class:`DeviceState` (``state``) and stream (``stream``), once made.
this_thread = threading.local()


def current() -> DeviceState:
    """This thread's device, made current: the device of the thread's current
    context (as CuPy or Numba left it), else device 0."""
    state = getattr(this_thread, "state", None)
    if state is None:
        _load_linker_meanwhile()
        require_gpu()  # once per thread: a clear error instead of the driver loader's
        state = _state(_thread_device())
        check(driver.cuCtxSetCurrent(state.context), "cuCtxSetCurrent")
        this_thread.state = state
    return state


@functools.cache  # once per process (two racing first threads would both load: harmless)
def _load_linker_meanwhile() -> None:
    # Loading nvJitLink (its import and library: 45 ms on the H200) overlaps
    # the driver's start and the primary context (250 ms), which release the
    # interpreter lock: a fresh process's first link then finds it loaded.
    threading.Thread(target=nvjitlink_version, name="daskgpu-load-nvjitlink",
                     daemon=True).start()


def _thread_device() -> int:
    if int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")) == 0:
        return 0
    return int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))


def _attribute(device, name: str) -> int:
    return check(driver.cuDeviceGetAttribute(getattr(_A, "CU_DEVICE_ATTRIBUTE_" + name), device),
                 f"cuDeviceGetAttribute({name})")


def _cc(device) -> tuple:
    return (_attribute(device, "COMPUTE_CAPABILITY_MAJOR"),
            _attribute(device, "COMPUTE_CAPABILITY_MINOR"))


@functools.cache  # keyed by device id: one entry per device of the process
def _state(device_id: int) -> DeviceState:
    device = check(driver.cuDeviceGet(device_id), "cuDeviceGet")
    context = check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    limits = DeviceLimits(
        max_threads_per_block=_attribute(device, "MAX_THREADS_PER_BLOCK"),
        max_block_dim=tuple(_attribute(device, f"MAX_BLOCK_DIM_{a}") for a in "XYZ"),
        max_grid_dim=tuple(_attribute(device, f"MAX_GRID_DIM_{a}") for a in "XYZ"),
        max_shared_memory_per_block=_attribute(device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
    )
    _keep_freed_memory(device_id, int(_config.get("device-pool-bytes", 0)))
    return DeviceState(device_id, context, _cc(device), limits,
                       _attribute(device, "MULTIPROCESSOR_COUNT"))


def facts(device_id: int) -> dict:
    """Device ``device_id``'s ``name``, ``cc``, ``total_memory`` (bytes), ``uuid`` (as
    ``CUDA_VISIBLE_DEVICES`` takes it: ``"GPU-..."``) and ``pci_bus_id``.

    Asks the driver only, making no context: safe before a fork.
    """
    device = check(driver.cuDeviceGet(device_id), "cuDeviceGet")
    name = check(driver.cuDeviceGetName(256, device), "cuDeviceGetName")
    uuid = bytes(check(driver.cuDeviceGetUuid(device), "cuDeviceGetUuid").bytes).hex()
    bus = check(driver.cuDeviceGetPCIBusId(32, device), "cuDeviceGetPCIBusId")
    return {
        "name": name.split(b"\0", 1)[0].decode(errors="replace"),
        "cc": _cc(device),
        "total_memory": int(check(driver.cuDeviceTotalMem(device), "cuDeviceTotalMem")),
        "uuid": f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:32]}",
        "pci_bus_id": bus.split(b"\0", 1)[0].decode(errors="replace"),
    }


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
    stream = getattr(this_thread, "stream", None)
    if stream is None:
        current()
        stream = check(
            driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )
        this_thread.stream = stream
    return stream
