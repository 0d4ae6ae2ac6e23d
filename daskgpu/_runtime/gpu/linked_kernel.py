"""A kernel image linked and loaded for one device, and the process's cache of them."""

from __future__ import annotations

import weakref

import numpy as np
from cuda.bindings import driver

from daskgpu import _config
from daskgpu._bounded import BoundedCache
from daskgpu._errors import LaunchConfigError
from daskgpu._image.launch_config import launch_dims
from daskgpu._runtime import metrics
from daskgpu._runtime.faults import device_exception
from daskgpu._runtime.gpu.cubin_cache import DiskCache, ModuleCache
from daskgpu._runtime.gpu.driver import check, driver_version, nvjitlink_version
from daskgpu._runtime.gpu.linker import link_cubin
from daskgpu._runtime.gpu.marshal import ParamLayout

#: The process-wide cache of linked kernels, keyed by (image hash, device id) and
#: bounded by ``daskgpu.module-cache-size``.
module_cache = ModuleCache(int(_config.get("module-cache-size", 256)))

#: The on-disk cubin caches by directory and size bound (``daskgpu.cache-dir``,
#: ``daskgpu.cache-bytes``), each checked once.
disk_caches = BoundedCache(16, "cubin cache directories")

#: Launch configurations whose checked grid and block a LinkedKernel keeps.
DIMS_KEPT = 1024


class LinkedKernel:
    """An image linked and loaded for one device.

    It keeps two caches of its own: ``_dims``, a plain dict from
    :class:`~daskgpu.LaunchConfig` to its checked ``(griddim, blockdim)``, read
    on every general-path launch (a hit is one dict ``get``, so no
    :class:`~daskgpu._bounded.BoundedCache` there); it keeps the first
    :data:`DIMS_KEPT` configurations and computes others afresh. And
    ``_block_size``, the occupancy API's block size keyed by dynamic shared
    memory in bytes, at most 1024 of them, read only when a forall
    configuration is first seen.
    """

    def __init__(self, image, state, cubin: bytes):
        # The driver's library API, as cuda.core's ObjectCode uses it, without
        # importing cuda.core. The library stays loaded while this object
        # lives (the fast path holds it), and the cubin with it, which lazy
        # module loading may read at a later first launch.
        self.cubin = cubin
        library = check(driver.cuLibraryLoadData(cubin, None, None, 0, None, None, 0),
                        "cuLibraryLoadData")
        weakref.finalize(self, driver.cuLibraryUnload, library)
        self.library = library
        self.handle = check(driver.cuLibraryGetKernel(library, image.entry.encode()),
                            f"cuLibraryGetKernel({image.entry})")
        # Launching the context's CUfunction costs less host time than the
        # CUkernel (4.4 against 4.9-5.5 us a launch on the H200).
        self.function = check(
            driver.cuKernelGetFunction(self.handle), "cuKernelGetFunction"
        )
        self.max_threads = check(
            driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                self.function,
            ),
            "cuFuncGetAttribute",
        )
        self.layout = ParamLayout(image.args)
        # Grid-synchronising kernels are launched cooperatively, as numba-cuda does.
        self.cooperative = bool(image.option("cooperative"))
        carveout = image.option("shared_memory_carveout")
        if carveout is not None:
            check(driver.cuFuncSetAttribute(
                self.function,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                carveout,
            ), "cuFuncSetAttribute")
        # Debug kernels report a raised exception through these globals.
        self.errcode = self._global(image.entry + "__errcode__") if image.option("debug") else None
        self._block_size = BoundedCache(1024, "occupancy block sizes")
        self._dims = {}  # LaunchConfig -> (griddim, blockdim), validated

    def _global(self, name: str):
        dptr, _ = check(driver.cuLibraryGetGlobal(self.library, name.encode()),
                        f"cuLibraryGetGlobal({name})")
        return dptr

    def raised(self, image, stream, dims=None):
        """The exception a debug kernel's thread raised in the last launch (of
        ``dims``, its grid and block), else None."""
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        if _read_int(self.errcode) == 0:
            return None
        tid = [_read_int(self._global(f"{image.entry}__tid{a}__")) for a in "zyx"]
        ctaid = [_read_int(self._global(f"{image.entry}__ctaid{a}__")) for a in "zyx"]
        return device_exception(image, _read_int(self.errcode), tid, ctaid, dims)

    def dims(self, config, state, name):
        """``(griddim, blockdim)`` for ``config``, checked against the device once."""
        dims = self._dims.get(config)
        if dims is None:
            dims = launch_dims(config, self.block_size, state.limits.max_grid_dim)
            state.limits.check(*dims, config.sharedmem, self.max_threads, name)
            if self.cooperative:
                self.check_cooperative(*dims, config.sharedmem, state, name)
            if len(self._dims) < DIMS_KEPT:
                self._dims[config] = dims
        return dims

    def check_cooperative(self, griddim, blockdim, sharedmem, state, name):
        """Refuse a cooperative grid larger than can be resident at once."""
        threads = blockdim[0] * blockdim[1] * blockdim[2]
        per_sm = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.function, threads, sharedmem), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        most = per_sm * state.multiprocessor_count
        blocks = griddim[0] * griddim[1] * griddim[2]
        if blocks > most:
            raise LaunchConfigError(
                f"kernel {name!r} synchronises its whole grid (cooperative groups), so all "
                f"of its blocks must be resident at once: this device holds at most {most} "
                f"blocks of {threads} threads with {sharedmem} bytes of shared memory, and "
                f"the grid {griddim} has {blocks}. Launch at most {most} blocks (and loop "
                "over the data in the kernel), or use smaller blocks."
            )

    def block_size(self, sharedmem: int) -> int:
        """The occupancy API's block size for this kernel and shared memory."""
        return self._block_size.get(sharedmem, lambda: check(
            driver.cuOccupancyMaxPotentialBlockSize(self.function, None, sharedmem, 0),
            "cuOccupancyMaxPotentialBlockSize",
        )[1])


def linked(image, state) -> LinkedKernel:
    """``image`` linked for ``state``'s device: from memory, disk, or the linker.

    The disk cache is read before and written after the module cache's lock
    is taken, so a slow or stuck filesystem holds up only this launch, never
    every link in the process; a failed store costs only a later relink.
    Getting it from anywhere but memory is reported as ``link`` time to
    :mod:`~daskgpu._runtime.metrics` (the cubin loaded from disk, too).
    """
    key = (image.hash, state.id)
    kernel = module_cache.lookup(key)
    if kernel is not None:
        return kernel
    start = metrics.clock()
    kernel = _link(image, state, key)
    metrics.record(image.name, "link", metrics.clock() - start)
    return kernel


def _link(image, state, key) -> LinkedKernel:
    """``image`` from the disk cache or the linker, into the module cache."""
    disk = disk_cache()
    versions = (driver_version(), nvjitlink_version()) if disk else None
    stored = disk.load(image.hash, state.cc, versions) if disk else None
    fresh = []

    def build():
        if stored is not None:
            try:
                return LinkedKernel(image, state, stored)
            except Exception:  # a damaged cache file: link afresh and replace it
                pass
        fresh.append(link_cubin(image, state.cc))
        return LinkedKernel(image, state, fresh[0])

    kernel = module_cache.get(key, build)
    if disk and fresh:
        disk.store(image.hash, state.cc, versions, fresh[0])
    return kernel


def disk_cache() -> DiskCache | None:
    """The :class:`DiskCache` of ``daskgpu.cache-dir``, bounded by ``daskgpu.cache-bytes``,
    one per directory and bound; None when unset.

    Each directory is checked once per process, so a directory refused warns once.
    """
    directory = _config.get("cache-dir")
    if not directory:
        return None
    bound = _config.get("cache-bytes", 1 << 30)
    return disk_caches.get((str(directory), bound), lambda: DiskCache(str(directory), bound))


def _read_int(dptr) -> int:
    value = np.zeros(1, np.int32)
    check(driver.cuMemcpyDtoH(value.ctypes.data, dptr, 4), "cuMemcpyDtoH")
    return int(value[0])
