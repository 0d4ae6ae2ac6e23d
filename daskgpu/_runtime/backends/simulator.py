"""``SimulatorBackend``: run a kernel's Python function in Numba's CUDA simulator.

Numba is imported only when a kernel runs (:mod:`daskgpu._runtime.simulator`),
so choosing this backend costs nothing on a worker that never simulates.
"""

from __future__ import annotations

import os

from daskgpu._errors import DeviceError
from daskgpu._runtime import metrics
from daskgpu._runtime.backends.base import Backend, Devices

__all__ = ["SimulatorBackend"]


class SimulatorBackend(Backend):
    """Run a kernel's Python function in Numba's CUDA simulator, on host arrays.

    Examples
    --------
    >>> sim = SimulatorBackend()
    >>> sim.simulated, sim.device_facts()["name"]
    (True, 'Numba CUDA simulator')
    >>> sim.devices().names
    ()
    """

    simulated = True
    name = "simulator"
    description = "Numba CUDA simulator"

    def run(self, image, config, args, infos, function=None) -> None:
        """Simulate ``image`` (or the client's live ``function``) on host ``args``.

        The whole simulated run is reported as the ``kernel`` activity to
        :mod:`~daskgpu._runtime.metrics`, and is an NVTX range, while someone
        looks: the simulator has no link and no copies.
        """
        if function is None and image.py_func is None:
            raise DeviceError(
                f"kernel {image.name.rpartition('.')[2]!r} was shipped PTX only, and the "
                "CUDA simulator runs only Python functions: a bundle, a launch pickled "
                "while daskgpu.simulate was off in the client, or a map_kernel built "
                "while neither the client nor its cluster's workers simulated (before a "
                "simulated LocalGPUCluster started, say). Run it on a GPU with "
                "daskgpu.simulate off, or ship the client kernel (dg.jit), or build the "
                "map, while daskgpu.simulate is on")
        meter = metrics.hook
        if meter is None:
            _simulate(image, config, args, function)
            return
        meter.push(image.name)
        start = metrics.clock()
        try:
            _simulate(image, config, args, function)
        finally:
            meter.pop()
        meter.record(image.name, "kernel", metrics.clock() - start)

    def repeat_launch(self, image, config, infos, args, images):
        return None  # every simulated launch takes the general path

    def random_states(self, seed, base, shape, strides, builder):
        from daskgpu._runtime.simulator import host_random_states

        return host_random_states(seed, base, shape, strides)  # on the host, by the jump table

    def device_chain(self, name: str = "fused"):
        return None

    def chain_graphs(self):
        return None  # the simulator has no graphs: a chain's launches simply follow each other

    def device_facts(self, warm: bool = False) -> dict:
        """Simulated facts: the simulator's name, and None for all a GPU would tell."""
        return {
            "simulated": True, "device_id": 0, "name": self.description,
            "cc": None, "total_memory": None, "uuid": None, "pci_bus_id": None,
            "driver_version": None, "nvjitlink_version": None,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def memory(self) -> tuple | None:
        return None  # host arrays only: nothing on a device

    def devices(self) -> Devices:
        """None: a simulated worker is no device; whoever starts them says how many."""
        return Devices((), "simulated workers have no device")

    def __repr__(self):
        return "SimulatorBackend()"


def _simulate(image, config, args, function) -> None:
    from daskgpu._runtime import simulator

    if function is not None:  # a client kernel: its live function
        simulator.run_function(function, config, args)
    else:
        simulator.run(image, config, args)
