"""Conway's Game of Life on a torus, many generations a task with ``dg.iterate``.

    python examples/game_of_life.py            # on the GPUs of this machine
    python examples/game_of_life.py --simulate # without a GPU (slow, small)

Each task advances its chunk of the board a block of generations on the GPU,
with a halo as deep as the block needs (``depth=1`` a generation); the board
wraps around (``boundary="periodic"``). Dask exchanges halos once per block, not
once per generation. The result is compared, cell for cell, with a NumPy loop.
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


@dg.jit("void(uint8[:, ::1], uint8[:, ::1])")
def life(out, board):
    i, j = cuda.grid(2)
    n, m = board.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        alive = 0
        for di in range(-1, 2):
            for dj in range(-1, 2):
                alive += board[i + di, j + dj]
        alive -= board[i, j]
        out[i, j] = 1 if alive == 3 or (alive == 2 and board[i, j]) else 0
    elif i < n and j < m:  # the chunk's halo: thrown away after the block
        out[i, j] = board[i, j]


def initial(n, seed=0):
    """A random ``n`` x ``n`` board, a quarter of it alive."""
    return (np.random.default_rng(seed).random((n, n)) < 0.25).astype(np.uint8)


def reference(board, generations):
    """The same generations in NumPy, on a torus."""
    for _ in range(generations):
        alive = sum(np.roll(np.roll(board, di, 0), dj, 1).astype(np.int64)
                    for di in (-1, 0, 1) for dj in (-1, 0, 1)) - board
        board = ((alive == 3) | ((alive == 2) & (board == 1))).astype(np.uint8)
    return board


def main(n=None, simulate=None, cluster=None, generations=None, chunks=2, block_steps=None):
    """Run ``generations`` generations on an ``n`` x ``n`` board in ``chunks`` x ``chunks``
    chunks; return the final board.

    ``n`` defaults to 8192 on GPUs and 12 when simulated; ``generations`` to 1000 and 5.
    """
    with ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(
                dg.LocalGPUCluster(simulate=simulate, dashboard_address=None))
        client = stack.enter_context(Client(cluster))
        simulated = getattr(cluster, "simulated", bool(simulate))
        n = n or (12 if simulated else 8192)
        generations = generations or (5 if simulated else 1000)

        board = initial(n)
        b0 = da.from_array(board, chunks=-(-n // chunks))
        t0 = time.perf_counter()
        final = dg.iterate(life, dg.Out(np.uint8, like=b0), b0, steps=generations, depth=1,
                           boundary="periodic", block_steps=block_steps)
        result = client.compute(final, sync=True)
        seconds = time.perf_counter() - t0

        np.testing.assert_array_equal(result, reference(board, generations))
        print(f"{generations} generations of a {n}x{n} board in {b0.numblocks} chunks, "
              f"stepped in {final.numblocks}{' (simulated)' if simulated else ''}: "
              f"{seconds:.3f} s, matches NumPy; "
              f"{int(result.sum())} cells alive")
        return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, help="cells per side")
    parser.add_argument("--generations", type=int)
    parser.add_argument("--block-steps", type=int, help="generations per task (default: "
                        "chosen from the chunks' size and the halo)")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    main(args.n, args.simulate, generations=args.generations, block_steps=args.block_steps)
