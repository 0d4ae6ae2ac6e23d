"""On a GPU: blocks of steps keep their states on the device (host chunks through the
device chain, two buffers a state taking turns; CuPy chunks as they are), fill the
boundary with the fill kernel, and give what a NumPy loop of single steps gives."""

import dask
import dask.array as da
import numpy as np
import pytest
from kit import stencils
from kit.kernels import heat_2d, heat_3d, life, wave_1d

import daskgpu as dg

pytestmark = pytest.mark.gpu
A = np.float32(0.2)


@pytest.fixture
def on_gpu():
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "sync"}):
        yield


@pytest.mark.parametrize("boundary", [0.5, "reflect", "nearest", "periodic", "none"])
def test_heat_on_host_chunks_equals_a_loop_of_single_steps(on_gpu, boundary):
    x = np.random.default_rng(0).random((70, 45)).astype(np.float32)
    u0 = da.from_array(x, chunks=((20, 30, 20), (25, 20)))
    u = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, steps=11, depth=1,
                   boundary=boundary, group=False, block_steps=4)
    (want,) = stencils.loop(stencils.heat(A), [x], [], 11, 1, boundary)
    np.testing.assert_allclose(u.compute(), want, rtol=1e-5, atol=1e-6)


def test_heat_3d_fills_each_axis_on_the_device(on_gpu):
    x = np.random.default_rng(1).random((12, 10, 9)).astype(np.float32)
    u0 = da.from_array(x, chunks=(6, 5, 9))
    u = dg.iterate(heat_3d, dg.Out(np.float32, like=u0), u0, A, steps=5, depth=1,
                   boundary=-1.0, group=False, block_steps=3)
    (want,) = stencils.loop(stencils.heat(A), [x], [], 5, 1, -1.0)
    np.testing.assert_allclose(u.compute(), want, rtol=1e-5, atol=1e-6)


def test_two_states_from_one_chunk_rotate_through_the_buffers(on_gpu):
    x = np.random.default_rng(2).random(300).astype(np.float32)
    u0 = da.from_array(x, chunks=(100, 120, 80))
    c2 = da.full(300, 0.3, dtype=np.float32, chunks=(100, 120, 80))
    u, u_prev = dg.iterate(wave_1d, dg.Out(np.float32, like=u0), u0, u0, c2, steps=13,
                           depth=1, boundary="reflect", group=False, block_steps=5,
                           state={"u": "u_next", "u_prev": "u"})
    want = stencils.loop(stencils.wave, [x, x], [c2.compute()], 13, 1, "reflect")
    np.testing.assert_allclose(u.compute(), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(u_prev.compute(), want[1], rtol=1e-4, atol=1e-5)


def test_life_on_cupy_chunks_stays_cupy_and_is_exact(on_gpu):
    cp = pytest.importorskip("cupy")
    board = (np.random.default_rng(3).random((64, 48)) < 0.3).astype(np.uint8)
    b0 = da.from_array(cp.asarray(board), chunks=(32, (20, 28)))
    b = dg.iterate(life, dg.Out(np.uint8, like=b0), b0, steps=9, depth=1, boundary=0,
                   group=False, block_steps=4)
    got = b.compute()
    assert type(got).__module__.startswith("cupy")
    (want,) = stencils.loop(stencils.life, [board], [], 9, 1, 0)
    np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("boundary", ["none", 0.5])
def test_the_default_layout_merges_chunks_and_blocks_steps_exactly(on_gpu, on_device,
                                                                   boundary):
    # One group spans each axis: with "none" no halo is exchanged at all, with a
    # constant the block's halo is the boundary, filled again after each step.
    x = np.random.default_rng(4).random((70, 45)).astype(np.float32)
    u0 = da.from_array(x, chunks=((20, 30, 20), (25, 20)))
    if on_device:
        cp = pytest.importorskip("cupy")
        u0 = u0.map_blocks(cp.asarray)
    u = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, steps=11, depth=1,
                   boundary=boundary)
    assert u.numblocks == (1, 1) != u0.numblocks
    got = u.compute()
    got = got.get() if on_device else got
    (want,) = stencils.loop(stencils.heat(A), [x], [], 11, 1, boundary)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
