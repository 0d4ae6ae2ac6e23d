"""The sections ``compute`` and ``scaling``: a compute-bound kernel, where copies
hardly count.

``compute`` maps it over host chunks on the run's cluster, against the same
kernel on the whole array in this process; ``scaling`` maps it on 1, 2, ... N
GPUs, a cluster of its own for each count.
"""

from __future__ import annotations

import numpy as np

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
