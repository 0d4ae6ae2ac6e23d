"""``daskgpu worker``: one ``distributed.Nanny`` per local GPU, each pinned to it.

:func:`nanny_options` turns the command line's options into one Nanny spec
per GPU, each a GPU worker as :mod:`daskgpu._dask.workers.gpu_worker` defines it for
:class:`~daskgpu.LocalGPUCluster` too (seeing only its own GPU, host memory
split between the GPUs), and :func:`run_workers` runs the nannies until they
finish or SIGINT/SIGTERM. With the dask config ``daskgpu.simulate`` on, the
workers run kernels in Numba's CUDA simulator and need no GPU: one per device
named, or one. Nothing here imports numba.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from daskgpu._dask.workers.gpu_worker import (
    host_memory,
    local_devices,
    worker_options,
)
from daskgpu._errors import UsageError
from daskgpu._runtime import backends

#: How many simulated workers ``daskgpu worker`` starts when no devices are named.
SIMULATED_WORKERS = 1

#: What to do on a machine without a GPU.
NO_GPU_FIX = ("Run daskgpu worker on a GPU machine (check the NVIDIA driver and "
              "CUDA_VISIBLE_DEVICES), or run simulated workers with the dask config "
              "daskgpu.simulate on (DASK_DASKGPU__SIMULATE=1).")


def nanny_options(scheduler=None, *, scheduler_file=None, devices=None, nthreads=1,
                 resources=None, name=None, memory_limit="auto", local_directory=None,
                 death_timeout=None, dashboard_address=None, simulate=None,
                 security=None) -> list:
    """Keyword arguments of one ``distributed.Nanny`` per GPU, as ``daskgpu worker`` starts them.

    Each worker sees only its GPU (``CUDA_VISIBLE_DEVICES`` pinned), offers the
    resource ``GPU=1`` and runs :class:`~daskgpu.GPUWorkerPlugin`
    (:func:`~daskgpu._dask.workers.gpu_worker.worker_options`).

    Parameters
    ----------
    scheduler : str, optional
        Scheduler address; default the dask config ``scheduler-address``.
    scheduler_file : str, optional
        Instead of ``scheduler``, a scheduler file.
    devices : str or list, optional
        Device ordinals or ``GPU-``/``MIG-`` UUIDs; default the GPUs this machine
        shows (``CUDA_VISIBLE_DEVICES``, else all the driver sees). Simulated,
        only their number matters: one worker runs per device named, or one.
    nthreads : int
    resources : dict, optional
        Extra resources; ``GPU`` is 1 (other values are refused).
    name, memory_limit, local_directory, dashboard_address
        As ``distributed.Nanny`` takes them; ``name`` gets ``-<device>`` with
        several devices, and ``memory_limit="auto"`` splits the host's memory
        evenly between the GPU workers.
    death_timeout : float, optional
        Seconds a worker process may take to start and reach the scheduler,
        each time its nanny starts it: at first, and again after a lost CUDA
        context or ``client.restart()``. Default, as for
        :class:`~daskgpu.LocalGPUCluster`,
        :data:`~daskgpu._dask.workers.gpu_worker.WORKER_START_TIMEOUT` (120 s).
    simulate : bool, optional
        Run kernels in Numba's CUDA simulator (no GPU needed); default the
        backend's answer (the dask config ``daskgpu.simulate``). Simulated
        workers are pinned to no GPU.
    security : distributed.Security, optional
        TLS credentials for a ``tls://`` scheduler.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> specs = nanny_options("tcp://10.0.0.1:8786", devices="0,1")  # doctest: +SKIP
    >>> [s["env"]["CUDA_VISIBLE_DEVICES"] for s in specs]  # doctest: +SKIP
    ['0', '1']

    Simulated, on any machine:

    >>> (spec,) = nanny_options("tcp://10.0.0.1:8786", simulate=True)
    >>> spec["resources"]
    {'GPU': 1}
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
        simulate = backends.current().simulated
    try:
        devices = local_devices(devices, simulate=simulate, simulated_count=SIMULATED_WORKERS,
                                no_gpu_fix=NO_GPU_FIX)
    except ValueError as exc:  # a device named as CUDA_VISIBLE_DEVICES cannot take it
        raise UsageError(f"--devices: {exc}") from None
    memory_limit = host_memory(memory_limit, len(devices))
    extra = {} if dashboard_address is None else {"dashboard_address": dashboard_address}
    if death_timeout is not None:
        extra["death_timeout"] = death_timeout
    if security is not None:
        extra["security"] = security
    try:
        return [worker_options(
            devices, i, simulate=simulate, peers=False, nthreads=nthreads,
            resources=resources, scheduler_ip=scheduler, scheduler_file=scheduler_file,
            name=name if name is None or len(devices) == 1 else f"{name}-{device}",
            memory_limit=memory_limit, local_directory=local_directory, **extra)
            for i, device in enumerate(devices)]
    except ValueError as exc:  # resources GPU=2
        raise UsageError(f"--resources: {exc}") from None


def worker_security(scheduler, ca_file=None, cert=None, key=None):
    """The ``distributed.Security`` of ``--tls-ca-file/--tls-cert/--tls-key``, or None
    to use Dask's ``distributed.comm.tls`` settings.

    A ``tls://`` scheduler with credentials from neither is refused in one line
    that names both ways to give them (the nanny would fail later with a
    traceback). Give all three files or none.

    Examples
    --------
    >>> worker_security("tcp://10.0.0.1:8786") is None
    True
    >>> worker_security("tls://10.0.0.1:8786")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskgpu._errors.UsageError: the scheduler tls://10.0.0.1:8786 takes TLS connections, ...
    """
    given = {"--tls-ca-file": ca_file, "--tls-cert": cert, "--tls-key": key}
    if any(given.values()):
        missing = [flag for flag, value in given.items() if not value]
        if missing:
            raise UsageError(f"TLS needs --tls-ca-file, --tls-cert and --tls-key together; "
                             f"{' and '.join(missing)} missing")
        from distributed.security import Security

        return Security(tls_ca_file=ca_file, tls_worker_cert=cert, tls_worker_key=key,
                        require_encryption=True)
    if str(scheduler or "").startswith("tls://"):
        import dask.config

        # dask.config.get, not the section's dict: an environment variable such as
        # DASK_DISTRIBUTED__COMM__TLS__CA_FILE lands as "ca_file", and only get()
        # reads "-" and "_" alike, as Security does.
        if not (dask.config.get("distributed.comm.tls.ca-file", None)
                and dask.config.get("distributed.comm.tls.worker.cert", None)):
            raise UsageError(
                f"the scheduler {scheduler} takes TLS connections, and no credentials "
                "were given: pass --tls-ca-file, --tls-cert and --tls-key (as to dask "
                "worker), or set Dask's distributed.comm.tls.ca-file and "
                "distributed.comm.tls.worker.cert/key")
    return None


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
