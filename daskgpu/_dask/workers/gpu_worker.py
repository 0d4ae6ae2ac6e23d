"""What a daskgpu GPU worker is, whichever way it starts.

:class:`~daskgpu.LocalGPUCluster` and ``daskgpu worker`` both build their
workers here, so the two cannot drift: a worker serves one device, offers the
resource ``GPU=1`` (launches ask for a share of it), runs
:class:`~daskgpu.GPUWorkerPlugin`, sees its device first in
``CUDA_VISIBLE_DEVICES`` (simulated workers see none: they have no device),
and carries ``daskgpu.simulate`` both in its dask config and as
``DASK_DASKGPU__SIMULATE`` for the bare process. Devices are named the one way
``CUDA_VISIBLE_DEVICES`` names them (:func:`parse_devices`), and found by
asking the backend (:func:`local_devices`).

One difference is deliberate and a parameter, ``peers``: a cluster's worker
sees the other GPUs after its own (peer copies between them stay possible),
while ``daskgpu worker``'s sees only its own, as ``dask-cuda-worker`` users
expect of a machine shared with other jobs.
"""

from __future__ import annotations

import logging
import math
import numbers
import operator
import os

from daskgpu._dask.launch_core.resources import GPU, GPU_MEMORY
from daskgpu._dask.workers.plugin import GPUWorkerPlugin
from daskgpu._errors import DeviceError
from daskgpu._runtime import backends

__all__ = ["WORKER_START_TIMEOUT", "host_memory", "local_devices", "parse_devices",
           "worker_options"]

logger = logging.getLogger("daskgpu")

#: Seconds a worker process may take to start, each time its nanny starts it,
#: before the nanny gives up on it: the Nanny's ``death_timeout``, for
#: LocalGPUCluster and ``daskgpu worker``. A restart (after a lost CUDA context,
#: or ``client.restart()``) re-imports the user's main module, eager kernels and
#: all (21 s once on a loaded machine); a first start also creates a CUDA
#: context. As long as ``client.restart()`` waits for workers by default.
WORKER_START_TIMEOUT = 120


def parse_devices(devices) -> tuple | None:
    """Normalise ``devices`` to a tuple of ordinals and ``GPU-``/``MIG-`` strings.

    Examples
    --------
    >>> parse_devices("0, 1")
    (0, 1)
    >>> parse_devices([2, "MIG-4b1e"])
    (2, 'MIG-4b1e')
    >>> parse_devices(None) is None
    True
    >>> parse_devices("0,gpu1")
    Traceback (most recent call last):
    ...
    ValueError: 'gpu1' is not a device: give an ordinal (0, 1, ...), a 'GPU-<uuid>' or ...
    """
    if devices is None:
        return None
    if isinstance(devices, str):
        items = [d for d in devices.split(",") if d.strip()]
    elif isinstance(devices, int):
        items = [devices]
    else:
        items = list(devices)
    parsed = tuple(_parse_device(d) for d in items)
    if not parsed:
        raise ValueError(
            f"devices={devices!r} names no device; leave it None to use every "
            "visible GPU"
        )
    if len(set(parsed)) != len(parsed):
        raise ValueError(f"devices={devices!r} names a device twice; one worker runs per GPU")
    return parsed


def _parse_device(d):
    if isinstance(d, str):
        d = d.strip()
        if d.isdigit():
            return int(d)
        if d.startswith(("GPU-", "MIG-")) and len(d) > 4:
            return d
    elif not isinstance(d, bool):
        try:
            d = operator.index(d)
        except TypeError:
            pass
        else:
            if d >= 0:
                return d
    raise ValueError(
        f"{d!r} is not a device: give an ordinal (0, 1, ...), a 'GPU-<uuid>' or a "
        "'MIG-<uuid>' string, as CUDA_VISIBLE_DEVICES takes them (nvidia-smi -L lists them)"
    )


def local_devices(devices=None, *, simulate: bool, simulated_count: int = 1,
                  no_gpu_fix: str = "") -> tuple:
    """The devices to start workers on: ``devices`` checked, else what the backend sees.

    Simulated, ``devices`` only say how many workers run (default
    ``simulated_count``). On a GPU, ordinals beyond what the driver shows are
    refused (unless ``CUDA_VISIBLE_DEVICES`` renames them), and a machine without
    a GPU raises :class:`~daskgpu.DeviceError` saying why, then ``no_gpu_fix``.

    Examples
    --------
    >>> local_devices(simulate=True, simulated_count=2)
    (0, 1)
    >>> local_devices("GPU-8f1c", simulate=True)
    ('GPU-8f1c',)
    """
    devices = parse_devices(devices)
    if simulate:
        return devices or tuple(range(simulated_count))
    found = backends.GPU.devices()
    if not found.names:
        raise DeviceError(f"no CUDA GPU to run workers on ({found.reason}). {no_gpu_fix}".strip())
    visible = parse_devices(found.names)
    if devices is None:
        return visible
    if "CUDA_VISIBLE_DEVICES" not in os.environ:  # else ordinals are its entries
        missing = [d for d in devices if isinstance(d, int) and d >= len(visible)]
        if missing:
            raise DeviceError(
                f"devices={list(devices)} names GPU {missing[0]}, but this machine has "
                f"{len(visible)} GPU(s), 0 to {len(visible) - 1}; nvidia-smi -L lists them"
            )
    return devices


def worker_options(devices, index: int, *, simulate: bool, peers: bool, process: bool = True,
                   nthreads: int = 1, resources=None, plugins=(), env=None, config=None,
                   **options) -> dict:
    """The options of the worker (a ``Nanny`` when ``process``) that serves ``devices[index]``.

    ``resources``, ``plugins``, ``env`` and ``config`` are the caller's own,
    extended with what every GPU worker carries; ``options`` pass through.
    ``GPU`` in ``resources`` may only be 1: one worker serves one GPU, and a
    launch asks for a share of it. A Nanny's ``death_timeout`` defaults to
    :data:`WORKER_START_TIMEOUT`.

    Examples
    --------
    >>> opts = worker_options((0, 1, 2), 1, simulate=False, peers=True)
    >>> opts["env"]["CUDA_VISIBLE_DEVICES"], opts["resources"]
    ('1,2,0', {'GPU': 1})
    >>> worker_options((0, 1, 2), 1, simulate=False, peers=False)["env"]
    {'DASK_DASKGPU__SIMULATE': 'False', 'CUDA_VISIBLE_DEVICES': '1'}
    >>> worker_options((0,), 0, simulate=False, peers=False, resources={"GPU": 2})
    Traceback (most recent call last):
    ...
    ValueError: resources GPU=2: a daskgpu worker serves one GPU and offers GPU=1, ...
    """
    devices = tuple(devices)
    opts = dict(options)
    opts["nthreads"] = nthreads
    opts["resources"] = {**gpu_resources(resources), GPU: 1}
    opts["plugins"] = (*(plugins or ()), GPUWorkerPlugin())
    if process:
        # Both: a worker reads dask's config, a bare process the variable.
        env = {**(env or {}), "DASK_DASKGPU__SIMULATE": str(bool(simulate))}
        if not simulate:  # simulated devices are not real GPUs (NVML would look them up)
            own = devices[index:] + devices[:index] if peers else devices[index:index + 1]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, own))
        opts["env"] = env
        # A Nanny hands its worker this process's whole config, which another
        # cluster may have set to simulate: this worker's setting wins.
        opts["config"] = {**(config or {}), "daskgpu.simulate": bool(simulate)}
        opts.setdefault("death_timeout", WORKER_START_TIMEOUT)
    return opts


def host_memory(limit, workers: int):
    """Each of ``workers`` GPU workers' host memory limit: ``"auto"`` splits the host's
    memory evenly between them, as dask-cuda does (distributed's own ``"auto"`` would
    give each single-threaded worker one core's share); other values as Dask reads them.
    """
    from distributed.worker_memory import parse_memory_limit

    return parse_memory_limit(limit, 1, workers, logger=logger)


def gpu_resources(resources) -> dict:
    """``resources`` checked: ``GPU``, if there, must be 1; ``GPU-memory``, if there, a
    finite number of bytes above 0 (launches ask for their bytes of it: an offer of
    ``inf`` would let them oversubscribe the device, one of ``nan`` or 0 take none).

    Examples
    --------
    >>> gpu_resources({"GPU-memory": float("inf")})
    Traceback (most recent call last):
    ...
    ValueError: resources GPU-memory=inf: the device memory launches may share must be ...
    """
    resources = dict(resources or {})
    if GPU in resources and resources[GPU] != 1:
        raise ValueError(
            f"resources {GPU}={resources[GPU]}: a daskgpu worker serves one GPU and offers "
            f"{GPU}=1, of which each launch asks a share; leave {GPU} out of the resources, "
            "and give more devices to run more workers"
        )
    offer = resources.get(GPU_MEMORY)
    if offer is not None and (isinstance(offer, bool) or not isinstance(offer, numbers.Real)
                              or not 0 < offer < math.inf):
        raise ValueError(
            f"resources {GPU_MEMORY}={offer!r}: the device memory launches may share must be "
            "a finite number of bytes above 0, e.g. GPU-memory=16e9; leave it out to offer "
            "the device's own memory less daskgpu.device-memory-margin"
        )
    return resources
