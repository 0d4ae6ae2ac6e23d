"""Launches' GPU time by activity, into distributed's fine performance metrics.

The runtime reports ``(kernel, activity, seconds)`` for each launch
(:mod:`daskgpu._runtime.metrics`). Two views of it reach Dask, each one
metric per report:

- in ``seconds``, labelled by activity alone (``"daskgpu copy-in"``,
  ``"daskgpu kernel"``, ...): distributed takes them out of the task's
  ``thread-cpu`` and ``thread-noncpu``, so they add up with the task's other
  time, and the dashboard's "by activity" chart shows the total copy-in
  against the total kernel time however many kernels ran;
- in :data:`KERNEL_UNIT`, labelled ``"<kernel> <activity>"``: which kernel
  the time went to, also where Dask fused a launch into another task (whose
  function name is then the other task's). A unit of its own, so that it is
  not counted twice; the dashboard's unit selector shows it.

Both land under the running task's prefix and span, on the scheduler and in
each ``Span``'s ``cumulative_worker_metrics``. The same reports also feed the
worker's Prometheus figures (:mod:`daskgpu._dask.workers.prometheus`).

:class:`TaskTimes` is the part of :class:`~daskgpu.GPUWorkerPlugin` that turns
this on for a worker, and opens an NVTX range over each task it runs.
"""

from __future__ import annotations

from dask.utils import key_split
from distributed.metrics import context_meter

from daskgpu._dask.workers import prometheus
from daskgpu._runtime import metrics
from daskgpu._runtime.metrics import ACTIVITIES

__all__ = ["KERNEL_UNIT", "GPUTimeDigest", "TaskTimes", "activity_label", "digest_gpu_time",
           "kernel_label"]

#: The fine performance metrics unit of GPU time labelled by kernel.
KERNEL_UNIT = "kernel-seconds"


def activity_label(activity: str) -> str:
    """The fine performance metrics label, in seconds, of ``activity`` of every kernel.

    Examples
    --------
    >>> activity_label("copy-in")
    'daskgpu copy-in'
    """
    return f"daskgpu {activity}"


def kernel_label(kernel: str, activity: str) -> str:
    """The label, in :data:`KERNEL_UNIT`, of ``activity`` of ``kernel``.

    Examples
    --------
    >>> kernel_label("saxpy", "kernel")
    'saxpy kernel'
    """
    return f"{kernel} {activity}"


class GPUTimeDigest:
    """The runtime's recorder on a worker: a launch's seconds of one activity to
    distributed's ``context_meter`` (which files them under the running task and
    drops them outside one), in both views, and to whoever else listens
    (:meth:`add_listener`: the Prometheus figures).

    Called as ``digest(kernel, activity, seconds)``; :meth:`sink` gives the
    runtime's fast path one callable per kernel and activity, whose labels are
    made once, so that a launch on device arrays costs one lookup and one call
    to report.

    Examples
    --------
    >>> from distributed.metrics import context_meter
    >>> seen = []
    >>> with context_meter.add_callback(lambda *metric: seen.append(metric)):
    ...     digest_gpu_time("saxpy", "kernel", 0.5)
    ...     digest_gpu_time.sink("saxpy", "launch")(0.25)
    >>> seen  # doctest: +NORMALIZE_WHITESPACE
    [('daskgpu kernel', 0.5, 'seconds'), ('saxpy kernel', 0.5, 'kernel-seconds'),
     ('daskgpu launch', 0.25, 'seconds'), ('saxpy launch', 0.25, 'kernel-seconds')]
    """

    #: Kernels whose labels are kept made; emptied when full.
    LABELS_KEPT = 1024

    def __init__(self):
        # {kernel: {activity: (label, kernel label)}}: a plain dict, as a BoundedCache
        # lookup (0.2 us) would double the cost of reporting. Racing threads at worst
        # both make one.
        self._labels = {}
        self._listeners = ()

    def __call__(self, kernel: str, activity: str, seconds: float) -> None:
        label, by_kernel = self._labels_of(kernel)[activity]
        digest = context_meter.digest_metric
        digest(label, seconds, "seconds")
        digest(by_kernel, seconds, KERNEL_UNIT)
        for listener in self._listeners:
            listener(kernel, activity, seconds)

    def sink(self, kernel: str, activity: str):
        """``seconds -> None`` for ``activity`` of ``kernel``: its labels bound once."""
        (label, by_kernel), digest = self._labels_of(kernel)[activity], context_meter.digest_metric
        listeners = self._listeners

        def report(seconds: float) -> None:
            digest(label, seconds, "seconds")
            digest(by_kernel, seconds, KERNEL_UNIT)
            for listener in listeners:
                listener(kernel, activity, seconds)

        return report

    def add_listener(self, listener) -> None:
        """Also call ``listener(kernel, activity, seconds)`` for every report (sinks made
        from now on included: add listeners before the first launch)."""
        if listener not in self._listeners:
            self._listeners = (*self._listeners, listener)

    def _labels_of(self, kernel: str) -> dict:
        labels = self._labels.get(kernel)
        if labels is None:
            if len(self._labels) >= self.LABELS_KEPT:
                self._labels.clear()
            labels = self._labels[kernel] = {
                a: (activity_label(a), kernel_label(kernel, a)) for a in ACTIVITIES}
        return labels

    def __repr__(self):
        return "digest_gpu_time"


#: The recorder :class:`~daskgpu.GPUWorkerPlugin` installs: one per process, so that a
#: worker set up again removes the one it added.
digest_gpu_time = GPUTimeDigest()


class TaskTimes:
    """Launches' GPU time into distributed's metrics and Prometheus, and an NVTX range
    over each task, from :meth:`setup` to :meth:`teardown` of a worker."""

    def __init__(self):
        #: The NVTX ranges of running tasks by key (None when not set up).
        self.ranges = None

    def setup(self, worker) -> None:
        if self.ranges is None:  # set up once: one recorder to remove on teardown
            prometheus.install(digest_gpu_time)  # before the first launch makes its sinks
            metrics.add_recorder(digest_gpu_time)
        self.ranges = {}

    def teardown(self, worker) -> None:
        if self.ranges is None:
            return
        metrics.remove_recorder(digest_gpu_time)
        for range_id in self.ranges.values():
            metrics.end_range(range_id)
        self.ranges = None

    def transition(self, key, start, finish) -> None:
        """An NVTX range over a task's run, named after its key's prefix (a bounded set
        of names: NVTX registers each one). Opened here, closed on another thread."""
        ranges = self.ranges
        if ranges is None or "executing" not in (start, finish):
            return
        if finish == "executing":
            range_id = metrics.start_range(key_split(key))
            if range_id is not None:
                ranges[key] = range_id
        elif key in ranges:
            metrics.end_range(ranges.pop(key))
