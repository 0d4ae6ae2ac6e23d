"""daskgpu: run Numba CUDA kernels on Dask GPU clusters.

A kernel is compiled once, on the client, to PTX. What travels to the workers
is plain data (PTX text, argument specs, options), never the Python function;
each worker links the PTX for its own GPU and caches the result.

``import daskgpu`` does not import numba: the client half (``jit``, ``kernel``,
``Kernel``) loads on first use, so workers that only unpickle launches never
need it.

This module is the public API; everything under it is private and may change.
Its layers, each a folder, import one way, from the command line down to the
plain data (``docs/developer/layout.md``):

==========================  =========================================================
module                      what it holds
==========================  =========================================================
``_cli``                    the ``daskgpu`` command (``__main__``: ``python -m``)
``_dask``                   ``map_kernel``, placement, the worker plugin, clusters,
                            batch jobs
``_compiler``               the client half: numba-cuda to PTX
``_runtime``                the worker half: launches, backends, the simulator
``_image``                  the plain data that travels: images, argument specs
``_config``, ``_errors``,   the base every layer uses: settings, exceptions,
``_files``, ``_bounded``,   durable writes, the bounded cache, the version
``_version``
==========================  =========================================================
"""

import importlib as _importlib
import sys as _sys
import typing as _typing

from daskgpu import _config
from daskgpu._errors import (
    BundleError,
    CompileError,
    ConfigError,
    ContextLostError,
    CUDAError,
    DaskGPUError,
    DeviceError,
    LaunchConfigError,
    LaunchTimeoutError,
    LinkError,
    PicklingError,
    PTXVersionError,
)
from daskgpu._image.image import KernelImage
from daskgpu._image.launch_config import LaunchConfig
from daskgpu._runtime import numpy_shim as _numpy_shim
from daskgpu._runtime.launch import Launch
from daskgpu._runtime.ptx_kernel import PTXKernel
from daskgpu._version import __version__

_numpy_shim.install()  # numba-cuda 0.30 on NumPy 2.5: before the first compile
if "dask" in _sys.modules:  # else registered on first use, keeping bare workers light
    _config.register()

# Public names served lazily from their modules (PEP 562), so that importing the
# package costs neither numba (client half) nor distributed (cluster half).
_LAZY = {
    "Kernel": "daskgpu._compiler.kernel",
    "jit": "daskgpu._compiler.kernel",
    "kernel": "daskgpu._compiler.kernel",
    "map_kernel": "daskgpu._dask.map_kernel.api",
    "iterate": "daskgpu._dask.iterate.api",
    "Out": "daskgpu._dask.map_kernel.api",
    "offset": "daskgpu._dask.map_kernel.api",
    "random_states": "daskgpu._compiler.random_states",
    "LocalGPUCluster": "daskgpu._dask.cluster",
    "GPUWorkerPlugin": "daskgpu._dask.workers.plugin",
    "device_info": "daskgpu._dask.workers.plugin",
    "save": "daskgpu._runtime.kernel_files",
    "load": "daskgpu._runtime.kernel_files",
    "run_batch": "daskgpu._dask.batch",
    "BatchReport": "daskgpu._dask.batch",
    "BatchProgress": "daskgpu._dask.batch",
    "BatchError": "daskgpu._dask.batch",
}


if _typing.TYPE_CHECKING:
    # The lazy names as type checkers and editors see them: imported, so their
    # hints are checked, and a misspelt name is an error (__getattr__ is hidden
    # from them below). tests/test_typing.py holds this list to _LAZY.
    from daskgpu._compiler.kernel import Kernel, jit, kernel
    from daskgpu._compiler.random_states import random_states
    from daskgpu._dask.batch import BatchError, BatchProgress, BatchReport, run_batch
    from daskgpu._dask.cluster import LocalGPUCluster
    from daskgpu._dask.iterate.api import iterate
    from daskgpu._dask.map_kernel.api import Out, map_kernel, offset
    from daskgpu._dask.workers.plugin import GPUWorkerPlugin, device_info
    from daskgpu._runtime.kernel_files import load, save
else:

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'daskgpu' has no attribute {name!r}")
        value = getattr(_importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    # Submodules (daskgpu._cli.main, once imported) are not part of the API.
    names = {n for n, v in globals().items() if not isinstance(v, type(_sys))}
    return sorted(names | set(_LAZY))


__all__ = [
    "BatchError",
    "BatchProgress",
    "BatchReport",
    "BundleError",
    "CUDAError",
    "CompileError",
    "ConfigError",
    "ContextLostError",
    "DaskGPUError",
    "DeviceError",
    "GPUWorkerPlugin",
    "Kernel",
    "KernelImage",
    "Launch",
    "LaunchConfig",
    "LaunchConfigError",
    "LaunchTimeoutError",
    "LinkError",
    "LocalGPUCluster",
    "Out",
    "PTXKernel",
    "PTXVersionError",
    "PicklingError",
    "__version__",
    "device_info",
    "iterate",
    "jit",
    "kernel",
    "load",
    "map_kernel",
    "offset",
    "random_states",
    "run_batch",
    "save",
]
