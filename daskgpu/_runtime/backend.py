"""Where launches run: on this process's GPU, or in Numba's CUDA simulator.

Two implementations of one small interface, :class:`GPUBackend` and
:class:`SimulatorBackend`; :func:`current` is the one place that chooses between
them, from the ``daskgpu.simulate`` setting (workers read it once, as they
start; a client reads it where a graph or a pickle is made). The rest of
daskgpu asks the backend what to do instead of testing the setting itself,
as httpx code asks its transport.

An image that carries its Python function (shipped by a simulating client)
can only be simulated, wherever it lands: :func:`for_image` says so.
"""

from __future__ import annotations

from daskgpu import _config
from daskgpu._errors import DeviceError
from daskgpu._runtime import metrics

__all__ = ["GPUBackend", "SimulatorBackend", "current", "for_image"]


class GPUBackend:
    """Launch linked PTX on this thread's CUDA device (:mod:`daskgpu._runtime.gpu`)."""

    simulated = False
    name = "gpu"

    def run(self, image, config, args, infos, function=None) -> None:
        """Launch ``image`` with ``config`` on ``args`` (their array infos ``infos``)."""
        from daskgpu._runtime.gpu.run import run

        run(image, config, args, infos)

    def repeat_launch(self, image, config, infos, args, images):
        """A function that repeats this launch on new device arguments, or None."""
        from daskgpu._runtime.gpu.fast_path import device_launch

        return device_launch(image, config, infos, args, images)

    def random_states(self, seed, base, shape, strides, builder):
        """The xoroshiro128+ states of one launch, built on the device by ``builder``
        (the shipped states kernel); on the host, as simulated, without one."""
        if builder is None:
            return SIMULATOR.random_states(seed, base, shape, strides, None)
        from daskgpu._runtime.gpu.random_states import device_states

        return device_states(seed, base, shape, strides, builder)

    def device_chain(self, name: str = "fused"):
        """A :class:`~daskgpu._runtime.gpu.copy_pipeline.DeviceChain` that keeps a fused
        chain's intermediates on the device, or None where launches cannot share one.
        Its copies are reported to :mod:`~daskgpu._runtime.metrics` under ``name``."""
        from daskgpu._runtime.gpu.copy_pipeline import DeviceChain
        from daskgpu._runtime.gpu.host_staging import stager

        return DeviceChain(stager, name)


class SimulatorBackend:
    """Run a kernel's Python function in Numba's CUDA simulator, on host arrays."""

    simulated = True
    name = "simulator"

    def run(self, image, config, args, infos, function=None) -> None:
        """Simulate ``image`` (or the client's live ``function``) on host ``args``.

        The whole simulated run is reported as the ``kernel`` activity to
        :mod:`~daskgpu._runtime.metrics`, and is an NVTX range, while someone
        looks: the simulator has no link and no copies.
        """
        if function is None and image.py_func is None:
            raise DeviceError(
                f"kernel {image.name.rpartition('.')[2]!r} was shipped PTX only (a bundle, "
                "or pickled while daskgpu.simulate was off), and the CUDA simulator runs "
                "only Python functions. Run it on a GPU with daskgpu.simulate off, or ship "
                "the client kernel (dg.jit) while daskgpu.simulate is on")
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


def _simulate(image, config, args, function) -> None:
    from daskgpu._runtime import simulator

    if function is not None:  # a client kernel: its live function
        simulator.run_function(function, config, args)
    else:
        simulator.run(image, config, args)


GPU = GPUBackend()
SIMULATOR = SimulatorBackend()


def current():
    """This process's backend: the simulator while ``daskgpu.simulate`` is on, else the GPU.

    Examples
    --------
    >>> import dask.config
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     current().name
    'simulator'
    """
    return SIMULATOR if _config.flag("simulate") else GPU


def for_image(image):
    """The backend that runs ``image``: the simulator for an image with its Python function."""
    return SIMULATOR if image.py_func is not None else current()
