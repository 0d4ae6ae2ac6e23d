"""A GPU worker's device facts: read at setup, sent with heartbeats, offered as GPU-memory.

:class:`DeviceFacts` is one part of :class:`~daskgpu.GPUWorkerPlugin`: it makes
the worker's GPU current (creating its context) and loads the launch paths, so
that the first task pays neither, records the device's facts (which
:func:`~daskgpu.device_info` reads back), sends the scheduler what clients
need to know when they build a graph (:data:`SIMULATED_METRIC`,
:data:`DEVICE_METRIC`), and offers the device's memory as the ``GPU-memory``
resource.
"""

from __future__ import annotations

import asyncio

from daskgpu._dask.launch_core.resources import GPU_MEMORY, memory_offer
from daskgpu._runtime import backends

__all__ = ["DEVICE_METRIC", "SIMULATED_METRIC", "DeviceFacts", "probe"]

#: The worker metric (sent with every heartbeat, read by clients from the
#: scheduler's worker info) that says the worker runs kernels in the simulator.
SIMULATED_METRIC = "daskgpu-simulated"

#: The worker metric that says what PTX the worker's GPU can run: ``{"cc": [9, 0],
#: "driver": [13, 0], "linker": [13, 0] or None}`` (None when simulated), so that a
#: client refuses a map its workers cannot link when it builds the graph.
DEVICE_METRIC = "daskgpu-device"


def probe(warm: bool) -> dict:
    """This process's device facts, from its backend; with ``warm``, also load the launch
    paths."""
    return backends.current().device_facts(warm=warm)


class DeviceFacts:
    """The device facts of one worker, recorded by :meth:`setup`.

    Examples
    --------
    >>> import dask
    >>> facts = DeviceFacts()
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     facts.setup(worker=None)
    >>> facts.info["simulated"], facts.simulated(None), facts.versions(None)
    (True, True, None)
    """

    def __init__(self, info: dict | None = None):
        #: The facts; None until :meth:`setup` has run.
        self.info = info

    def setup(self, worker) -> None:
        """Probe the device (warm), tell the scheduler through heartbeats, offer memory."""
        self.info = probe(warm=True)
        heartbeat = getattr(worker, "metrics", None)
        if isinstance(heartbeat, dict):  # clients learn from it that they must ship Python
            heartbeat[SIMULATED_METRIC] = self.simulated
            heartbeat[DEVICE_METRIC] = self.versions
        if worker is not None:
            self.offer_memory(worker)

    def simulated(self, worker) -> bool:
        """The :data:`SIMULATED_METRIC` of the worker (a heartbeat metric's signature)."""
        return bool(self.info and self.info["simulated"])

    def versions(self, worker) -> dict | None:
        """The :data:`DEVICE_METRIC` of the worker: what PTX its GPU can run."""
        info = self.info
        if not info or info["simulated"]:
            return None
        linker = info["nvjitlink_version"]
        return {"cc": list(info["cc"]), "driver": list(info["driver_version"]),
                "linker": list(linker) if linker else None}

    def offer_memory(self, worker) -> None:
        """Offer the device's memory as the ``GPU-memory`` resource, so that launches running
        at once never ask for more than the device has; done once the facts are known."""
        offer = memory_offer(self.info["total_memory"], self.info["simulated"])
        if offer is None or not hasattr(worker, "set_resources"):
            return
        state = worker.state
        if state.total_resources.get(GPU_MEMORY) == offer:
            return
        if getattr(worker, "contact_address", None) is None:
            # Not registered yet (a plugin the worker was made with): its registration
            # tells the scheduler its resources, this one included.
            state.available_resources[GPU_MEMORY] = offer
            state.total_resources[GPU_MEMORY] = offer
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # set up outside the worker's event loop (a test)
            return
        asyncio.ensure_future(worker.set_resources(**{GPU_MEMORY: offer}))
