"""``daskgpu worker``: one ``distributed.Nanny`` per local GPU, each pinned to it.

:func:`local_devices` picks the GPUs to serve, :func:`nanny_options` turns the
command line's options into one Nanny spec per GPU (``CUDA_VISIBLE_DEVICES``
pinned, the resource ``GPU=1``, :class:`~daskgpu.GPUWorkerPlugin`, host memory
split between the GPUs), and :func:`run_workers` runs the nannies until they
finish or SIGINT/SIGTERM. With the dask config ``daskgpu.simulate`` on, the
workers run kernels in Numba's CUDA simulator and need no GPU: one per device
named, or one. Nothing here imports numba.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from daskgpu import _config
from daskgpu._cli import info as _info
from daskgpu._errors import DaskGPUError, UsageError

#: The simulated workers ``daskgpu worker`` starts when no devices are named.
SIMULATED_DEVICES = ("0",)


def local_devices(simulate: bool | None = None) -> list:
    """The GPUs to serve by default: ``CUDA_VISIBLE_DEVICES``, else all the driver sees.

    Simulated (``simulate``, default the ``daskgpu.simulate`` setting), one
    device, :data:`SIMULATED_DEVICES`, whatever the machine has.

    Examples
    --------
    >>> local_devices(simulate=True)
    ['0']
    """
    if simulate is None:
        simulate = _config.simulating()
    if simulate:
        return list(SIMULATED_DEVICES)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        devices = [str(d["index"]) for d in _info.driver_facts()["devices"]]
    if not devices:
        raise DaskGPUError(
            "no GPU to serve: "
            + (f"CUDA_VISIBLE_DEVICES={visible!r} names none" if visible is not None
               else "the CUDA driver sees no device")
            + ". Pass --devices 0,1, or, without GPUs, run simulated workers with the "
            "dask config daskgpu.simulate on (DASK_DASKGPU__SIMULATE=1)."
        )
    return devices


def nanny_options(scheduler=None, *, scheduler_file=None, devices=None, nthreads=1,
                 resources=None, name=None, memory_limit="auto", local_directory=None,
                 death_timeout=None, dashboard_address=None, simulate=None) -> list:
    """Keyword arguments of one ``distributed.Nanny`` per GPU, as ``daskgpu worker`` starts them.

    Each worker sees only its GPU (``CUDA_VISIBLE_DEVICES`` pinned), offers the
    resource ``GPU=1`` and runs :class:`~daskgpu.GPUWorkerPlugin`.

    Parameters
    ----------
    scheduler : str, optional
        Scheduler address; default the dask config ``scheduler-address``.
    scheduler_file : str, optional
        Instead of ``scheduler``, a scheduler file.
    devices : list of str, optional
        Device ordinals or UUIDs; default :func:`local_devices`. Simulated,
        only their number matters: one worker runs per device named.
    nthreads : int
    resources : dict, optional
        Extra resources; ``GPU`` defaults to 1.
    name, memory_limit, local_directory, dashboard_address
        As ``distributed.Nanny`` takes them; ``name`` gets ``-<device>`` with
        several devices, and ``memory_limit="auto"`` splits the host's memory
        evenly between the GPU workers.
    death_timeout : float, optional
        Seconds a worker process may take to start and reach the scheduler,
        each time its nanny starts it: at first, and again after a lost CUDA
        context or ``client.restart()``. Default, as for
        :class:`~daskgpu.LocalGPUCluster`,
        :data:`~daskgpu._dask.cluster.WORKER_START_TIMEOUT` (120 s).
    simulate : bool, optional
        Run kernels in Numba's CUDA simulator (no GPU needed); default the
        dask config ``daskgpu.simulate``. Each worker gets the setting both
        as ``DASK_DASKGPU__SIMULATE`` and in its dask config, and with no
        ``devices``, one worker runs, pinned to no GPU.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> specs = nanny_options("tcp://10.0.0.1:8786", devices=["0", "1"])
    >>> [s["env"] for s in specs]
    [{'CUDA_VISIBLE_DEVICES': '0'}, {'CUDA_VISIBLE_DEVICES': '1'}]
    >>> specs[0]["resources"]
    {'GPU': 1}
    >>> (spec,) = nanny_options("tcp://10.0.0.1:8786", simulate=True)
    >>> spec["env"], spec["config"]
    ({'DASK_DASKGPU__SIMULATE': 'True'}, {'daskgpu.simulate': True})
    """
    if scheduler is None and scheduler_file is None:
        import dask.config

        scheduler = dask.config.get("scheduler-address", None)
        if not scheduler:
            raise UsageError(
                "no scheduler to join: give its address (daskgpu worker tcp://host:8786), "
                "--scheduler-file PATH, or set DASK_SCHEDULER_ADDRESS"
            )
    if scheduler is not None and scheduler_file is not None:
        raise UsageError("give either a scheduler address or a scheduler file, not both")
    if simulate is None:
        simulate = _config.simulating()
    pin = bool(devices) or not simulate  # simulated defaults are no real GPUs
    devices = list(devices) if devices else local_devices(simulate)
    if memory_limit == "auto":
        # Host memory split between this machine's GPU workers, as dask-cuda does;
        # distributed's own "auto" would give each single-threaded worker one
        # core's share.
        from distributed.system import MEMORY_LIMIT

        memory_limit = MEMORY_LIMIT // len(devices)
    from daskgpu._dask.cluster import WORKER_START_TIMEOUT
    from daskgpu._dask.plugin import GPUWorkerPlugin

    if death_timeout is None:
        # The nanny gives up on a worker process that does not start in this
        # time, on a restart too. A finite bound, long enough for a restart that
        # re-imports slow modules and creates a CUDA context again on a loaded
        # machine; a worker that cannot start then fails, and the nanny logs it.
        death_timeout = WORKER_START_TIMEOUT
    specs = []
    for device in devices:
        spec = {
            "scheduler_ip": scheduler,
            "scheduler_file": scheduler_file,
            "nthreads": nthreads,
            "resources": {"GPU": 1, **(resources or {})},
            "env": {"CUDA_VISIBLE_DEVICES": str(device)} if pin else {},
            "plugins": {GPUWorkerPlugin()},
            "name": name if name is None or len(devices) == 1 else f"{name}-{device}",
            "memory_limit": memory_limit,
            "local_directory": local_directory,
            "death_timeout": death_timeout,
        }
        if dashboard_address is not None:
            spec["dashboard_address"] = dashboard_address
        if simulate:
            # Both: a worker reads dask's config, a bare process the variable.
            spec["env"]["DASK_DASKGPU__SIMULATE"] = "True"
            spec["config"] = {"daskgpu.simulate": True}
        specs.append(spec)
    return specs


async def run_workers(specs, stop: asyncio.Event | None = None) -> None:
    """Start one Nanny per spec; run until they finish, SIGINT/SIGTERM, or ``stop`` is set.

    A nanny that closes on its own meanwhile (the scheduler closed it, or its
    worker process did not start within its ``death_timeout``) is reported on
    stderr, and the others run on.
    """
    from distributed import Nanny

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    if sys.platform != "win32":
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, stop.set)
                handled.append(signum)
            except (ValueError, RuntimeError):  # not the main thread
                pass
    nannies = [Nanny(**spec) for spec in specs]
    try:
        await asyncio.gather(*nannies)
        running = {asyncio.ensure_future(n.finished()): spec for n, spec in zip(nannies, specs)}
        stopped = asyncio.ensure_future(stop.wait())
        while running and not stopped.done():
            done, _ = await asyncio.wait([*running, stopped],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopped}:
                if not stop.is_set():  # a nanny that closed on its own: its GPU is idle
                    _report_stopped(running.pop(task), len(running), len(specs))
        for task in (*running, stopped):
            task.cancel()
        await asyncio.gather(*running, stopped, return_exceptions=True)
    finally:
        await asyncio.gather(*(n.close(timeout=10, reason="daskgpu-worker-stop")
                               for n in nannies), return_exceptions=True)
        for signum in handled:
            loop.remove_signal_handler(signum)


def _report_stopped(spec, left, total) -> None:
    """Say that a nanny closed on its own, while ``daskgpu worker`` runs on."""
    device = spec.get("env", {}).get("CUDA_VISIBLE_DEVICES")
    which = f" on GPU {device}" if device else f" {spec['name']!r}" if spec.get("name") else ""
    print(f"daskgpu worker: the worker{which} stopped for good: its nanny closed, either "
          "because the scheduler closed it or because its process did not start within "
          f"death_timeout={spec.get('death_timeout')} s; {left} of {total} worker(s) still "
          "run", file=sys.stderr)
