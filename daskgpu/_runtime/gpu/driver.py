"""Thin helpers over ``cuda.bindings.driver``: error checking, versions, device count.

A failed driver call becomes a :class:`~daskgpu.CUDAError`, and a sticky one
(:data:`STICKY_ERRORS`) a :class:`~daskgpu._errors.ContextLostError`: the
runtime raises it and goes no further. What a process does about a lost
context is its host's decision (a Dask worker's plugin has the nanny start a
fresh process).
"""

from __future__ import annotations

import functools

from cuda.bindings import driver

from daskgpu._errors import ContextLostError, CUDAError, DeviceError

# Errors after which the context is unusable for the rest of the process.
STICKY_ERRORS = frozenset(
    getattr(driver.CUresult, name)
    for name in (
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
    )
    if hasattr(driver.CUresult, name)
)


def cuda_error(code, what: str) -> CUDAError:
    """The :class:`CUDAError` for ``code``, a :class:`ContextLostError` when it is sticky."""
    err, name = driver.cuGetErrorName(code)
    err, text = driver.cuGetErrorString(code)
    name = name.decode() if isinstance(name, bytes) else str(code)
    text = text.decode() if isinstance(text, bytes) else ""
    if code in STICKY_ERRORS:
        return ContextLostError(code, (
            f"{what} failed: {name}: {text}. This error leaves the CUDA context unusable:"
            " the worker process must be restarted (a Dask nanny does this when the task"
            " fails)."))
    return CUDAError(code, f"{what} failed: {name}: {text}.")


#: The result of a driver call that succeeded.
SUCCESS = driver.CUresult.CUDA_SUCCESS

#: The legacy default stream, made once.
DEFAULT_STREAM = driver.CUstream(0)

#: ``cuLaunchKernel``, looked up once: it is on every launch.
launch_kernel = driver.cuLaunchKernel


def check(result, what: str):
    """Unpack a ``cuda.bindings`` result tuple, raising :class:`CUDAError`."""
    err = result[0]
    if err != SUCCESS:
        raise cuda_error(err, what)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


@functools.cache
def driver_version() -> tuple:
    """The CUDA driver API version as ``(major, minor)``."""
    v = check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    return (v // 1000, (v % 1000) // 10)


@functools.cache
def nvjitlink_version() -> tuple | None:
    """nvJitLink's ``(major, minor)``, or None when it is not installed."""
    try:
        from cuda.bindings import nvjitlink

        return tuple(nvjitlink.version())
    except Exception:
        return None


def device_count() -> tuple:
    """How many GPUs the driver shows this process, and why there are none.

    Returns ``(count, reason)``; ``reason`` is empty when ``count > 0``. It
    initialises the driver but creates no context, so it is safe to ask in a
    process that will fork or spawn GPU workers. The one GPU probe of the
    package: ``daskgpu info``, :class:`~daskgpu.LocalGPUCluster` and the
    tests' ``gpu`` marker all ask it.
    """
    try:
        err, = driver.cuInit(0)
        if err == SUCCESS:
            err, count = driver.cuDeviceGetCount()
    except Exception as exc:  # no libcuda: no driver installed
        text = str(exc).strip().splitlines()
        return 0, f"{type(exc).__name__}: {text[0] if text else ''}".strip()
    if err != SUCCESS:
        name = driver.cuGetErrorName(err)[1]
        return 0, f"the CUDA driver reports {name.decode() if isinstance(name, bytes) else err}"
    if count == 0:
        return 0, "the CUDA driver reports no device"
    return count, ""


def short_reason(reason: str) -> str:
    """Why there is no GPU, in a few words, without the driver loader's advice.

    Examples
    --------
    >>> short_reason('DynamicLibNotFoundError: "cuda" is an NVIDIA driver library ...')
    'libcuda not found'
    >>> short_reason("the CUDA driver reports CUDA_ERROR_NO_DEVICE.")
    'the CUDA driver reports CUDA_ERROR_NO_DEVICE'
    """
    if reason.startswith(("DynamicLibNotFoundError", "OSError: libcuda")):
        return "libcuda not found"
    return reason.rstrip(". ")


def require_gpu() -> None:
    """Raise a one-line :class:`DeviceError` naming ``daskgpu.simulate`` when this process
    has no usable GPU, before anything reaches for the driver (whose loader would raise
    its own error, which does not mention the setting)."""
    count, reason = device_count()
    if count == 0:
        raise DeviceError(
            f"no CUDA GPU in this process ({short_reason(reason)}). Run on a GPU machine "
            "(check the NVIDIA driver and CUDA_VISIBLE_DEVICES), or turn daskgpu.simulate "
            "on to run kernels in Numba's CUDA simulator: dask.config.set("
            "{'daskgpu.simulate': True}) or DASK_DASKGPU__SIMULATE=1")
