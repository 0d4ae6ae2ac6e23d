"""2-D heat equation: an explicit stencil over a chunked grid, halos by ``depth=1``.

    python examples/heat2d.py            # on the GPUs of this machine
    python examples/heat2d.py --simulate # without a GPU (slow, small)

Each step launches a ``cuda.grid(2)`` kernel once per chunk. ``depth=1``
hands every chunk a one-cell halo from its neighbours (as ``da.map_overlap``
does) and ``boundary=0.0`` holds the edges of the plate at zero; the output is
allocated like the extended chunk and trimmed after.
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


@dg.jit("void(float64[:, ::1], float64[:, ::1], float64)")
def heat_step(out, u, alpha):
    i, j = cuda.grid(2)
    n, m = u.shape
    if i < n and j < m:
        if 0 < i < n - 1 and 0 < j < m - 1:
            out[i, j] = u[i, j] + alpha * (
                u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
            )
        else:  # halo cells: trimmed away afterwards
            out[i, j] = u[i, j]


def initial(n):
    """A cold ``n`` x ``n`` plate with a hot square in the middle."""
    u = np.zeros((n, n))
    u[n // 3: 2 * n // 3, n // 3: 2 * n // 3] = 100.0
    return u


def reference(u, steps, alpha):
    """The same scheme in NumPy, with zero outside the plate."""
    for _ in range(steps):
        p = np.pad(u, 1)
        u = u + alpha * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u)
    return u


def main(n=None, simulate=None, cluster=None, steps=None, alpha=0.2):
    """Run ``steps`` steps on an ``n`` x ``n`` plate; return the final temperatures.

    ``n`` defaults to 4096 on GPUs and 24 when simulated; ``steps`` to 20 and 4.
    """
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (24 if simulated else 4096)
        steps = steps or (4 if simulated else 20)

        u0 = initial(n)
        u = da.from_array(u0, chunks=-(-n // 2))
        t0 = time.perf_counter()
        for step in range(steps):
            u = dg.map_kernel(heat_step, dg.Out(np.float64, like=u), u, alpha,
                              depth=1, boundary=0.0)
            if step % 10 == 9:  # keep the graph short
                u = client.persist(u)
        result = client.compute(u, sync=True)
        seconds = time.perf_counter() - t0

        np.testing.assert_allclose(result, reference(u0, steps, alpha), rtol=1e-12, atol=1e-12)
        print(f"{steps} heat steps on a {n}x{n} plate in {u.numblocks} chunks"
              f"{' (simulated)' if simulated else ''}: {seconds:.3f} s, matches NumPy; "
              f"total heat {result.sum():.1f}")
        return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="grid points per side")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate, steps=args.steps)
