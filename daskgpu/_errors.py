"""The exceptions daskgpu raises; all derive from :class:`DaskGPUError`."""

from __future__ import annotations


class DaskGPUError(Exception):
    """Root of every daskgpu error."""


class CompileError(DaskGPUError):
    """Numba could not compile a kernel for the requested signature or target."""


class LinkError(DaskGPUError):
    """nvJitLink or the driver refused the kernel's PTX; carries the linker log."""


class PTXVersionError(LinkError):
    """The PTX needs a newer driver than the worker has."""


class LaunchConfigError(DaskGPUError, ValueError):
    """A grid, block or shared-memory size the device refuses."""


class PicklingError(DaskGPUError, TypeError):
    """A kernel or launch cannot be shipped as it stands."""


class BundleError(DaskGPUError, ValueError):
    """A kernel bundle file is corrupt, tampered with or of an unknown format."""


class DeviceError(DaskGPUError, RuntimeError):
    """A CUDA error raised while running a kernel."""
