"""saxpy over a dask array: one kernel launch per chunk, on every local GPU.

    python examples/saxpy_dask.py            # on the GPUs of this machine
    python examples/saxpy_dask.py --simulate # without a GPU (slow, small)

The kernel is compiled once, here, to PTX; each worker links it for its own
GPU. ``dg.Out(np.float32, like=x)`` allocates each output chunk on the
worker, next to the input chunks.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

import dask.array as da
import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg


@dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def main(n=None, simulate=None, cluster=None, chunks=None):
    """Compute ``2.5 * x + y`` for random ``x``, ``y`` of ``n`` float32; return it.

    ``n`` defaults to 2**25 on GPUs and 4,000 when simulated; ``cluster``
    defaults to a :class:`daskgpu.LocalGPUCluster` started here.
    """
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (4_000 if simulated else 1 << 25)
        nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
        chunks = chunks or -(-n // (2 * nworkers))

        rng = da.random.default_rng(0)
        x = rng.random(n, dtype=np.float32, chunks=chunks)
        y = rng.random(n, dtype=np.float32, chunks=chunks)
        a = np.float32(2.5)

        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), a, x, y)
        t0 = time.perf_counter()
        z_np, x_np, y_np = client.compute([z, x, y], sync=True)
        seconds = time.perf_counter() - t0

        np.testing.assert_allclose(z_np, a * x_np + y_np, rtol=1e-6)
        print(f"saxpy over {n:,} elements in {z.numblocks[0]} chunks on {nworkers} "
              f"worker(s){' (simulated)' if simulated else ''}: {seconds:.3f} s, "
              "matches NumPy")
        return z_np


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="elements per array")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate)
