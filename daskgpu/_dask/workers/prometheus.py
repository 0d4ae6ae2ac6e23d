"""daskgpu's figures at a GPU worker's Prometheus endpoint (``/metrics``).

distributed serves every collector of ``prometheus_client``'s default registry
at each worker's ``/metrics``; :func:`install` adds daskgpu's, once per
process, when ``prometheus_client`` is installed (the ``dashboard`` extra).
Its figures come from the same reports as the fine performance metrics
(:class:`~daskgpu._dask.workers.gpu_time.GPUTimeDigest`), counted since the
worker process started:

==========================================  =========================================
``daskgpu_gpu_seconds_total``               GPU time by ``activity`` and ``kernel``
``daskgpu_launches_total``                  launches by ``kernel``
``daskgpu_links_total``                     launches that found no linked module in the
                                            process (linked, or loaded from the disk
                                            cubin cache): the module cache's misses;
                                            its hits are launches less links
``daskgpu_device_memory_used_bytes``        the device's memory in use (all processes')
``daskgpu_device_memory_total_bytes``       the device's memory
==========================================  =========================================

The ``kernel`` label takes at most :data:`KERNELS_LABELLED` names per process;
time of further kernels is counted under ``kernel="(other kernels)"``
(:data:`OTHER`), so that a worker that sees many kernels keeps a bounded number
of series. No kernel's label is that: a kernel's name is its label, except that
a name starting with ``(`` gets one more (``(x`` is labelled ``((x``), which no
Python function's name does.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from daskgpu._runtime import backends

__all__ = ["GPUFigures", "figures", "install"]

#: Distinct kernel names a worker process labels its figures with.
KERNELS_LABELLED = 64
#: The ``kernel`` label of the kernels past the first :data:`KERNELS_LABELLED`.
OTHER = "(other kernels)"


def kernel_label(kernel: str) -> str:
    """The ``kernel`` label of a kernel's figures: its name, never :data:`OTHER`.

    Examples
    --------
    >>> kernel_label("saxpy"), kernel_label("other"), kernel_label("(other kernels)")
    ('saxpy', 'other', '((other kernels)')
    """
    return "(" + kernel if kernel.startswith("(") else kernel


class GPUFigures:
    """Counts and seconds of launches in this process, by kernel and activity.

    A listener of :class:`~daskgpu._dask.workers.gpu_time.GPUTimeDigest`:
    called as ``figures(kernel, activity, seconds)``.

    Examples
    --------
    >>> f = GPUFigures()
    >>> f("saxpy", "link", 0.25); f("saxpy", "kernel", 0.5); f("saxpy", "launch", 0.1)
    >>> f.launches, f.links, f.seconds[("saxpy", "kernel")]
    ({'saxpy': 2}, 1, 0.5)
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds = defaultdict(float)  # (kernel, activity) -> seconds
        self.launches = {}  # kernel -> launches
        self.links = 0

    def __call__(self, kernel: str, activity: str, seconds: float) -> None:
        kernel = kernel_label(str(kernel))
        with self._lock:
            if kernel not in self.launches and len(self.launches) >= KERNELS_LABELLED:
                kernel = OTHER
            self.seconds[kernel, activity] += seconds
            # A launch reports either its kernel (host arrays, simulated) or its
            # launch (device arrays), once each.
            if activity in ("kernel", "launch"):
                self.launches[kernel] = self.launches.get(kernel, 0) + 1
            else:
                self.launches.setdefault(kernel, 0)
            if activity == "link":
                self.links += 1

    def collect(self):
        """The figures as Prometheus metric families (``prometheus_client``'s collector
        protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            seconds, launches, links = dict(self.seconds), dict(self.launches), self.links
        gpu = CounterMetricFamily("daskgpu_gpu_seconds", "GPU time of launches by activity",
                                  labels=["activity", "kernel"], unit="seconds")
        for (kernel, activity), value in sorted(seconds.items()):
            gpu.add_metric([activity, kernel], value)
        count = CounterMetricFamily("daskgpu_launches", "Kernel launches", labels=["kernel"])
        for kernel, value in sorted(launches.items()):
            count.add_metric([kernel], value)
        yield gpu
        yield count
        yield CounterMetricFamily(
            "daskgpu_links", "Launches that found no linked module in the process (linked "
            "from PTX, or loaded from the disk cubin cache)", value=links)
        memory = _memory()
        if memory is not None:
            used, total = memory
            yield GaugeMetricFamily("daskgpu_device_memory_used_bytes",
                                    "Memory in use on the worker's device", value=used)
            yield GaugeMetricFamily("daskgpu_device_memory_total_bytes",
                                    "Memory of the worker's device", value=total)

    def __repr__(self):
        return f"<GPUFigures: {sum(self.launches.values())} launches, {self.links} links>"


def _memory():
    try:
        return backends.current().memory()
    except Exception:  # a lost context or no device: no figure rather than no endpoint
        return None


#: This process's figures (one per process, as the Prometheus registry is).
figures = GPUFigures()
_installed = []


def install(digest) -> bool:
    """Count ``digest``'s reports in :data:`figures` and serve them at ``/metrics``;
    once per process. False when ``prometheus_client`` is not installed."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return False
    digest.add_listener(figures)
    if not _installed:
        REGISTRY.register(figures)
        _installed.append(figures)
    return True
