"""``dg.iterate`` on a cluster of two workers: the same results, and only halos move.

The module's tests run on the graph layer this process uses; the last one runs
them again on the other (``array.query-planning``), in a process of its own.
"""

import math
import os
import pathlib
import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import wait
from kit import stencils
from kit.kernels import heat_1d, heat_2d, life, wave_1d
from layers import EXPRESSIONS

import daskgpu as dg

A = np.float32(0.2)
ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_heat_wave_and_life_equal_numpy_loops_on_two_workers(client):
    rng = np.random.default_rng(1)
    x = rng.random((7, 6)).astype(np.float32)
    u0 = da.from_array(x, chunks=((3, 4), (2, 4)))
    heat = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, steps=3, depth=1,
                      boundary=0.5, group=False, block_steps=2, tpb=16)
    w = rng.random(13).astype(np.float32)
    w0 = da.from_array(w, chunks=(4, 6, 3))
    c2 = da.full(13, 0.3, dtype=np.float32, chunks=(4, 6, 3))
    wave = dg.iterate(wave_1d, dg.Out(np.float32, like=w0), w0, w0, c2, steps=5, depth=1,
                      boundary="periodic", group=False, block_steps=2, tpb=16,
                      state={"u": "u_next", "u_prev": "u"})
    board = (rng.random((8, 7)) < 0.4).astype(np.uint8)
    b0 = da.from_array(board, chunks=((3, 5), (4, 3)))
    gens = dg.iterate(life, dg.Out(np.uint8, like=b0), b0, steps=3, depth=1,
                      boundary="periodic", group=False, block_steps=2, tpb=16)
    got_heat, (got_u, got_prev), got_life = dask.compute(heat, wave, gens)
    np.testing.assert_allclose(
        got_heat, stencils.loop(stencils.heat(A), [x], [], 3, 1, 0.5)[0], rtol=1e-6)
    want_u, want_prev = stencils.loop(stencils.wave, [w, w], [c2.compute()], 5, 1, "periodic")
    np.testing.assert_allclose(got_u, want_u, rtol=1e-6)
    np.testing.assert_allclose(got_prev, want_prev, rtol=1e-6)
    np.testing.assert_array_equal(got_life, stencils.loop(stencils.life, [board], [], 3, 1,
                                                          "periodic")[0])


def test_by_default_chunks_merge_into_a_group_per_gpu_worker(client):
    from daskgpu._dask.cluster_facts import cluster_facts

    gpus = cluster_facts().gpu_workers
    x = np.random.default_rng(3).random((16, 12)).astype(np.float32)
    u0 = da.from_array(x, chunks=4)  # 12 chunks
    u = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, steps=5, depth=1,
                   boundary="periodic", tpb=16)
    assert gpus == 2 and math.prod(u.numblocks) == gpus
    np.testing.assert_allclose(
        u.compute(), stencils.loop(stencils.heat(A), [x], [], 5, 1, "periodic")[0],
        rtol=1e-6)


def _bandwidth(dask_scheduler=None, dask_worker=None, value=None):
    """Set the network bandwidth the scheduler plans with (workers report theirs in each
    heartbeat, which the scheduler averages in); return the one it had."""
    server = dask_scheduler if dask_scheduler is not None else dask_worker
    old = server.bandwidth
    server.bandwidth = value
    return old


def _clear(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _moved(dask_worker):
    return sum(entry["total"] for entry in dask_worker.transfer_incoming_log)


def test_only_halos_move_between_workers(client):
    """Each chunk stays on its worker: per block, what moves is the halos that two
    neighbours on different workers take from each other.

    Six chunks, three a worker (fewer would make Dask's scheduler take the halo
    slices for root tasks, placed wherever a thread is free); periodic, so two
    borders run between the workers, each crossed by a halo either way per block.
    """
    a, b = sorted(client.scheduler_info()["workers"])[:2]
    n, steps, block = 16, 4, 2
    x = np.random.default_rng(2).random(6 * n)
    halves = [client.persist(da.from_array(half, chunks=n), workers=[w])
              for half, w in zip(np.split(x, 2), (a, b))]
    u0 = da.concatenate(halves)
    u = dg.iterate(heat_1d, dg.Out(x.dtype, like=u0), u0, 0.25, steps=steps, depth=1,
                   boundary="periodic", group=False, block_steps=block, tpb=16)
    client.run(_clear)
    # Chunks here are a few hundred bytes (the simulator runs a thread per cell), so cheap
    # to move that the scheduler could spread the work between workers as it likes: tell
    # it that bytes cost what a GPU chunk's megabytes cost against its compute.
    was = client.run_on_scheduler(_bandwidth, value=1)
    client.run(_bandwidth, value=1)
    try:
        u = u.persist()  # computed where the chunks are; gathered below, once measured
        wait(u)
    finally:
        client.run_on_scheduler(_bandwidth, value=was)
        client.run(_bandwidth, value=was)
    total = sum(client.run(_moved).values())
    np.testing.assert_allclose(u.compute(), stencils.loop(stencils.heat(0.25), [x], [],
                                                          steps, 1, "periodic")[0], rtol=1e-6)
    halos = 2 * 2 * steps * x.itemsize  # 2 borders, both ways, a block's steps deep
    assert abs(total - halos) <= 0.05 * halos, (total, halos)


@pytest.mark.skipif(bool(os.environ.get("DASKGPU_ITERATE_OTHER_LAYER")),
                    reason="this is the run on the other layer")
def test_the_same_on_the_other_graph_layer(client):
    env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING=str(not EXPRESSIONS),
               DASKGPU_ITERATE_OTHER_LAYER="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", __file__],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"with array.query-planning={not EXPRESSIONS}:\n{tail}"
