"""Estimate pi by Monte Carlo, with a counter-based random hash and ``dg.offset``.

    python examples/monte_carlo_pi.py            # on the GPUs of this machine
    python examples/monte_carlo_pi.py --simulate # without a GPU (slow, small)

Sample ``k`` draws its point from a hash of ``(seed, k)``, so the result does
not depend on how the samples are chunked or which GPU runs which chunk. The
kernel learns ``k`` from ``dg.offset``, the chunk's global start index.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg

MASK32 = 0xFFFFFFFF


@cuda.jit(device=True)
def mul32(a, b):
    """``(a * b) mod 2**32`` for 32-bit ``a``, ``b``, without overflowing int64."""
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & MASK32


@cuda.jit(device=True)
def hash32(x):
    """Chris Wellons' lowbias32 integer hash."""
    x ^= x >> 16
    x = mul32(x, 0x7FEB352D)
    x ^= x >> 15
    x = mul32(x, 0x846CA68B)
    x ^= x >> 16
    return x


@cuda.jit(device=True)
def uniform(seed, k, stream):
    """A uniform float in [0, 1) for sample ``k`` of random stream ``stream``."""
    h = hash32((k & MASK32) ^ seed)
    h = hash32(h ^ (k >> 32) ^ mul32(stream, 0x9E3779B9))
    return h / 4294967296.0


@dg.jit("void(uint8[::1], int64, int64)")
def in_circle(hits, start, seed):
    i = cuda.grid(1)
    if i < hits.size:
        k = start + i
        x = uniform(seed, k, 1)
        y = uniform(seed, k, 2)
        hits[i] = 1 if x * x + y * y < 1.0 else 0


# The same hash in NumPy, to check the kernel.
def _np_mul32(a, b):
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & MASK32


def _np_hash32(x):
    x = x ^ (x >> 16)
    x = _np_mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _np_mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def reference_hits(n, seed):
    k = np.arange(n, dtype=np.int64)

    def u(stream):
        h = _np_hash32((k & MASK32) ^ seed)
        return _np_hash32(h ^ (k >> 32) ^ _np_mul32(stream, 0x9E3779B9)) / 4294967296.0

    x, y = u(1), u(2)
    return int((x * x + y * y < 1.0).sum())


def main(n=None, simulate=None, cluster=None, seed=2024):
    """Estimate pi from ``n`` samples; return ``(estimate, hits)``.

    ``n`` defaults to 2**30 on GPUs and 4,000 when simulated.
    """
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(dg.LocalGPUCluster(simulate=simulate))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (4_000 if simulated else 1 << 30)
        nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
        chunks = -(-n // (4 * nworkers))

        samples = dg.Out(np.uint8, shape=(n,), chunks=chunks)
        hits = dg.map_kernel(in_circle, samples, dg.offset, seed)
        t0 = time.perf_counter()
        count = int(client.compute(hits.sum(dtype=np.int64), sync=True))
        seconds = time.perf_counter() - t0
        estimate = 4.0 * count / n
        print(f"pi ~ {estimate:.6f} from {n:,} samples in {hits.numblocks[0]} chunks"
              f"{' (simulated)' if simulated else ''}: {seconds:.3f} s "
              f"(error {abs(estimate - np.pi):.2e})")
        if n <= 1 << 24:
            assert count == reference_hits(n, seed), "the kernel disagrees with NumPy"
        return estimate, count


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="number of samples")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate)
