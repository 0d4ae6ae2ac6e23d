"""The sections ``compute``, ``scaling`` and ``sharing``: kernels that keep the GPU
busy, where copies count less.

``compute`` maps a compute-bound kernel over host chunks on the run's cluster,
against the same kernel on the whole array in this process; ``scaling`` maps it
on 1, 2, ... N GPUs, a cluster of its own for each count.

``sharing`` maps large and small chunks together on one GPU. Each launch asks
its worker for the device memory its chunk needs (the ``GPU-memory``
resource), so a worker with several threads runs small chunks side by side but
never two chunks that together need more than its GPU offers. The section maps
a mix of both, as two maps computed together, on a worker with
:data:`SHARING_THREADS` threads against one with one thread, as dask-cuda runs a
GPU, each on a cluster of its own.
A large chunk needs two thirds of the worker's offer, declared with
``daskgpu.device-memory`` (:attr:`Mix.device_memory`), so that real GPUs and
small arrays alike have chunks too large to run two at a time. The section
checks every result, and that no two large chunks ever ran at once (counted on
the worker by :class:`AtOnce`); the row says how many of each did at most.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin
from numba import cuda

import daskgpu as dg
from daskgpu._cli.bench.common import BenchCluster, ratio, timed, unique, wait_persisted


def bench_compute(cluster: BenchCluster, size_bytes: int = 256 << 20,
                  chunk_bytes: int = 32 << 20, iters: int = 2000) -> dict:
    """A compute-bound kernel over host chunks vs the same kernel on the whole array in
    one process."""
    import dask.array as da

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    cluster.start()  # first: the input persists on its client, the default one
    n, c = size_bytes // 4, chunk_bytes // 4
    x = wait_persisted(da.random.default_rng(1).random(n, dtype=np.float32, chunks=c))

    def ours():
        return wait_persisted(
            dg.map_kernel(k.compute, dg.Out(np.float32, like=x), x, np.int32(iters),
                          name=unique("compute")))

    whole = x.compute()

    def one_process():
        out = np.empty_like(whole)
        k.compute.forall(whole.size)(out, whole, np.int32(iters))

    ours(), one_process()
    return ratio(f"compute-bound kernel ({iters} sin/cos steps), {size_bytes >> 20} MiB host",
                 timed(ours), timed(one_process), "s",
                 "the same kernel on the whole array in one process", goal=1.05)


def bench_scaling(size_bytes: int = 512 << 20, chunk_bytes: int = 16 << 20,
                  iters: int = 2000, devices=None) -> list:
    """A compute-bound ``map_kernel`` on 1, 2, ... N GPUs, one cluster each.

    Each row compares the time on n GPUs with the ideal, a nth of the time on
    one; a ratio of at most 1/0.9 is a speed-up of at least 0.9 n.
    """
    from daskgpu._dask.cluster import resolve_devices

    devices = list(devices or resolve_devices(None, simulate=False)[0])
    rows, one_gpu = [], None
    for count in range(1, len(devices) + 1):
        seconds = _best_on_new_cluster(devices[:count], size_bytes, chunk_bytes, iters)
        one_gpu = one_gpu or seconds
        rows.append(ratio(
            f"compute-bound map_kernel, {size_bytes >> 20} MiB, on {count} GPU(s)",
            [seconds], [one_gpu / count], "s", f"1/{count} of the time on one GPU",
            goal=round(1 / 0.9, 2)))
    return rows


def _best_on_new_cluster(devices, size_bytes: int, chunk_bytes: int, iters: int) -> float:
    # The best time of scaling's map_kernel, on a new cluster of ``devices``.
    import dask.array as da
    from distributed import Client

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    n, c = size_bytes // 4, chunk_bytes // 4
    with dg.LocalGPUCluster(devices=devices, dashboard_address=None) as cluster, \
            Client(cluster):
        x = wait_persisted(da.random.default_rng(2).random(n, dtype=np.float32, chunks=c))

        def run():
            return wait_persisted(dg.map_kernel(
                k.compute, dg.Out(np.float32, like=x), x, np.int32(iters),
                name=unique("scaling")))

        run()
        return min(timed(run))


# -- sharing -----------------------------------------------------------------------------
#: Threads of daskgpu's worker in ``sharing``; the baseline's has one.
SHARING_THREADS = 4

#: The name of the worker plugin that counts the chunks running at once.
AT_ONCE = "daskgpu-bench-at-once"

_HALF = np.float32(0.5)


@dg.jit("void(float32[::1], float32[::1], int32)")
def busy_double(out, x, steps):
    # 2 x, after `steps` dependent multiply-adds that leave x as it is (halving is
    # exact): device time in proportion to steps, and a result checked exactly.
    i = cuda.grid(1)
    if i < out.size:
        v = x[i]
        half = v * _HALF
        acc = v
        for _ in range(steps):
            acc = acc * _HALF + half
        out[i] = acc + acc


@dataclasses.dataclass(frozen=True)
class Mix:
    """Host chunks of two sizes, mapped together, and the GPU-memory their worker offers.

    Two float32 inputs of ``size_bytes`` each: one in ``large`` chunks, the other in
    ``small`` ones.

    Attributes
    ----------
    size_bytes : int
        Bytes of each of the two mapped inputs.
    large, small : int
        How many large and small chunks.

    Examples
    --------
    >>> mix = Mix(1 << 30)
    >>> mix.large_chunk, mix.small_chunk  # elements
    (67108864, 4194304)
    >>> need = 2 * 4 * mix.large_chunk  # a large chunk's input and output
    >>> need / mix.device_memory
    0.6666666666666666
    """

    size_bytes: int
    large: int = 4
    small: int = 64

    def __post_init__(self):
        if min(self.large, self.small) < 1 or self.small_chunk < 1:
            raise ValueError(
                f"a mix of {self.large} large and {self.small} small chunks in "
                f"{self.size_bytes} bytes has chunks of no element; give at least one "
                f"chunk of each and at least {4 * self.small} bytes")

    @property
    def large_chunk(self) -> int:
        """Elements of each large chunk."""
        return self.size_bytes // 4 // self.large

    @property
    def small_chunk(self) -> int:
        """Elements of each small chunk."""
        return self.size_bytes // 4 // self.small

    @property
    def device_memory(self) -> int:
        """The ``GPU-memory`` each worker offers, in bytes: a large chunk's launch,
        its input and its output, needs two thirds of it."""
        return 3 * 4 * self.large_chunk


@dataclasses.dataclass(frozen=True)
class MixRuns:
    """What the timed runs of the mix on one worker gave.

    Attributes
    ----------
    seconds : list of float
        Wall-clock seconds of each run.
    large, small : int
        The most large and small chunks that ran at once, over all runs and the
        untimed first.
    """

    seconds: list
    large: int
    small: int


class AtOnce(WorkerPlugin):
    """On a worker: the most tasks whose key names start with each of ``prefixes`` that
    executed at the same time.

    A task executes from the moment the worker hands it to a thread, its resources
    taken, to the moment its result is back. The worker's own transitions count it,
    not the task stream's times: those carry the worker's estimate of its clock's
    offset from the scheduler's, taken anew at each heartbeat, so back-to-back tasks
    can seem to overlap by a millisecond or more.

    Examples
    --------
    >>> counts = AtOnce(["a-"])
    >>> for key, start, finish in [(("a-1", 0), "ready", "executing"),
    ...                            (("a-1", 1), "ready", "executing"),
    ...                            (("a-1", 0), "executing", "memory")]:
    ...     counts.transition(key, start, finish)
    >>> counts.most
    {'a-': 2}
    """

    def __init__(self, prefixes):
        self.prefixes = tuple(prefixes)
        self.most = dict.fromkeys(self.prefixes, 0)
        self.running = {p: set() for p in self.prefixes}

    def transition(self, key, start, finish, **kwargs):
        name = str(key[0] if isinstance(key, tuple) else key)
        for prefix in self.prefixes:
            if name.startswith(prefix):
                if finish == "executing":
                    self.running[prefix].add(key)
                    self.most[prefix] = max(self.most[prefix], len(self.running[prefix]))
                elif start == "executing":
                    self.running[prefix].discard(key)


def at_once_counts(dask_worker) -> dict:
    """On a worker: the counts of its :class:`AtOnce` plugin."""
    return dict(dask_worker.plugins[AT_ONCE].most)


def mix_inputs(mix: Mix):
    """The mix's two inputs, persisted on the default client: random float32 in large
    chunks, and in small ones."""
    import dask.array as da

    rng = da.random.default_rng(3)
    large = rng.random(mix.large * mix.large_chunk, dtype=np.float32, chunks=mix.large_chunk)
    small = rng.random(mix.small * mix.small_chunk, dtype=np.float32, chunks=mix.small_chunk)
    return wait_persisted(large), wait_persisted(small)


def run_mix(client, large, small, steps: int, repeat: int = 3) -> MixRuns:
    """Map :func:`busy_double` over ``large`` and ``small`` together ``repeat`` times on
    ``client`` after an untimed run, each result checked; the times and the most chunks
    of each size that ran at once."""
    from distributed import wait

    def run():
        # Both maps in one persist, so that the worker has both kinds to choose from.
        maps = client.persist([
            # Once per chunk: the section is about chunks of two sizes side by side.
            dg.map_kernel(busy_double, dg.Out(np.float32, like=x), x, np.int32(steps),
                          name=unique(f"sharing-{kind}"), group=False)
            for kind, x in (("large", large), ("small", small))])
        wait(maps)
        return maps

    def check(maps):
        for x, result in zip((large, small), maps):
            assert bool((result == 2 * x).all().compute()), "busy_double gave a wrong result"

    kinds = {"large": "sharing-large-", "small": "sharing-small-"}
    client.register_plugin(AtOnce(kinds.values()), name=AT_ONCE)
    check(run())  # also links the kernel on the worker
    seconds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        maps = run()
        seconds.append(time.perf_counter() - t0)
        check(maps)
        del maps  # the worker's memory holds one run's results at a time
    (most,) = client.run(at_once_counts).values()
    return MixRuns(seconds, most[kinds["large"]], most[kinds["small"]])


def mix_on_new_worker(mix: Mix, threads: int, steps: int, repeat: int = 3,
                      device_memory: int | None = -1, **cluster_options) -> MixRuns:
    """:func:`run_mix` on a new one-GPU cluster whose worker has ``threads`` threads and
    offers ``device_memory`` bytes of ``GPU-memory`` (-1: the mix's
    :attr:`~Mix.device_memory`; None: the setting's default, so that simulated workers
    offer none); ``cluster_options`` go to :class:`~daskgpu.LocalGPUCluster`."""
    import dask.config
    from distributed import Client

    from daskgpu import _config

    offer = mix.device_memory if device_memory == -1 else device_memory
    cluster_options = {"devices": [0], "dashboard_address": None, **cluster_options}
    _config.register()  # the daskgpu section outlives the block: the cluster's settings too
    with dask.config.set({"daskgpu.device-memory": offer}), \
            dg.LocalGPUCluster(threads_per_worker=threads, **cluster_options) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1)
        large, small = mix_inputs(mix)
        return run_mix(client, large, small, steps, repeat)


def check_large_alone(runs: MixRuns, mix: Mix) -> None:
    """Raise :class:`RuntimeError` when ``runs`` had two of ``mix``'s large chunks at once."""
    from dask.utils import format_bytes

    if runs.large > 1:
        raise RuntimeError(
            f"{runs.large} chunks that each need {format_bytes(8 * mix.large_chunk)} of the "
            f"worker's {format_bytes(mix.device_memory)} of GPU-memory ran at once: "
            "launches did not ask for their device memory; check that the scheduler runs "
            "daskgpu's GPU placement plugin and that the worker offers GPU-memory")


def bench_sharing(size_bytes: int = 1 << 30, large: int = 4, small: int = 64,
                  steps: int = 2000, repeat: int = 3, **cluster_options) -> dict:
    """Large and small chunks mapped together on one GPU: a worker with
    :data:`SHARING_THREADS` threads against one with one thread.

    Two float32 inputs of ``size_bytes``, one in ``large`` chunks that each need two
    thirds of the worker's ``GPU-memory`` (:class:`Mix`), one in ``small`` ones;
    ``cluster_options`` go to both clusters' :class:`~daskgpu.LocalGPUCluster`.
    Raises :class:`RuntimeError` when two large chunks ran at once.
    """
    from dask.utils import format_bytes

    mix = Mix(size_bytes, large, small)
    ours = mix_on_new_worker(mix, SHARING_THREADS, steps, repeat, **cluster_options)
    base = mix_on_new_worker(mix, 1, steps, repeat, **cluster_options)
    check_large_alone(ours, mix)
    row = ratio(f"{mix.large} large + {mix.small} small chunks, {SHARING_THREADS} threads "
                f"(at once: {ours.large} L, {ours.small} S)",
                ours.seconds, base.seconds, "s",
                f"the same on a worker with 1 thread, as dask-cuda runs a GPU; "
                f"2 x {format_bytes(size_bytes)}, a large chunk 2/3 of GPU-memory")
    row["at_once"] = {"daskgpu": {"large": ours.large, "small": ours.small},
                      "baseline": {"large": base.large, "small": base.small}}
    return row
