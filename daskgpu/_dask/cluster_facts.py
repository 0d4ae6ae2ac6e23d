"""What the current Dask cluster's workers offer, as the scheduler reports them.

Graph builders (:func:`~daskgpu.map_kernel`, ``client.submit`` launches,
batch jobs) and the command line ask here whether launches must be placed on
GPU workers and whether kernels must carry their Python function for
simulating workers, so that none of them imports another's module for it.
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

from daskgpu._bounded import BoundedCache
from daskgpu._dask.placement import GPU, GPU_MEMORY, ensure_placement
from daskgpu._dask.workers.plugin import DEVICE_METRIC, SIMULATED_METRIC
from daskgpu._errors import PTXVersionError
from daskgpu._image.ptx import max_ptx_isa, ptx_isa_version

__all__ = ["ClusterFacts", "check_chunk_fits", "check_workers_link", "cluster_facts",
           "gpu_clusters", "workers_info"]


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
    metrics = {address: w.get("metrics") or {} for address, w in workers.items()}
    return ClusterFacts(
        offers_gpu=any((w.get("resources") or {}).get(GPU) for w in workers.values()),
        simulates=any(m.get(SIMULATED_METRIC) for m in metrics.values()),
        devices=tuple((address, m[DEVICE_METRIC]) for address, m in sorted(metrics.items())
                      if m.get(DEVICE_METRIC)),
        gpu_memory=max((int((w.get("resources") or {}).get(GPU_MEMORY, 0))
                        for w in workers.values()), default=0))


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
    >>> cluster_facts()  # no client here
    ClusterFacts(offers_gpu=False, simulates=False, devices=(), gpu_memory=0)
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
