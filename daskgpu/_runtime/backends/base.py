"""``Backend``: everything the rest of daskgpu asks of a device, in one interface.

A backend is where launches run and what a process knows of its device. The
GPU backend (:class:`daskgpu._runtime.backends.gpu.GPUBackend`) talks to the
CUDA driver; the simulator backend
(:class:`daskgpu._runtime.backends.simulator.SimulatorBackend`) runs a kernel's
Python function in Numba's CUDA simulator. :mod:`daskgpu._runtime.backends`
chooses between them. Code outside the runtime asks the chosen backend, never
the driver or the ``daskgpu.simulate`` setting, so that a new backend (another
simulator, say) is one subclass here and one line in
:func:`daskgpu._runtime.backends.current`.
"""

from __future__ import annotations

import abc
from typing import NamedTuple

__all__ = ["Backend", "Devices"]


class Devices(NamedTuple):
    """The devices a backend offers this machine's workers.

    ``names`` are as ``CUDA_VISIBLE_DEVICES`` names them (ordinals, or its own
    ``GPU-``/``MIG-`` entries); empty when there are none, and then ``reason``
    says why in a few words.
    """

    names: tuple
    reason: str = ""


class Backend(abc.ABC):
    """Where launches run, and what this process knows of its device.

    Attributes
    ----------
    name : str
        A short name: ``"gpu"``, ``"simulator"``.
    simulated : bool
        Whether launches run without a GPU. Clients ship a kernel's Python
        function only to workers that simulate; entry points say so in one line.
    description : str
        What runs the kernels, for people: a worker's facts carry it as ``name``
        when no device can name itself.
    """

    name: str
    simulated: bool
    description: str

    # -- launching -----------------------------------------------------------
    @abc.abstractmethod
    def run(self, image, config, args, infos, function=None) -> None:
        """Launch ``image`` with ``config`` on ``args`` (their array infos ``infos``);
        ``function`` is a client kernel's live Python function, where there is one."""

    @abc.abstractmethod
    def repeat_launch(self, image, config, infos, args, images):
        """A function that repeats this launch on new device arguments, or None when
        every launch takes :meth:`run`."""

    @abc.abstractmethod
    def random_states(self, seed, base, shape, strides, builder):
        """The xoroshiro128+ states of one launch, global element ``base`` first; built by
        ``builder`` (the shipped states kernel) where the backend can run it."""

    @abc.abstractmethod
    def device_chain(self, name: str = "fused"):
        """An object that keeps a fused chain's intermediates on the device, or None
        where launches cannot share one."""

    @abc.abstractmethod
    def chain_graphs(self):
        """This process's fused chains captured as graphs, replayed per chunk (a
        :class:`~daskgpu._runtime.gpu.chains.graphs.ChainGraphs`), or None where
        launches cannot be captured: every chain is then launched one by one."""

    # -- facts -----------------------------------------------------------------
    @abc.abstractmethod
    def device_facts(self, warm: bool = False) -> dict:
        """This process's device, as :func:`daskgpu.device_info` returns it.

        ``warm`` also loads what the first launch would (a worker's setup asks
        for it, so that its first task pays nothing). Raises
        :class:`~daskgpu.DeviceError` naming the fix when there is no device.
        """

    @abc.abstractmethod
    def memory(self) -> tuple | None:
        """``(used, total)`` bytes of this process's device, or None where there is none
        to measure. Makes the device current on the calling thread."""

    @abc.abstractmethod
    def devices(self) -> Devices:
        """The devices this machine offers workers (one worker each); asks the driver
        only, making no context, so it is safe before starting worker processes."""
