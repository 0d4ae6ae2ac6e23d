"""Independent kernel launches on many NumPy arrays with ``client.map``.

    python examples/batch_map.py            # on the GPUs of this machine
    python examples/batch_map.py --simulate # without a GPU (slow, small)

No dask array here: a :class:`daskgpu.Launch` (``kernel.configure(...)`` or
``kernel.forall(n)``) is a picklable callable holding only PTX, so Dask can
map it over a batch of host arrays like any function. Each call returns what
the kernel wrote: here the output array, copied back from the GPU.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg


@dg.jit("void(float64[::1], float64[::1], float64[::1])")
def polyval(out, x, coeffs):
    """Evaluate the polynomial ``coeffs`` (highest power first) at each ``x``."""
    i = cuda.grid(1)
    if i < x.size:
        acc = 0.0
        for k in range(coeffs.size):
            acc = acc * x[i] + coeffs[k]
        out[i] = acc


def main(n=None, simulate=None, cluster=None, batch=8):
    """Evaluate a polynomial on ``batch`` arrays of up to ``n`` points; return the results.

    ``n`` defaults to 2**22 on GPUs and 300 when simulated.
    """
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (300 if simulated else 1 << 22)

        rng = np.random.default_rng(1)
        xs = [rng.uniform(-1, 1, size=rng.integers(n // 2, n + 1)) for _ in range(batch)]
        outs = [np.empty_like(x) for x in xs]
        coeffs = np.array([0.5, -1.0, 2.0, 3.0])

        # One launch configuration that covers the longest array; the kernel's
        # bounds check leaves the threads past a shorter array idle.
        threads = 128
        launch = polyval.configure(-(-max(x.size for x in xs) // threads), threads)
        t0 = time.perf_counter()
        futures = client.map(launch, outs, xs, [coeffs] * batch)
        results = client.gather(futures)
        seconds = time.perf_counter() - t0

        # A forall launch sizes the grid itself, here for one more array.
        extra = rng.uniform(-1, 1, size=n)
        results.append(client.submit(polyval.forall(extra.size), np.empty_like(extra),
                                     extra, coeffs).result())
        xs.append(extra)

        for x, r in zip(xs, results):
            np.testing.assert_allclose(r, np.polyval(coeffs, x), rtol=1e-9)
        print(f"{len(results)} independent launches over up to {n:,} points"
              f"{' (simulated)' if simulated else ''}: {seconds:.3f} s for the batch, "
              "matches NumPy")
        return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="points per array (at most)")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate)
