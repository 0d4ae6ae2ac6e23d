"""Estimate pi by Monte Carlo with ``dg.random_states``: Numba's random streams, any chunking.

    python examples/monte_carlo_pi.py            # on the GPUs of this machine
    python examples/monte_carlo_pi.py --simulate # without a GPU (slow, small)

Each of ``streams`` threads draws ``draws`` points from its own xoroshiro128+
state, with ``numba.cuda.random``'s functions unchanged. ``dg.random_states``
gives stream *g* exactly state *g* of ``create_xoroshiro128p_states(streams,
seed)``, built on the worker's GPU, so the estimate is the same however the
streams are chunked and whichever GPU runs a chunk. The kernel's count per
stream is an aligned output; the total is a per-chunk output summed across
chunks.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

import dask
import numpy as np
from distributed import Client
from numba import cuda
from numba.cuda.random import (
    init_xoroshiro128p_states_cpu,
    xoroshiro128p_dtype,
    xoroshiro128p_uniform_float64,
)

import daskgpu as dg


@dg.jit
def in_circle(hits, total, states, draws):
    i = cuda.grid(1)
    if i < hits.size:
        inside = 0
        for _ in range(draws):
            x = xoroshiro128p_uniform_float64(states, i)
            y = xoroshiro128p_uniform_float64(states, i)
            if x * x + y * y < 1.0:
                inside += 1
        hits[i] = inside
        cuda.atomic.add(total, 0, inside)


def reference_hits(streams, draws, seed):
    """The hits per stream from Numba's own CPU states and draws."""
    states = np.empty(streams, xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, np.uint64(seed), 0)
    hits = np.zeros(streams, np.int32)
    for i in range(streams):
        for _ in range(draws):
            x = xoroshiro128p_uniform_float64(states, i)
            y = xoroshiro128p_uniform_float64(states, i)
            hits[i] += x * x + y * y < 1.0
    return hits


def main(streams=None, draws=None, simulate=None, cluster=None, chunks=None, seed=2024):
    """Estimate pi from ``streams * draws`` points; return ``(estimate, hits per stream)``.

    Defaults: 2**24 streams of 64 draws on GPUs, 1,000 of 4 when simulated.
    """
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        streams = streams or (1_000 if simulated else 1 << 24)
        draws = draws or (4 if simulated else 64)
        nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
        chunks = chunks or -(-streams // (4 * nworkers))

        hits, total = dg.map_kernel(
            in_circle, dg.Out(np.int32, shape=streams, chunks=chunks),
            dg.Out(np.int64, per_chunk=1, combine="sum"), dg.random_states(seed), draws)
        t0 = time.perf_counter()
        hits_np, total_np = client.compute([hits, total], sync=True)
        seconds = time.perf_counter() - t0
        n = streams * draws
        estimate = 4.0 * int(total_np[0]) / n
        assert total_np[0] == hits_np.sum()
        print(f"pi ~ {estimate:.6f} from {n:,} samples, {streams:,} streams in "
              f"{hits.numblocks[0]} chunks{' (simulated)' if simulated else ''}: "
              f"{seconds:.3f} s (error {abs(estimate - np.pi):.2e})")
        if streams * draws <= 1 << 16:
            np.testing.assert_array_equal(hits_np, reference_hits(streams, draws, seed))
            print("every stream's count matches Numba's own states and draws")
        return estimate, hits_np


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, help="number of random streams (threads)")
    parser.add_argument("--draws", type=int, help="points drawn per stream")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.streams, args.draws, args.simulate)
