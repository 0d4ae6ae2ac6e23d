"""A 256-bin histogram of a dask array: per-chunk counts summed across chunks.

    python examples/histogram.py            # on the GPUs of this machine
    python examples/histogram.py --simulate # without a GPU (slow, small)

``dg.Out(np.int64, per_chunk=256, combine="sum")`` gives every launch its own
256 zeroed counters; the kernel counts its chunk into them with atomics, and
the per-chunk counts are summed by a tree reduction, as ``da.reduction`` does.
Only 256 counters per chunk leave each GPU.
"""

from __future__ import annotations

import argparse
import math
import time
from contextlib import ExitStack

import dask.array as da
import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg

BINS = 256


@dg.jit("void(int64[::1], float32[::1], float32, float32)")
def histogram(counts, x, low, high):
    i = cuda.grid(1)
    if i < x.size:
        b = math.floor((x[i] - low) / (high - low) * counts.size)
        if 0 <= b < counts.size:
            cuda.atomic.add(counts, b, 1)
        elif x[i] == high:  # the last bin is closed, as in np.histogram
            cuda.atomic.add(counts, counts.size - 1, 1)


def reference(x, low, high):
    """The kernel's binning in NumPy, in the same float32 arithmetic."""
    b = np.floor((x - low) / (high - low) * np.float32(BINS)).astype(np.int64)
    b[x == high] = BINS - 1
    return np.bincount(b[(b >= 0) & (b < BINS)], minlength=BINS)


def main(n=None, simulate=None, cluster=None, chunks=None):
    """Histogram ``n`` normal float32 samples into 256 bins over [-4, 4]; return the counts."""
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (3_000 if simulated else 1 << 28)
        nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
        chunks = chunks or -(-n // (4 * nworkers))

        x = da.random.default_rng(0).standard_normal(n, dtype=np.float32, chunks=chunks)
        low, high = np.float32(-4), np.float32(4)
        counts = dg.map_kernel(histogram, dg.Out(np.int64, per_chunk=BINS, combine="sum"),
                               x, low, high)
        t0 = time.perf_counter()
        counts_np, x_np = client.compute([counts, x], sync=True)
        seconds = time.perf_counter() - t0

        np.testing.assert_array_equal(counts_np, reference(x_np, low, high))
        print(f"{BINS}-bin histogram of {n:,} float32 in {x.numblocks[0]} chunks on "
              f"{nworkers} worker(s){' (simulated)' if simulated else ''}: {seconds:.3f} s, "
              f"{counts_np.sum():,} counted, matches NumPy")
        return counts_np


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="number of samples")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate)
