"""Which backend runs launches in this process: the GPU, or Numba's CUDA simulator.

:func:`current` is the one place that chooses, from the ``daskgpu.simulate``
setting (workers read it once, as they start; a client reads it where a graph
or a pickle is made). The rest of daskgpu asks the backend what to do and what
the device is (:class:`~daskgpu._runtime.backends.base.Backend`) instead of
testing the setting or calling the driver itself, as httpx code asks its
transport. Outside the runtime, only ``daskgpu bench`` reaches into
:mod:`daskgpu._runtime.gpu` directly.

An image that carries its Python function (shipped by a simulating client)
can only be simulated, wherever it lands: :func:`for_image` says so.
"""

from __future__ import annotations

from daskgpu import _config
from daskgpu._runtime.backends.base import Backend, Devices
from daskgpu._runtime.backends.gpu import GPUBackend
from daskgpu._runtime.backends.simulator import SimulatorBackend

__all__ = ["GPU", "SIMULATOR", "Backend", "Devices", "GPUBackend", "SimulatorBackend",
           "current", "for_image"]

GPU = GPUBackend()
SIMULATOR = SimulatorBackend()


def current() -> Backend:
    """This process's backend: the simulator while ``daskgpu.simulate`` is on, else the GPU.

    Examples
    --------
    >>> import dask.config
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     current().name
    'simulator'
    """
    return SIMULATOR if _config.flag("simulate") else GPU


def for_image(image) -> Backend:
    """The backend that runs ``image``: the simulator for an image with its Python function."""
    return SIMULATOR if image.py_func is not None else current()
