"""What the current Dask cluster's workers offer, as the scheduler reports them.

Graph builders (:func:`~daskgpu.map_kernel`, ``client.submit`` launches,
batch jobs) and the command line ask here whether launches must be placed on
GPU workers and whether kernels must carry their Python function for
simulating workers, so that none of them imports another's module for it.
"""

from __future__ import annotations

import math
import numbers
import sys
import time
import warnings
from collections.abc import Mapping
from typing import NamedTuple

from daskgpu._bounded import BoundedCache
from daskgpu._dask.launch_core.resources import GPU, GPU_MEMORY
from daskgpu._dask.placement import ensure_placement
from daskgpu._dask.workers.plugin import DEVICE_METRIC, SIMULATED_METRIC
from daskgpu._errors import PTXVersionError
from daskgpu._image.ptx import max_ptx_isa, ptx_isa_version

__all__ = ["ClusterFacts", "OddWorkerWarning", "check_chunk_fits", "check_workers_link",
           "cluster_facts", "gpu_clusters", "workers_info"]


def workers_info(client) -> dict:
    """Every worker's scheduler info (address to dict) from a synchronous client."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed before 2025 lists every worker by default
        info = client.scheduler_info()
    return info.get("workers", {})


class ClusterFacts(NamedTuple):
    """What the current Dask cluster's workers offer, as the scheduler reports them."""

    #: Some worker offers the ``GPU`` resource: launches are placed on such workers.
    offers_gpu: bool = False
    #: Some worker runs kernels in the CUDA simulator: it needs the Python function.
    simulates: bool = False
    #: ``(address, device versions)`` of each GPU worker, as its plugin reports them
    #: (:data:`~daskgpu._dask.workers.plugin.DEVICE_METRIC`).
    devices: tuple = ()
    #: The most ``GPU-memory`` any worker offers, in bytes; 0 when none offers it.
    gpu_memory: int = 0
    #: How many workers offer the ``GPU`` resource.
    gpu_workers: int = 0
    #: The threads that run launches: those of the GPU workers, or of every worker
    #: where none offers a GPU (simulated on plain workers); 0 without a cluster.
    threads: int = 0


#: What each cluster with GPU workers offers, by scheduler address (client side),
#: with when it was asked. Asking costs a round trip of a few milliseconds: the
#: facts are asked again only after :data:`FRESH_SECONDS`, so that a burst of
#: ``map_kernel`` calls asks once and workers that join later are still judged.
#: Once a cluster has shown GPU workers it is kept as offering GPUs (if they all
#: leave, annotated tasks wait for one to come back, where plain tasks would fail
#: on a worker without a GPU). A cluster seen without any is asked again next
#: time, since GPU workers may join it.
gpu_clusters = BoundedCache(64, "scheduler addresses with GPU workers")

#: Seconds a cluster's facts are used before they are asked again.
FRESH_SECONDS = 5.0


def _facts(workers: dict) -> ClusterFacts:
    """The facts of ``workers`` (the scheduler's worker info by address).

    What a worker reports is checked here, worker by worker: one whose device
    facts or ``GPU-memory`` offer cannot be read (a compute capability sent as
    text, facts as a list, an offer of ``inf`` or ``nan`` bytes) is left out of
    those facts with a warning naming it and what it sent, so that one odd
    worker does not make every map on the cluster fail.

    Examples
    --------
    >>> facts = _facts({"tcp://a:1": {
    ...     "resources": {"GPU": 1, "GPU-memory": 2**30},
    ...     "metrics": {"daskgpu-device": {"cc": [9, 0], "driver": [13, 0], "linker": None}}}})
    >>> facts.devices, facts.gpu_memory
    ((('tcp://a:1', {'cc': (9, 0), 'driver': (13, 0), 'linker': None}),), 1073741824)
    """
    offers_gpu = simulates = False
    devices, memory, gpu_workers = [], 0, 0
    gpu_threads = all_threads = 0
    for address, worker in sorted(workers.items()):
        worker = worker if isinstance(worker, Mapping) else {}
        resources = _mapping(address, "resources", worker.get("resources"))
        metrics = _mapping(address, "metrics", worker.get("metrics"))
        offers_gpu = offers_gpu or bool(resources.get(GPU))
        gpu_workers += bool(resources.get(GPU))
        nthreads = worker.get("nthreads")
        nthreads = nthreads if isinstance(nthreads, int) and nthreads > 0 else 1
        all_threads += nthreads
        gpu_threads += nthreads if resources.get(GPU) else 0
        simulates = simulates or bool(metrics.get(SIMULATED_METRIC))
        if metrics.get(DEVICE_METRIC):
            versions = _versions(metrics[DEVICE_METRIC])
            if versions is None:
                _odd(address, f"device facts {metrics[DEVICE_METRIC]!r}",
                     'a mapping {"cc": [major, minor], "driver": [major, minor], "linker": '
                     "[major, minor] or null}, as daskgpu's GPUWorkerPlugin sends them",
                     "its kernels are not checked against its device")
            else:
                devices.append((address, versions))
        offer = resources.get(GPU_MEMORY, 0)
        if _is_bytes(offer):
            memory = max(memory, int(offer))
        else:
            _odd(address, f"{GPU_MEMORY}={offer!r}",
                 "a whole number of bytes, 0 or more (or no such resource)",
                 "its offer is not counted when chunks are checked against what workers "
                 "offer; restart it with --resources GPU-memory=<bytes>, or without it")
    return ClusterFacts(offers_gpu=offers_gpu, simulates=simulates, devices=tuple(devices),
                        gpu_memory=memory, gpu_workers=gpu_workers,
                        threads=gpu_threads if offers_gpu else all_threads)


def _mapping(address, what, value) -> Mapping:
    """``value`` when it is a mapping; else, when set, warned about and read as empty."""
    if isinstance(value, Mapping):
        return value
    if value is not None:
        _odd(address, f"{what} {value!r}", "a mapping", f"its {what} are not read")
    return {}


def _version(value, parts: int | None = None):
    """``value`` as a tuple of whole numbers (of ``parts`` of them), or None."""
    if not isinstance(value, list | tuple) or not value or (parts and len(value) != parts):
        return None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0
               for v in value):
        return None
    return tuple(int(v) for v in value)


def _versions(value) -> dict | None:
    """A worker's device facts checked, as tuples of whole numbers; None when odd."""
    if not isinstance(value, Mapping):
        return None
    cc, driver = _version(value.get("cc"), 2), _version(value.get("driver"))
    linker = value.get("linker")
    if cc is None or driver is None or (linker is not None and _version(linker) is None):
        return None
    return {"cc": cc, "driver": driver, "linker": None if linker is None else _version(linker)}


def _is_bytes(value) -> bool:
    """Whether ``value`` reads as a number of bytes: real, finite, 0 or more, whole."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0 and value == int(value))


def _odd(address, sent, wanted, so) -> None:
    warnings.warn(f"daskgpu: the worker {address} reports {sent}, where daskgpu reads "
                  f"{wanted}; {so}. Other workers are not affected", OddWorkerWarning,
                  stacklevel=3)


class OddWorkerWarning(RuntimeWarning):
    """A worker reports facts daskgpu cannot read; that worker's facts are left out."""


def cluster_facts() -> ClusterFacts:
    """What the current client's cluster offers; nothing without a (synchronous) client.

    A cluster that offers GPUs also gets :class:`~daskgpu._dask.placement.GPUPlacement`,
    which keeps every launch on a GPU worker whatever the graph's optimization
    drops. Simulated workers say so through the worker metric
    :data:`~daskgpu._dask.workers.plugin.SIMULATED_METRIC` of their plugin.

    Only the absence of a client, or one whose scheduler is gone, gives empty
    facts (a plain graph, as Dask's local schedulers run); anything else,
    a bug in placement included, is raised rather than silently building a
    graph whose launches could land on workers without a GPU.

    Examples
    --------
    >>> cluster_facts() == ClusterFacts()  # no client here
    True
    """
    if "distributed" not in sys.modules:  # no client can be current
        return ClusterFacts()
    from distributed import get_client

    try:
        client = get_client()
    except ValueError:  # no client: Dask's local schedulers will run the graph
        return ClusterFacts()
    if client.asynchronous:  # its cached scheduler info lists no workers
        return ClusterFacts()
    address = client.scheduler.address
    seen = gpu_clusters.lookup(address)
    if seen is not None and time.monotonic() - seen[0] < FRESH_SECONDS:
        facts = seen[1]
    else:
        try:
            workers = workers_info(client)
        except (OSError, TimeoutError):  # the scheduler is gone: computing will say so
            return ClusterFacts()
        facts = _facts(workers)
        if not facts.offers_gpu and seen is None:
            return facts
        # Once a cluster has shown GPU workers, keep placing on them: if they all
        # left, annotated tasks wait for one to come back.
        facts = facts._replace(offers_gpu=True)
        gpu_clusters.put(address, (time.monotonic(), facts))
    ensure_placement(client)
    return facts


def check_workers_link(image, kernel_name: str, facts: ClusterFacts) -> None:
    """Refuse, once and before any task runs, a map whose PTX some GPU worker cannot link.

    A worker cannot when ``image`` has no PTX target at or below its device's
    compute capability, or when its PTX ISA is newer than the worker's linker
    (nvJitLink, else the driver) reads; it would refuse every chunk it got.
    Workers that never reported their device (no daskgpu plugin, or simulated)
    are not judged.

    Examples
    --------
    >>> class Image:
    ...     ptx = [((7, 5), ".version 9.0\\n")]
    ...     def ptx_for(self, cc):
    ...         return self.ptx[0][1] if cc >= (7, 5) else None
    >>> old = ClusterFacts(True, False, (("tcp://a:1", {"cc": [9, 0], "driver": [12, 4],
    ...                                                  "linker": None}),))
    >>> check_workers_link(Image(), "saxpy", old)
    Traceback (most recent call last):
    ...
    daskgpu._errors.PTXVersionError: kernel 'saxpy' cannot run on 1 of the cluster's GPU ...
    """
    refused = []
    for address, versions in facts.devices:
        why = _why_not(image, versions)
        if why:
            refused.append(f"{address} ({why})")
    if refused:
        raise PTXVersionError(
            f"kernel {kernel_name!r} cannot run on {len(refused)} of the cluster's GPU "
            f"worker(s), which would refuse each chunk they got: {'; '.join(refused)}. "
            "Install a newer driver or nvidia-nvjitlink on those workers, or compile for "
            "them: an older toolkit extra on the client (pip install 'daskgpu[cu12]'), or "
            "a lower target (daskgpu.target-cc)")


def _why_not(image, versions) -> str:
    """Why a worker with ``versions`` cannot link ``image``; empty when it can."""
    cc = tuple(versions.get("cc") or ())
    ptx = image.ptx_for(cc)
    if ptx is None:
        return f"compute capability {'.'.join(map(str, cc))} is below every PTX target"
    isa = ptx_isa_version(ptx)
    linker = versions.get("linker")
    reader, what = (linker, "nvJitLink") if linker else (versions.get("driver"), "driver")
    if isa is None or not reader or isa <= max_ptx_isa(tuple(reader)):
        return ""
    newest = ".".join(map(str, max_ptx_isa(tuple(reader))))
    return (f"PTX ISA {isa[0]}.{isa[1]}, but its {what} {'.'.join(map(str, reader))} reads "
            f"up to {newest}")


def check_chunk_fits(device_bytes: int, kernel_name: str, facts: ClusterFacts) -> None:
    """Refuse a map whose largest chunk needs more device memory than any worker offers.

    Examples
    --------
    >>> check_chunk_fits(2**30, "saxpy", ClusterFacts(True, gpu_memory=2**31))
    >>> check_chunk_fits(2**32, "saxpy", ClusterFacts(True, gpu_memory=2**31))
    Traceback (most recent call last):
    ...
    ValueError: kernel 'saxpy' needs 4.00 GiB of device memory for its largest chunk ...
    """
    if facts.gpu_memory and device_bytes > facts.gpu_memory:
        from dask.utils import format_bytes

        raise ValueError(
            f"kernel {kernel_name!r} needs {format_bytes(device_bytes)} of device memory for "
            f"its largest chunk (its inputs copied in and its outputs), more than any GPU "
            f"worker offers ({format_bytes(facts.gpu_memory)} of GPU-memory); use smaller "
            "chunks (x.rechunk(...)), or raise daskgpu.device-memory on the workers")
