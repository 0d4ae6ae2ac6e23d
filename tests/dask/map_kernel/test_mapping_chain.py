"""Chains of map_kernels fused into one task per chunk."""

from __future__ import annotations

import gc
import math
import pickle

import dask
import dask.array as da
import numpy as np
import pytest
from kit.kernels import saxpy_lazy as saxpy
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.task import run_chunk
from daskgpu._dask.map_kernel import chunk_task


@dg.jit
def increment(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def _launch_tasks(z):
    """The names of the layers whose tasks z's graph holds."""
    return {k[0] if isinstance(k, tuple) else k for k in dict(z.__dask_graph__())}


def _inputs(n=40, chunks=10):
    rng = np.random.default_rng(0)
    xn, yn = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    return xn, yn, da.from_array(xn, chunks=chunks), da.from_array(yn, chunks=chunks)


def test_a_chain_runs_in_one_task_per_chunk(simulate):
    xn, yn, x, y = _inputs()
    two = np.float32(2)
    first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), two, x, y)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), two, first, y)
    layers = _launch_tasks(z)
    assert first.name not in layers  # the intermediate has no tasks of its own
    assert z.name in layers
    assert len([k for k in dict(z.__dask_graph__()) if k[0] == z.name]) == math.prod(x.numblocks)
    np.testing.assert_array_equal(z.compute(), two * (two * xn + yn) + yn)
    np.testing.assert_array_equal(first.compute(), two * xn + yn)  # still computable alone


def test_fused_tasks_pickle_and_name_both_kernels(simulate):
    _, _, x, y = _inputs()
    first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, y)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), first, y)
    graph = dict(z.__dask_graph__())
    assert graph[(z.name, 0)].func is run_chunk
    fused = graph[(z.name, 0)].args[0].value  # a small graph: carried in each task
    assert isinstance(fused, chunk_task.Fused)
    assert fused.__name__ == "saxpy+saxpy"
    again = pickle.loads(pickle.dumps(fused))
    assert (again.slot, again.count) == (fused.slot, fused.count)


def test_longer_chains_and_two_fused_inputs(simulate):
    xn, yn, x, y = _inputs()
    one = np.float32(1)
    a = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, x, y)       # x + y
    b = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, a, y)       # x + 2y
    c = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, b, y)       # x + 3y
    assert not {a.name, b.name} & _launch_tasks(c)
    np.testing.assert_array_equal(c.compute(), ((xn + yn) + yn) + yn)
    p = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, x, y)
    q = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(3), y, x)
    r = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), p, q)
    assert not {p.name, q.name} & _launch_tasks(r)
    np.testing.assert_array_equal(r.compute(), 2 * (xn + yn) + (3 * yn + xn))


@pytest.mark.parametrize("case", ["twice", "rechunked", "halo", "written", "derived", "off"])
def test_what_is_not_fused(simulate, case):
    xn, yn, x, y = _inputs()
    one = np.float32(1)
    first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, x, y)
    expected = None
    with dask.config.set({"daskgpu.fuse-chains": case != "off"}):
        if case in ("twice", "off"):
            z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, first, first)
            expected = 2 * (xn + yn)
        elif case == "rechunked":
            z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, first,
                              y.rechunk(5))
            expected = xn + 2 * yn
        elif case == "halo":
            z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, first, y, depth=1)
            expected = xn + 2 * yn
        elif case == "written":
            z = dg.map_kernel(increment, first)
            expected = xn + yn + 1
        else:
            z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), one, first + 0, y)
            expected = xn + 2 * yn
    assert first.name in _launch_tasks(z)
    np.testing.assert_allclose(z.compute(), expected, rtol=1e-6)


def test_chains_are_found_by_name_and_nothing_is_stored_on_the_array(simulate):
    from daskgpu._dask.map_kernel.chains import chains

    _, _, x, y = _inputs()
    first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, y)
    assert "_daskgpu_chain" not in getattr(first, "__dict__", {})
    link = chains.lookup(first.name)
    assert link is not None and link.of(first) and not link.of(first + 0)
    assert len(chains) <= chains.maxsize
    del first
    gc.collect()
    assert link.launch is None and link.args is None  # the array gone, the link lets go


def test_a_persisted_result_is_read_not_computed_again(simulate):
    xn, yn, x, y = _inputs()
    first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(1), x, y).persist()
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(1), first, y)
    assert first.name in _launch_tasks(z)  # its stored chunks, not a fused launch
    np.testing.assert_array_equal(z.compute(), (xn + yn) + yn)


def test_the_setting_is_validated():
    from daskgpu import _config
    from daskgpu._errors import ConfigError

    assert _config.check()["fuse-chains"] is True
    with dask.config.set({"daskgpu.fuse-chains": "maybe"}), pytest.raises(
            ConfigError, match="fuse-chains"):
        _config.check()


# -- on a GPU -----------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_chain_over_host_chunks_is_exact():
    rng = np.random.default_rng(3)
    n = 3 << 22  # chunks of 16 MiB and more go through the copy pipeline
    xn, yn = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    x, y = da.from_array(xn, chunks=1 << 22), da.from_array(yn, chunks=1 << 22)
    two = np.float32(2)
    with dask.config.set({"daskgpu.simulate": False}):
        first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), two, x, y)
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), two, first, y)
        assert first.name not in _launch_tasks(z)
        with dask.config.set(scheduler="threads"):
            got = z.compute()
        np.testing.assert_array_equal(got, two * (two * xn + yn) + yn)
        small = dg.map_kernel(saxpy, dg.Out(np.float32, like=x[:1000]), two, x[:1000], y[:1000])
        w = dg.map_kernel(saxpy, dg.Out(np.float32, like=small), two, small, y[:1000])
        np.testing.assert_array_equal(w.compute(), two * (two * xn[:1000] + yn[:1000]) + yn[:1000])


@pytest.mark.gpu
def test_gpu_chain_over_cupy_chunks_stays_on_the_device():
    cupy = pytest.importorskip("cupy")
    xc = cupy.arange(1 << 16, dtype=cupy.float32)
    x = da.from_array(xc, chunks=1 << 14, asarray=False)
    with dask.config.set({"daskgpu.simulate": False}):
        first = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), first, x)
        result = z.compute()
        assert isinstance(result, cupy.ndarray)
        cupy.testing.assert_allclose(result, 7 * xc)
