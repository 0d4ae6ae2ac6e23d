"""``dg.iterate`` gives what a NumPy loop of single steps gives, whatever its blocks.

Each case runs a step count that is no multiple of its block over irregular
chunks, simulated on Dask's synchronous scheduler; the suite runs this file on
the other graph layer too (tests/dask/test_both_layers.py). Arrays are tiny
and launches small (``tpb=16``): the simulator runs each CUDA thread as a
Python thread.
"""

import math

import dask.array as da
import numpy as np
import pytest
from dask.array.core import PerformanceWarning
from kit import stencils
from kit.kernels import fails_at_85, heat_1d, heat_2d, heat_3d, life, minus_first, wave_1d

import daskgpu as dg

A = np.float32(0.2)


def _field(shape, seed=0):
    return np.random.default_rng(seed).random(shape).astype(np.float32)


@pytest.mark.parametrize("boundary", ["periodic", 1.5])
def test_heat_2d_equals_a_loop_of_single_steps(simulate, boundary):
    x = _field((7, 6))
    u0 = da.from_array(x, chunks=((3, 4), (2, 4)))
    u = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, steps=3, depth=1,
                   boundary=boundary, group=False, block_steps=2, tpb=16)
    (want,) = stencils.loop(stencils.heat(A), [x], [], 3, 1, boundary)
    assert u.chunks == u0.chunks
    np.testing.assert_allclose(u.compute(), want, rtol=1e-6)


@pytest.mark.parametrize("boundary", ["reflect", "nearest", "none", -2.0])
def test_every_boundary_kind_equals_a_loop_of_single_steps(simulate, boundary):
    x = _field(11)
    u0 = da.from_array(x, chunks=(3, 5, 3))
    u = dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, steps=5, depth=1,
                   boundary=boundary, group=False, block_steps=3, tpb=16)
    (want,) = stencils.loop(stencils.heat(A), [x], [], 5, 1, boundary)
    np.testing.assert_allclose(u.compute(), want, rtol=1e-6)


def test_heat_3d_with_a_boundary_per_axis(simulate):
    x = _field((4, 3, 4))
    u0 = da.from_array(x, chunks=((2, 2), 3, (3, 1)))
    boundary = {0: "periodic", 1: 0.5, 2: "reflect"}
    u = dg.iterate(heat_3d, dg.Out(np.float32, like=u0), u0, A, steps=2, depth=1,
                   boundary=boundary, group=False, block_steps=1, tpb=16)
    want = x
    for _ in range(2):  # the padding axis by axis, as Dask's overlap pads
        p = np.pad(want, ((1, 1), (0, 0), (0, 0)), mode="wrap")
        p = np.pad(p, ((0, 0), (1, 1), (0, 0)), constant_values=0.5)
        p = np.pad(p, ((0, 0), (0, 0), (1, 1)), mode="symmetric")
        want = stencils.heat(A)(p)[0][1:-1, 1:-1, 1:-1]
    np.testing.assert_allclose(u.compute(), want, rtol=1e-6)


def test_a_wave_rotates_two_states_over_a_fixed_map(simulate):
    x = _field(13)
    c2 = da.from_array(np.linspace(0.1, 0.4, 13, dtype=np.float32), chunks=(4, 6, 3))
    u0 = da.from_array(x, chunks=(4, 6, 3))
    u, u_prev = dg.iterate(wave_1d, dg.Out(np.float32, like=u0), u0, u0 * np.float32(0.9),
                           c2, steps=5, depth=1, boundary=0, group=False, block_steps=2, tpb=16,
                           state={"u": "u_next", "u_prev": "u"})
    want = stencils.loop(stencils.wave, [x, x * np.float32(0.9)], [c2.compute()], 5, 1, 0)
    np.testing.assert_allclose(u.compute(), want[0], rtol=1e-6)
    np.testing.assert_allclose(u_prev.compute(), want[1], rtol=1e-6)


def test_state_by_position_is_the_same_as_by_name(simulate):
    u0 = da.from_array(_field(8), chunks=4)
    c2 = da.full(8, 0.25, dtype=np.float32, chunks=4)
    by_name = dg.iterate(wave_1d, dg.Out(np.float32, like=u0), u0, u0, c2, steps=2, depth=1,
                         state={"u": "u_next", "u_prev": "u"}, tpb=16)
    by_position = dg.iterate(wave_1d, dg.Out(np.float32, like=u0), u0, u0, c2, steps=2,
                             depth=1, state={1: 0, 2: 1}, tpb=16)
    assert by_name[0].name == by_position[0].name


def test_game_of_life_is_exact(simulate):
    board = np.zeros((8, 7), np.uint8)
    board[1, 2] = board[2, 3] = board[3, 1] = board[3, 2] = board[3, 3] = 1  # a glider
    b0 = da.from_array(board, chunks=((3, 5), (4, 3)))
    b = dg.iterate(life, dg.Out(np.uint8, like=b0), b0, steps=3, depth=1,
                   boundary="periodic", group=False, block_steps=2, tpb=16)
    (want,) = stencils.loop(stencils.life, [board], [], 3, 1, "periodic")
    np.testing.assert_array_equal(b.compute(), want)
    assert b.dtype == np.uint8


def test_the_default_block_runs_the_steps_in_fewer_tasks(simulate):
    x = _field(12)
    u0 = da.from_array(x, chunks=6)
    u = dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, steps=5, depth=1,
                   boundary="periodic", tpb=16)
    (want,) = stencils.loop(stencils.heat(A), [x], [], 5, 1, "periodic")
    np.testing.assert_allclose(u.compute(), want, rtol=1e-6)


@pytest.mark.parametrize("boundary", ["periodic", "none"])
def test_chunks_merge_by_default_into_fewer_tasks_with_the_same_steps(simulate, boundary):
    # Merged into one chunk, "none" exchanges no halo at all: nothing lies beyond it.
    x = _field((12, 12))
    u0 = da.from_array(x, chunks=3)  # 16 chunks
    kw = dict(steps=5, depth=1, boundary=boundary, tpb=16)
    u = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, **kw)
    apart = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, group=False, **kw)
    (want,) = stencils.loop(stencils.heat(A), [x], [], 5, 1, boundary)
    assert math.prod(u.numblocks) < math.prod(u0.numblocks) == math.prod(apart.numblocks)
    assert len(dict(u.__dask_graph__())) < len(dict(apart.__dask_graph__()))
    np.testing.assert_allclose(u.compute(), want, rtol=1e-6)
    np.testing.assert_allclose(apart.compute(), want, rtol=1e-6)


def test_a_kernel_that_can_tell_where_its_chunk_begins_runs_one_step_a_task(simulate):
    # x[0] is the first cell of whatever the kernel is given: blocks (deeper halos) or
    # merged chunks would hand it another cell, so only single steps give the loop's result.
    u0 = da.from_array(_field(12), chunks=(5, 4, 3))
    kw = dict(depth=1, boundary="periodic", tpb=16)
    with pytest.warns(PerformanceWarning, match=r"one step a task.*x\[0\].*block_steps="):
        u = dg.iterate(minus_first, dg.Out(np.float32, like=u0), u0, steps=3, **kw)
    want = u0
    for _ in range(3):
        want = dg.map_kernel(minus_first, dg.Out(np.float32, like=want), want, group=False,
                             **kw)
    assert u.chunks == u0.chunks
    np.testing.assert_array_equal(u.compute(), want.compute())


def test_a_kernel_error_in_merged_chunks_names_the_users_chunk(simulate):
    u0 = da.from_array(np.arange(160, dtype=np.float32), chunks=16)  # 85 is in chunk 5
    u = dg.iterate(fails_at_85, dg.Out(np.float32, like=u0), u0, dg.offset, steps=2)
    assert u.numblocks[0] < u0.numblocks[0]
    with pytest.raises(ValueError, match=r"on chunk \(5,\) at offset \(80,\) \(in a grouped "
                                         r"launch over chunks \(0,\) to \(9,\)\).*element 85"):
        u.compute()


def test_zero_steps_give_the_initial_state(simulate):
    u0 = da.ones(4, chunks=2, dtype=np.float32)
    assert dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, steps=0, depth=1) is u0
