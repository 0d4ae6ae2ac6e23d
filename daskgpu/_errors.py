"""The exceptions daskgpu raises; all derive from :class:`DaskGPUError`.

The hierarchy, and where each is raised::

    DaskGPUError
    ├── CompileError             the client compiler: numba refused a signature or target
    ├── LinkError                the worker: nvJitLink or the driver refused the PTX
    │   └── PTXVersionError      the PTX needs a newer driver than the worker has
    ├── LaunchConfigError        a grid, block or shared-memory size a device refuses (ValueError)
    ├── PicklingError            a kernel or launch that cannot be shipped as it stands (TypeError)
    ├── BundleError              a corrupt, tampered or unknown kernel bundle (ValueError)
    ├── ConfigError              a ``daskgpu.*`` setting that cannot be used (ValueError)
    ├── UsageError               a command line the ``daskgpu`` parser refuses (ValueError)
    ├── BatchError               a batch job that cannot start as given (ValueError)
    ├── LedgerError              a batch output's ledger file that cannot be read (ValueError)
    └── DeviceError              a CUDA error while running a kernel (RuntimeError)
        └── CUDAError            a driver call failed; ``code`` is its ``CUresult``
            └── ContextLostError a sticky error: the process's CUDA context is unusable

This module imports only the standard library: every layer may raise these.
The runtime raises :class:`ContextLostError` and goes no further; the Dask
layer's worker plugin decides what a worker does about it (it has the nanny
start a fresh process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


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


class ConfigError(DaskGPUError, ValueError):
    """A ``daskgpu.*`` setting whose value cannot be used."""


class UsageError(DaskGPUError, ValueError):
    """A command line the ``daskgpu`` parser refuses; raised instead of exiting.

    ``parser`` is the (sub)command's parser, whose usage line goes with the message.
    """

    def __init__(self, message: str, parser: argparse.ArgumentParser | None = None) -> None:
        super().__init__(message)
        self.parser = parser


class BatchError(DaskGPUError, ValueError):
    """A batch job that cannot start as given: its inputs, outputs or ledger."""


class LedgerError(DaskGPUError, ValueError):
    """A ledger file that cannot be read: the message names it and the fix."""


class DeviceError(DaskGPUError, RuntimeError):
    """A CUDA error raised while running a kernel."""


class CUDAError(DeviceError):
    """A CUDA driver call failed.

    Attributes
    ----------
    code : CUresult
        The driver's result code.
    sticky : bool
        Whether the error leaves the process's CUDA context unusable (then the
        exception is a :class:`ContextLostError`).
    """

    sticky = False

    code: object

    def __init__(self, code: object, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # the failed task's error travels to the client pickled
        return type(self), (self.code, str(self))


class ContextLostError(CUDAError):
    """A sticky CUDA error (an illegal address, say): every later CUDA call in the process fails.

    The runtime only raises it; a Dask worker's :class:`~daskgpu.GPUWorkerPlugin`
    sees the failed task and has the worker's nanny start a fresh process.
    """

    sticky = True


class LaunchTimeoutError(ContextLostError):
    """A task running a launch outlived its time limit (``timeout=``, or the setting
    ``daskgpu.launch-timeout``). The kernel may still be running, so its worker's
    process is replaced, as after a lost context.

    Examples
    --------
    >>> LaunchTimeoutError("kernel 'spin' did not finish within 1 s").code is None
    True
    """

    def __init__(self, message: str) -> None:
        super().__init__(None, message)

    def __reduce__(self):
        return type(self), (str(self),)
