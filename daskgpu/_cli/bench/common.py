"""What the sections of ``daskgpu bench`` share.

The run's options and cluster, timing, the rows that compare daskgpu with a
baseline and their table, host inputs, and the per-chunk functions of the
``da.map_blocks`` baselines, which workers import by reference.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import numpy as np

from daskgpu._runtime.launch_task import LaunchTask


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What the command line sets for a whole ``daskgpu bench`` run.

    Attributes
    ----------
    threads_per_worker : int
        Threads of each worker of the run's cluster and of the clusters that
        first-task starts (``--threads-per-worker``); scaling's keep the default.
    array_bytes : int
        Bytes of each mapped host array (``--size``).
    time_steps : int
        Steps of the ``iterate`` section (``--steps``).

    Examples
    --------
    >>> BenchOptions(array_bytes=256 << 20)
    BenchOptions(threads_per_worker=2, array_bytes=268435456, time_steps=1000)
    """

    threads_per_worker: int = 2
    array_bytes: int = 1 << 30
    time_steps: int = 1000


class BenchCluster:
    """One LocalGPUCluster and its Client, shared by the Dask sections of a run.

    The cluster starts on the first use of :attr:`client` (or :meth:`start`),
    so that a run of sections without Dask starts none.
    :func:`~daskgpu._cli.bench.command.main` makes one per run and closes it at
    the end.

    Parameters
    ----------
    options : BenchOptions
        The run's options: the workers' threads, and the array size that sets
        how much output memory the workers page-lock.

    Attributes
    ----------
    options : BenchOptions
        As given.

    Examples
    --------
    >>> with BenchCluster(BenchOptions()) as cluster:  # doctest: +SKIP
    ...     cluster.client.submit(sum, [1, 2]).result()
    3
    """

    def __init__(self, options: BenchOptions):
        self.options = options
        self._client = None

    @property
    def client(self):
        """The :class:`distributed.Client` of the cluster, started on first use."""
        return self.start()

    @property
    def started(self) -> bool:
        """Whether the cluster and its client have started."""
        return self._client is not None

    def start(self):
        """Start the cluster and its client, the default one, unless started; the client."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self):
        import dask.config
        from distributed import Client

        from daskgpu import _config
        from daskgpu._dask.cluster import LocalGPUCluster

        # The chain section holds two mapped arrays' outputs while it maps a
        # third: page-locked memory for all three keeps its outputs off the
        # copy threads, as a user holding that much would configure it.
        locked = max(int(_config.get("pinned-output-bytes")), 4 * self.options.array_bytes)
        with dask.config.set({"daskgpu.pinned-output-bytes": locked}):
            return Client(LocalGPUCluster(threads_per_worker=self.options.threads_per_worker,
                                          dashboard_address=None))

    def close(self) -> None:
        """Close the client, then its cluster, if they started."""
        if self._client is not None:
            client, self._client = self._client, None
            cluster = client.cluster
            # The client first: its keys are released, so the scheduler does not warn
            # that the workers leaving lose data someone still wants.
            client.close()
            cluster.close()

    def __enter__(self) -> BenchCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def timed(fn, repeat: int = 3) -> list:
    """Wall-clock seconds of each of ``repeat`` calls of ``fn()``.

    Examples
    --------
    >>> len(timed(lambda: None, repeat=5))
    5
    """
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def wait_persisted(arr):
    """``arr`` persisted on the cluster, once all its chunks are there."""
    from distributed import wait

    arr = arr.persist()
    wait(arr)
    return arr


def task_seconds(client, run) -> list:
    """Seconds each task of ``run()``'s persisted result spent computing, from Dask's
    task stream: the time inside the tasks, apart from what Dask spends around them.

    Examples
    --------
    >>> import dask.array as da
    >>> from distributed import Client
    >>> with Client(processes=False, n_workers=1, dashboard_address=None) as client:
    ...     seconds = task_seconds(client, lambda: wait_persisted(da.ones(4, chunks=2) + 1))
    >>> len(seconds)
    2
    """
    from distributed import get_task_stream

    with get_task_stream(client) as stream:
        name = run().name
    return [span["stop"] - span["start"]
            for task in stream.data if isinstance(task["key"], tuple) and task["key"][0] == name
            for span in task["startstops"] if span["action"] == "compute"]


def unique(prefix: str) -> str:
    """A Dask name starting with ``prefix`` that no earlier run used.

    Each timed run gets fresh keys: equal keys would be served from the results
    of the previous run still held by the cluster.

    Examples
    --------
    >>> unique("saxpy").startswith("saxpy-"), unique("saxpy") == unique("saxpy")
    (True, False)
    """
    return f"{prefix}-{uuid.uuid4().hex}"


def ratio(what, ours, base, unit, base_name, goal=None, scale=1.0) -> dict:
    """One row of the report: the best of daskgpu's times against the best of a baseline's.

    Parameters
    ----------
    what : str
        What was measured.
    ours, base : list of float
        Samples of daskgpu and of the baseline, in seconds (or counts).
    unit : str
        The unit of the samples once multiplied by ``scale``.
    base_name : str
        What the baseline is.
    goal : float, optional
        The ratio daskgpu aims to stay at or below.
    scale : float
        Factor from the samples to ``unit``.

    Returns
    -------
    dict
        Keys ``what``, ``daskgpu``, ``baseline``, ``baseline_name``, ``unit``,
        ``ratio``, ``goal``, ``samples_daskgpu`` and ``samples_baseline``, as
        ``daskgpu bench --json`` writes them.

    Examples
    --------
    >>> row = ratio("launch", [2e-6, 3e-6], [4e-6], "us", "numba", goal=0.3, scale=1e6)
    >>> row["daskgpu"], row["baseline"], row["ratio"]
    (2.0, 4.0, 0.5)
    """
    a, b = min(ours) * scale, min(base) * scale
    return {
        "what": what,
        "daskgpu": a,
        "baseline": b,
        "baseline_name": base_name,
        "unit": unit,
        "ratio": a / b,
        "goal": goal,
        "samples_daskgpu": [x * scale for x in ours],
        "samples_baseline": [x * scale for x in base],
    }


def table(rows) -> str:
    """The rows of :func:`ratio` as the text table ``daskgpu bench`` prints.

    Examples
    --------
    >>> print(table([ratio("launch", [2e-6], [4e-6], "us", "numba", goal=0.3, scale=1e6)]))
    ... # doctest: +NORMALIZE_WHITESPACE
    comparison                                                    daskgpu   baseline   ratio   goal
    launch                                                          2u         4u   0.500 <=0.3
        baseline: numba; unit us
    """
    lines = [f"{'comparison':<58} {'daskgpu':>10} {'baseline':>10} {'ratio':>7} {'goal':>6}"]
    for r in rows:
        goal = "" if r.get("goal") is None else f"<={r['goal']}"
        lines.append(
            f"{r['what'][:58]:<58} {r['daskgpu']:>9.3g}{r['unit'][:1]} "
            f"{r['baseline']:>9.3g}{r['unit'][:1]} {r['ratio']:>7.3f} {goal:>6}"
        )
        lines.append(f"    baseline: {r['baseline_name']}; unit {r['unit']}")
    return "\n".join(lines)


def host_inputs(size_bytes: int, chunk_bytes: int):
    """Two persisted random float32 arrays of ``size_bytes`` in host chunks of ``chunk_bytes``."""
    import dask.array as da

    n, c = size_bytes // 4, chunk_bytes // 4
    rng = da.random.default_rng(0)
    x = wait_persisted(rng.random(n, dtype=np.float32, chunks=c))
    y = wait_persisted(rng.random(n, dtype=np.float32, chunks=c))
    return x, y


def numba_chunk(x, y):
    """On a worker: ``2 x + y`` of one chunk by a Numba kernel, as users write by hand."""
    from daskgpu._cli.bench import kernels as k

    out = np.empty_like(x)  # CuPy chunks get a CuPy array (NEP 18)
    k.numba_saxpy[(x.size + 255) // 256, 256](out, np.float32(2.0), x, y)
    return out


#: The saxpy kernel as a RAPIDS user writes it for CuPy: CUDA C through ``cp.RawKernel``.
SAXPY_CUDA_C = r"""
extern "C" __global__ void saxpy(float* out, float a, const float* x, const float* y,
                                 long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


def cupy_chunk(x, y):
    """On a worker: ``2 x + y`` of one CuPy chunk by a ``cp.RawKernel``, as RAPIDS users write it.

    CuPy caches the compiled kernel by its source, per process and on disk.
    """
    import cupy as cp

    kernel = cp.RawKernel(SAXPY_CUDA_C, "saxpy")
    out = cp.empty_like(x)
    kernel(((x.size + 255) // 256,), (256,), (out, np.float32(2.0), x, y, np.int64(x.size)))
    return out


def noop_chunk(x, *rest):
    """Dask's own per-chunk cost: a task that does nothing but hand back its chunk.

    Examples
    --------
    >>> x = np.arange(3)
    >>> noop_chunk(x, np.ones(3)) is x
    True
    """
    return x


def alloc_chunk(x, *rest):
    """Dask's per-chunk cost when each task makes a new chunk, as every kernel
    with an output must: an uninitialised array like ``x`` (CuPy for CuPy chunks)."""
    return np.empty_like(x)


class _Placed(LaunchTask):
    """A bench function placed as ``map_kernel``'s tasks are: a
    :class:`~daskgpu._runtime.launch_task.LaunchTask`, so that the scheduler's placement
    plugin restricts it to GPU workers with the same share.

    A ``resources`` annotation would not do: Dask's low-level task fusion, on by
    default, drops layer annotations on the way to the scheduler.
    """

    def __init__(self, func):
        self.func = func

    @property
    def timeout(self) -> None:
        return None

    def __reduce__(self):
        return _Placed, (self.func,)

    @property
    def kernel_name(self) -> str:
        return self.func.__name__

    @property
    def __name__(self):  # Dask names tasks after their function
        return self.func.__name__

    def device_bytes(self, block=None, argument_bytes=0) -> int:
        return 0

    def __call__(self, x, *rest):
        return self.func(x)


#: :func:`noop_chunk` and :func:`alloc_chunk` placed as ``map_kernel``'s tasks are.
placed_noop_chunk, placed_alloc_chunk = _Placed(noop_chunk), _Placed(alloc_chunk)
