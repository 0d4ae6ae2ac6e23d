"""``GPUBackend``: launches and device facts on this process's CUDA GPU.

Every method imports the GPU modules it needs when first called, so that
choosing the backend (:func:`daskgpu._runtime.backends.current`) loads neither
the driver's bindings nor the launch paths.
"""

from __future__ import annotations

import os

from daskgpu._errors import DeviceError
from daskgpu._runtime import launch_runs
from daskgpu._runtime.backends.base import Backend, Devices

__all__ = ["GPUBackend"]


class GPUBackend(Backend):
    """Launch linked PTX on this thread's CUDA device (:mod:`daskgpu._runtime.gpu`).

    Examples
    --------
    >>> gpu = GPUBackend()
    >>> gpu.name, gpu.simulated
    ('gpu', False)
    >>> gpu.devices()  # doctest: +SKIP
    Devices(names=(0, 1), reason='')
    """

    simulated = False
    name = "gpu"
    description = "CUDA GPU"

    def run(self, image, config, args, infos, function=None) -> None:
        from daskgpu._runtime.gpu.run import run

        if launch_runs.watching:  # its own run starts once its image is linked
            from daskgpu._runtime.gpu import device
            from daskgpu._runtime.gpu.linked_kernel import linked

            linked(image, device.current())
            launch_runs.began()
        run(image, config, args, infos)

    def repeat_launch(self, image, config, infos, args, images):
        from daskgpu._runtime.gpu.fast_path import device_launch

        return device_launch(image, config, infos, args, images)

    def random_states(self, seed, base, shape, strides, builder):
        """Built on the device by ``builder``; on the host, as simulated, without one."""
        if builder is None:
            from daskgpu._runtime.simulator import host_random_states

            return host_random_states(seed, base, shape, strides)
        from daskgpu._runtime.gpu.random_states import device_states

        return device_states(seed, base, shape, strides, builder)

    def device_chain(self, name: str = "fused"):
        """A :class:`~daskgpu._runtime.gpu.chains.device_chain.DeviceChain` whose copies are
        reported to :mod:`~daskgpu._runtime.metrics` under ``name``."""
        from daskgpu._runtime.gpu.chains.device_chain import DeviceChain
        from daskgpu._runtime.gpu.host_staging import stager

        return DeviceChain(stager, name)

    def chain_graphs(self):
        """The process's :class:`~daskgpu._runtime.gpu.chains.graphs.ChainGraphs`: long
        chains on small chunks replay one captured CUDA graph (``daskgpu.chain-graphs``)."""
        from daskgpu._runtime.gpu.chains.graphs import chain_graphs

        return chain_graphs

    def device_facts(self, warm: bool = False) -> dict:
        """Device 0 of this process made current, and its facts: name, cc, memory, UUID,
        PCI bus, driver and nvJitLink versions, ``CUDA_VISIBLE_DEVICES``."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            from daskgpu._runtime.gpu import device

            state = device.current()
        except Exception as e:
            raise DeviceError(
                f"daskgpu found no usable CUDA GPU in this process "
                f"(CUDA_VISIBLE_DEVICES={visible!r}): {type(e).__name__}: {e}. "
                "Install the NVIDIA driver and check CUDA_VISIBLE_DEVICES, or run "
                "kernels in Numba's CUDA simulator with the dask.config setting "
                "daskgpu.simulate=True (LocalGPUCluster(simulate=True) sets it)."
            ) from e
        if warm:  # the general and the repeat launch paths, fused chains, and all they use
            import daskgpu._runtime.gpu.chains.graphs  # noqa: F401
            import daskgpu._runtime.gpu.fast_path  # noqa: F401
        from daskgpu._runtime.gpu.driver import driver_version, nvjitlink_version

        facts = device.facts(state.id)
        return {
            "simulated": False,
            "device_id": state.id,
            "name": facts["name"],
            "cc": state.cc,
            "total_memory": facts["total_memory"],
            "uuid": facts["uuid"],
            "pci_bus_id": facts["pci_bus_id"],
            "driver_version": driver_version(),
            "nvjitlink_version": nvjitlink_version(),
            "cuda_visible_devices": visible,
        }

    def memory(self) -> tuple | None:
        """Device 0's ``(total - free, total)`` bytes, as ``cuMemGetInfo`` gives them: every
        process's allocations on it, pools' kept memory included."""
        from cuda.bindings import driver

        from daskgpu._runtime.gpu import device
        from daskgpu._runtime.gpu.driver import check

        device.current()
        free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
        return int(total) - int(free), int(total)

    def devices(self) -> Devices:
        """The GPUs the driver shows this process: ``CUDA_VISIBLE_DEVICES``' entries,
        else ordinals."""
        from daskgpu._runtime.gpu.driver import device_count, short_reason

        count, reason = device_count()
        if count == 0:
            return Devices((), short_reason(reason))
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is None:
            return Devices(tuple(range(count)))
        # CUDA stops at the first entry it cannot use: the first `count` are the GPUs.
        return Devices(tuple(d.strip() for d in env.split(",") if d.strip())[:count])

    def machine(self) -> dict:
        """The driver's version and every GPU the driver shows (index, name, cc, memory,
        UUID), as plain data, making no context: what ``daskgpu info`` prints.

        ``version`` is None, and ``error`` says why, without a driver.
        """
        from daskgpu._runtime.gpu.device import facts
        from daskgpu._runtime.gpu.driver import device_count, driver_version

        count, reason = device_count()
        try:
            version = list(driver_version())
        except Exception:  # no libcuda, or a driver that cannot say
            version = None
        devices = []
        for i in range(count):
            f = facts(i)
            devices.append({"index": i, "name": f["name"], "cc": list(f["cc"]),
                            "total_memory": f["total_memory"], "uuid": f["uuid"]})
        return {"version": version, "error": None if count else (reason or None),
                "devices": devices}

    def linker_version(self) -> tuple | None:
        """nvJitLink's ``(major, minor)``, or None when it is not installed."""
        from daskgpu._runtime.gpu.driver import nvjitlink_version

        return nvjitlink_version()

    def __repr__(self):
        return "GPUBackend()"
