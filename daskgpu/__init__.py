"""daskgpu: run Numba CUDA kernels on Dask GPU clusters.

A kernel is compiled once, on the client, to PTX. What travels to the workers
is plain data (PTX text, argument specs, options), never the Python function;
each worker links the PTX for its own GPU and caches the result.
"""

from daskgpu import _config  # registers the daskgpu section of dask.config
from daskgpu._errors import (
    BundleError,
    CompileError,
    DaskGPUError,
    DeviceError,
    LaunchConfigError,
    LinkError,
    PicklingError,
    PTXVersionError,
)
from daskgpu._image import KernelImage
from daskgpu._kernel import Kernel, jit, kernel
from daskgpu._launch import Launch, LaunchConfig, PTXKernel

__version__ = "0.1.0"

__all__ = [
    "BundleError",
    "CompileError",
    "DaskGPUError",
    "DeviceError",
    "Kernel",
    "KernelImage",
    "Launch",
    "LaunchConfig",
    "LaunchConfigError",
    "LinkError",
    "PTXKernel",
    "PTXVersionError",
    "PicklingError",
    "__version__",
    "jit",
    "kernel",
]
