"""The section ``batch``: ``daskgpu batch`` over a store of many small chunks, grouped
against one task a chunk.

A zarr store's chunks are sized for its disk; ``run_batch`` reads, launches
and writes neighbouring small chunks as one task (``group=``, the
``daskgpu.launch-bytes`` setting), where one task a chunk (``group=False``,
what a batch did before) pays Dask's per-task floor for every chunk. Both run
the bench's one-step ``compute`` kernel over the same store on the run's
cluster, each into an output of its own, end to end (planning, reads,
launches, writes and the ledger). One task a chunk is measured over the first
``measured`` chunks (``max_chunks``) and, for a larger store, scaled to all of
them, as the row says.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from daskgpu._cli.bench.common import BenchCluster, ratio

#: Bytes of each stored chunk: a common zarr chunk, far smaller than a launch should be.
CHUNK_BYTES = 64 << 10

#: Chunks written to the store a slice at a time, so that building it needs little memory.
WRITE_CHUNKS = 512


def bench_batch(cluster: BenchCluster, count: int = 100_000, measured: int = 10_000,
                chunk_bytes: int = CHUNK_BYTES, repeat: int = 1, directory=None) -> list:
    """``daskgpu batch`` over a zarr store of ``count`` chunks of ``chunk_bytes``, grouped
    (the default), against one task a chunk (``group=False``), same cluster and store.

    The goal is 0.2. The store and the outputs are written under ``directory``
    (default: a new temporary folder), which is removed afterwards.
    """
    from daskgpu._cli.bench.kernels import compute
    from daskgpu._dask.batch import run_batch

    client = cluster.start()
    per_chunk = max(1, chunk_bytes // 4)  # float32
    folder = tempfile.mkdtemp(prefix="daskgpu-bench-batch-", dir=directory)
    try:
        store = _store(os.path.join(folder, "x.zarr"), count, per_chunk)

        def run(name, group, max_chunks=None):
            out = os.path.join(folder, name)
            t0 = time.perf_counter()
            report = run_batch(compute, [store], [(out, np.float32)], scalars=[np.int32(1)],
                               order="out,in,scalar", client=client, progress=False,
                               resume=False, group=group, max_chunks=max_chunks)
            seconds = time.perf_counter() - t0
            done = count if max_chunks is None else min(count, max_chunks)
            assert len(report.computed) == done and not report.failed, report.summary()
            _check(store, out, per_chunk, done)
            shutil.rmtree(out)
            return seconds

        ours = [run("grouped.zarr", None) for _ in range(repeat)]
        base = [run("apart.zarr", False, max_chunks=min(count, measured))
                for _ in range(repeat)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    size = f"{chunk_bytes >> 10} KiB" if chunk_bytes % 1024 == 0 else f"{chunk_bytes} B"
    label = "daskgpu batch one task a chunk (group=False), same cluster and store"
    if count > measured:
        base = [b * count / measured for b in base]
        label += f", measured over {measured:,} chunks and scaled to {count:,}"
    return [ratio(f"batch over {count:,} zarr chunks of {size}, grouped", ours, base, "s",
                  label, goal=0.2)]


def _store(path, count, per_chunk) -> str:
    """A zarr array of ``count`` chunks of ``per_chunk`` float32; its path."""
    import zarr

    z = zarr.open_array(path, mode="w", shape=(count * per_chunk,), chunks=(per_chunk,),
                        dtype=np.float32)
    step = WRITE_CHUNKS * per_chunk
    for start in range(0, count * per_chunk, step):
        stop = min(start + step, count * per_chunk)
        z[start:stop] = _values(start, stop)
    return path


def _values(start, stop):
    """The store's values from ``start`` to ``stop``: small, so that sin and cos stay exact."""
    return (np.arange(start, stop) % 1000).astype(np.float32) / np.float32(1000)


def _check(store, out, per_chunk, done) -> None:
    """The first, a middle and the last chunk written hold the kernel's one step."""
    import zarr

    z = zarr.open_array(out, mode="r")
    for chunk in sorted({0, done // 2, done - 1}):
        start, stop = chunk * per_chunk, (chunk + 1) * per_chunk
        x = _values(start, stop)
        expected = np.sin(x) * np.float32(0.5) + np.cos(x) * np.float32(0.5)
        assert np.allclose(z[start:stop], expected, atol=1e-6), f"batch chunk {chunk}"
