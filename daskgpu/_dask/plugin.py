"""``GPUWorkerPlugin``: readies any Dask worker for daskgpu launches.

The plugin is plain data on the client; its ``setup`` runs on the worker, where
it makes the worker's GPU current (creating its context), imports the runtime,
and records the device's facts. :func:`device_info` reads those facts back.
Nothing here imports numba.
"""

from __future__ import annotations

import os

from distributed.diagnostics.plugin import WorkerPlugin

from daskgpu import _config
from daskgpu._errors import DeviceError

#: The name the plugin registers under on every worker.
PLUGIN_NAME = "daskgpu-gpu"


class GPUWorkerPlugin(WorkerPlugin):
    """Set up a Dask worker's GPU for daskgpu: context, runtime imports, device facts.

    :class:`~daskgpu.LocalGPUCluster` installs it on each of its workers. On
    any other cluster (dask-cuda's ``LocalCUDACluster``, ``dask worker
    --resources GPU=1``, SLURM, Kubernetes) register it from the client; it
    then also runs on workers that join or restart later.

    On setup the worker makes device 0 current, the first GPU in its
    ``CUDA_VISIBLE_DEVICES`` and so the one it is pinned to, which creates its
    CUDA context. It imports the launch runtime, so that the first task pays
    neither, and records the device's facts for :func:`device_info`. While
    ``daskgpu.simulate`` is on in the worker's ``dask.config``, setup makes no
    GPU call and records simulated facts. A worker without a usable GPU, not
    simulating, fails setup with a :class:`~daskgpu.DeviceError`.

    Examples
    --------
    >>> import daskgpu as dg
    >>> plugin = dg.GPUWorkerPlugin()
    >>> plugin.name
    'daskgpu-gpu'
    >>> client.register_plugin(dg.GPUWorkerPlugin())  # doctest: +SKIP
    >>> client.run(dg.device_info)  # doctest: +SKIP
    {'tcp://10.0.0.5:40331': {'simulated': False, 'name': 'NVIDIA H200', ...}}
    """

    name = PLUGIN_NAME
    # Setup is the same every time: registering it again changes nothing.
    idempotent = True

    def __init__(self):
        #: The device facts recorded by :meth:`setup`; None until it has run.
        self.info = None

    def setup(self, worker):
        """Check the settings, make the worker's GPU current, import the runtime, record its facts."""
        _config.check()  # a bad daskgpu.* value fails the worker's start, named
        self.info = _probe(warm=True)

    def __repr__(self):
        return "GPUWorkerPlugin()"


def device_info(dask_worker=None) -> dict:
    """The GPU facts of a Dask worker, or of this process outside a worker.

    On a worker that runs :class:`GPUWorkerPlugin`, these are the facts its
    setup recorded; elsewhere they are read now (making device 0 current).

    Parameters
    ----------
    dask_worker : distributed.Worker, optional
        Passed by ``client.run``; inside a task the running worker is found
        without it.

    Returns
    -------
    dict
        ``simulated`` (bool), ``device_id`` (the ordinal within the process's
        ``CUDA_VISIBLE_DEVICES``, always 0 on a pinned worker), ``name``,
        ``cc`` (``(major, minor)``), ``total_memory`` (bytes), ``uuid``,
        ``pci_bus_id``, ``driver_version`` and ``nvjitlink_version`` (each
        ``(major, minor)``; nvJitLink None when not installed) and
        ``cuda_visible_devices`` (the environment variable, or None).
        Simulated facts carry None for everything a GPU would tell.

    Raises
    ------
    DeviceError
        Outside simulation, when this process has no usable GPU.

    Examples
    --------
    >>> import dask, daskgpu as dg
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.device_info()["simulated"]
    True
    >>> client.run(dg.device_info)  # doctest: +SKIP
    {'tcp://127.0.0.1:40331': {'simulated': False, 'name': 'NVIDIA H200', ...}}
    """
    if dask_worker is None:
        from distributed import get_worker

        try:
            dask_worker = get_worker()
        except ValueError:  # not inside a task
            dask_worker = None
    if dask_worker is not None:
        plugin = getattr(dask_worker, "plugins", {}).get(PLUGIN_NAME)
        if isinstance(plugin, GPUWorkerPlugin) and plugin.info is not None:
            return dict(plugin.info)
    return _probe(warm=False)


def _probe(warm: bool) -> dict:
    """This process's device facts; with ``warm``, also import the launch runtime."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if _config.simulating():
        return {
            "simulated": True, "device_id": 0, "name": "Numba CUDA simulator",
            "cc": None, "total_memory": None, "uuid": None, "pci_bus_id": None,
            "driver_version": None, "nvjitlink_version": None,
            "cuda_visible_devices": visible,
        }
    # Worker-only imports: cuda.core and the runtime load here, not on import.
    try:
        from daskgpu._runtime import device as _device

        state = _device.current()
    except Exception as e:
        raise DeviceError(
            f"daskgpu found no usable CUDA GPU in this process "
            f"(CUDA_VISIBLE_DEVICES={visible!r}): {type(e).__name__}: {e}. "
            "Install the NVIDIA driver and check CUDA_VISIBLE_DEVICES, or run "
            "kernels in Numba's CUDA simulator with the dask.config setting "
            "daskgpu.simulate=True (LocalGPUCluster(simulate=True) sets it)."
        ) from e
    if warm:
        import daskgpu._runtime.launcher  # noqa: F401
    from cuda.bindings import driver

    from daskgpu._runtime._cuda import check, driver_version, nvjitlink_version

    dev = state.device
    handle = check(driver.cuDeviceGet(state.id), "cuDeviceGet")
    return {
        "simulated": False,
        "device_id": state.id,
        "name": dev.name,
        "cc": state.cc,
        "total_memory": int(check(driver.cuDeviceTotalMem(handle), "cuDeviceTotalMem")),
        "uuid": str(dev.uuid),
        "pci_bus_id": str(dev.pci_bus_id),
        "driver_version": driver_version(),
        "nvjitlink_version": nvjitlink_version(),
        "cuda_visible_devices": visible,
    }
