"""Per-chunk statistics, then the same statistics aggregated across chunks.

    python examples/chunk_stats.py            # on the GPUs of this machine
    python examples/chunk_stats.py --simulate # without a GPU (slow, small)

One kernel computes a chunk's count, sum, sum of squares, minimum and maximum
into per-chunk outputs (``dg.Out(..., per_chunk=1)``): a table with one row
per chunk. With ``combine=`` the same kernel gives the whole array's
statistics, each combined its own way (sums added, minima and maxima kept).
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

import dask
import dask.array as da
import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg


@dg.jit("void(float64[::1], float64[::1], float64[::1], float64[::1], float32[::1])")
def moments(sums, squares, low, high, x):
    i = cuda.grid(1)
    if i < x.size:
        v = np.float64(x[i])
        cuda.atomic.add(sums, 0, v)
        cuda.atomic.add(squares, 0, v * v)
        cuda.atomic.min(low, 0, v)
        cuda.atomic.max(high, 0, v)


def statistics(x, combine):
    """Sum, sum of squares, min and max of ``x``: per chunk, or combined across chunks."""
    how = ("sum", "sum", "min", "max") if combine else (None,) * 4
    fills = (0.0, 0.0, np.inf, -np.inf)  # where each launch starts
    return dg.map_kernel(moments, *(dg.Out(np.float64, per_chunk=1, combine=c, fill=f)
                                    for c, f in zip(how, fills)), x)


def main(n=None, simulate=None, cluster=None, chunks=None):
    """Return ``(per_chunk, total)``: rows (count, mean, std, min, max) per chunk, and overall."""
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (2_000 if simulated else 1 << 27)
        chunks = chunks or -(-n // 8)

        x = da.random.default_rng(1).normal(3.0, 2.0, n, chunks=chunks).astype(np.float32)
        counts = np.array(x.chunks[0], dtype=np.float64)
        t0 = time.perf_counter()
        per_chunk, total, x_np = client.compute(
            [dask.delayed(np.hstack)(list(statistics(x, False))), statistics(x, True), x],
            sync=True)
        seconds = time.perf_counter() - t0
        table = summary(counts, *per_chunk.T)
        overall = summary(np.array([n], np.float64), *(np.asarray(t) for t in total))[0]

        want = x_np.astype(np.float64)
        np.testing.assert_allclose(overall, [n, want.mean(), want.std(), want.min(), want.max()],
                                   rtol=1e-9)
        print(f"statistics of {n:,} float32 in {x.numblocks[0]} chunks"
              f"{' (simulated)' if simulated else ''}: {seconds:.3f} s")
        print("  chunk      count       mean        std        min        max")
        for k, row in enumerate(table):
            print(f"  {k:5d} {row[0]:10.0f} {row[1]:10.4f} {row[2]:10.4f} {row[3]:10.4f} {row[4]:10.4f}")
        print(f"  total {overall[0]:10.0f} {overall[1]:10.4f} {overall[2]:10.4f} "
              f"{overall[3]:10.4f} {overall[4]:10.4f}  (matches NumPy)")
        return table, overall


def summary(count, sums, squares, low, high):
    """Rows of (count, mean, std, min, max) from counts and the kernel's sums."""
    mean = sums / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    return np.stack([count, mean, std, low, high], axis=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="number of samples")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate)
