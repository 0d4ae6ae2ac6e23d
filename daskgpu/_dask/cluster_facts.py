"""What the current Dask cluster's workers offer, as the scheduler reports them.

Graph builders (:func:`~daskgpu.map_kernel`, ``client.submit`` launches,
batch jobs) and the command line ask here whether launches must be placed on
GPU workers and whether kernels must carry their Python function for
simulating workers, so that none of them imports another's module for it.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from daskgpu._bounded import BoundedCache
from daskgpu._dask.placement import GPU, ensure_placement
from daskgpu._dask.workers.plugin import SIMULATED_METRIC

__all__ = ["ClusterFacts", "cluster_facts", "gpu_clusters", "workers_info"]


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


#: What each cluster offers, by scheduler address (client side). Asking costs
#: a round trip of a few milliseconds on every ``map_kernel`` call; once a
#: cluster has shown GPU workers, its facts are kept (if they all leave,
#: annotated tasks wait for one to come back, where plain tasks would fail on
#: a worker without a GPU). A cluster seen without any is asked again next
#: time, since GPU workers may join it.
gpu_clusters = BoundedCache(64, "scheduler addresses with GPU workers")


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
    ClusterFacts(offers_gpu=False, simulates=False)
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
    facts = gpu_clusters.lookup(address)
    if facts is None:
        try:
            workers = workers_info(client).values()
        except (OSError, TimeoutError):  # the scheduler is gone: computing will say so
            return ClusterFacts()
        facts = ClusterFacts(
            offers_gpu=any((w.get("resources") or {}).get(GPU) for w in workers),
            simulates=any((w.get("metrics") or {}).get(SIMULATED_METRIC) for w in workers))
        if not facts.offers_gpu:
            return facts
        gpu_clusters.put(address, facts)
    ensure_placement(client)
    return facts
