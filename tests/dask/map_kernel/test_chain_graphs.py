"""Long fused chains on small chunks replayed from one captured CUDA graph per key.

Simulated: results identical with ``daskgpu.chain-graphs`` on and off (the
simulator has no graphs: its launches simply follow each other), the key a
graph is kept by, and the cache's bound. On a GPU (``gpu``): a captured graph
gives what separate launches give, is captured once per shape, and stays
right as the chunks' host arrays change.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import TaskRef
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.task import ChunkPlace, run_chunk
from daskgpu._dask.map_kernel import chunk_task
from daskgpu._errors import ConfigError
from daskgpu._runtime import backends
from daskgpu._runtime.gpu.chains import graphs

#: Launches in the chains mapped here: as many as the bench's.
LAUNCHES = 8


def _kernels():
    """A 1-D step kernel ``out = a x + 1`` and a ``dg.offset`` one, made afresh per test:
    a kernel compiled simulated carries its Python function, which then runs simulated
    wherever it goes."""

    @dg.jit
    def step(out, x, a):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + 1

    @dg.jit
    def shift(out, x, start):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + start + i

    return step, shift


def _chain(step, x, scalars):
    """``len(scalars)`` maps of ``step`` over ``x``, each over the last one's output."""
    z = x
    for a in scalars:
        z = dg.map_kernel(step, dg.Out(np.float32, like=x), z, a)
    return z


def _expected(xn, scalars):
    z = xn.astype(np.float64)
    for a in scalars:
        z = float(a) * z + 1
    return z


def _fused(z):
    """The fused launch of ``z``'s first task (a small graph carries it in each)."""
    task = dict(z.__dask_graph__())[(z.name,) + (0,) * z.ndim]
    assert task.func is run_chunk
    fused = task.args[0].value
    assert isinstance(fused, chunk_task.Fused)
    return fused


SCALARS = tuple(np.float32(0.5 + k / 8) for k in range(LAUNCHES))


@pytest.fixture
def simulate():
    with dask.config.set({"daskgpu.simulate": True, "scheduler": "sync"}):
        yield


# -- simulated -------------------------------------------------------------------------
def test_results_are_identical_with_graphs_on_and_off(simulate):
    step, _ = _kernels()
    xn = np.random.default_rng(0).random((6, 40), dtype=np.float32)
    x = da.from_array(xn, chunks=(4, 16))  # chunks of four shapes, each a flat launch
    results = {}
    for least in (0, 2, LAUNCHES):
        with dask.config.set({"daskgpu.chain-graphs": least}):
            z = _chain(step, x, SCALARS)
            assert len(list(_fused(z).steps())) == LAUNCHES  # one task per chunk runs them all
            results[least] = z.compute()
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(results[0], results[LAUNCHES])
    np.testing.assert_allclose(results[0], _expected(xn, SCALARS), rtol=1e-5)


def test_the_simulator_offers_no_graphs_and_the_gpu_its_one_cache():
    assert backends.SIMULATOR.chain_graphs() is None
    assert backends.GPU.chain_graphs() is graphs.chain_graphs


def test_chunks_of_one_shape_share_a_key_and_anything_else_differs(simulate):
    step, _ = _kernels()
    xn = np.random.default_rng(1).random(40, dtype=np.float32)
    x = da.from_array(xn, chunks=16)  # 16, 16 and 8
    fused = _fused(_chain(step, x, SCALARS))
    place = ChunkPlace((0,), (16,), (0,))

    def key(first=xn[:16], scalars=SCALARS, place=place):
        return fused.graph_key((first, *scalars), place)

    base = key()
    assert base is not None and hash(base) is not None
    # another chunk, same shape
    assert key(xn[16:32].copy(), place=ChunkPlace((1,), (16,), (16,))) == base
    assert key(xn[32:], place=ChunkPlace((2,), (8,), (32,))) != base  # the edge chunk's shape
    assert key(xn[:16].astype(np.float64)) != base  # another dtype
    assert key(xn[:32:2]) != base  # not contiguous: staged from a contiguous copy
    assert key(scalars=(np.float32(9),) + SCALARS[1:]) != base  # another number
    zero, negative_zero = SCALARS[:-1] + (np.float32(0.0),), SCALARS[:-1] + (np.float32(-0.0),)
    assert key(scalars=zero) != key(scalars=negative_zero)  # equal numbers, other bits
    assert key(scalars=SCALARS[:-1] + (0.5,)) != key(scalars=SCALARS[:-1] + (np.float32(0.5),))
    other = _fused(_chain(step, x, SCALARS[:-1]))  # a chain one launch shorter
    assert other.graph_key((xn[:16], *SCALARS[:-1]), place) != base


def test_one_array_read_by_several_launches_has_a_key_of_its_own(simulate):
    @dg.jit
    def saxpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    xn, yn = np.arange(32, dtype=np.float32), np.ones(32, dtype=np.float32)
    x, y = da.from_array(xn, chunks=16), da.from_array(yn, chunks=16)
    z = x
    for a in SCALARS[:3]:
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), a, z, y)
    fused = _fused(z)
    task = dict(z.__dask_graph__())[(z.name, 0)]
    chunk = {x.name: xn[:16], y.name: yn[:16]}
    values = tuple(chunk[a.key[0]] if isinstance(a, TaskRef) else a.value
                   for a in task.args[1:-1])
    place = task.args[-1].value
    ys = [i for i, v in enumerate(values) if v is chunk[y.name]]
    assert len(ys) == 3  # each launch reads the same chunk of y: staged once
    apart = list(values)
    apart[ys[1]] = yn[:16].copy()  # equal, but another array: staged apart
    assert fused.graph_key(values, place) != fused.graph_key(tuple(apart), place)
    other = yn[16:]  # another chunk read by every launch, as the next task's
    assert fused.graph_key(values, place) == fused.graph_key(
        tuple(other if v is chunk[y.name] else v for v in values), place)


def test_chains_a_graph_cannot_hold_have_no_key(simulate):
    step, shift = _kernels()
    xn = np.arange(32, dtype=np.float32)
    x = da.from_array(xn, chunks=16)
    place = ChunkPlace((0,), (16,), (0,))
    with_offset = dg.map_kernel(shift, dg.Out(np.float32, like=x),
                                _chain(step, x, SCALARS[:3]), dg.offset)
    fused = _fused(with_offset)
    assert fused.graph_key((xn[:16], *SCALARS[:3]), place) is None  # the offset differs per chunk
    plain = _fused(_chain(step, x, SCALARS[:3]))
    assert plain.graph_key((xn[:16], *SCALARS[:3]), place) is not None
    assert plain.graph_key((xn[:16], *SCALARS[:2], (1, 2)), place) is None  # no number
    as_list = plain.graph_key((list(xn[:16]), *SCALARS[:3]), place)
    assert as_list is None  # not a NumPy array: nothing to stage
    np.testing.assert_allclose(with_offset.compute(), _expected(xn, SCALARS[:3]) + np.arange(32),
                               rtol=1e-5)  # launched one by one


def test_what_pays_follows_the_setting_and_the_size(simulate):
    small = graphs.GRAPH_BYTES
    assert graphs.ChainGraphs.pays(4, small) and not graphs.ChainGraphs.pays(3, small)
    assert not graphs.ChainGraphs.pays(LAUNCHES, small + 1)  # a large chunk: launched one by one
    with dask.config.set({"daskgpu.chain-graphs": 0}):
        assert not graphs.ChainGraphs.pays(100, 1)
    with dask.config.set({"daskgpu.chain-graphs": "2"}):
        assert graphs.ChainGraphs.pays(2, 1)
    for wrong in (-1, "many", 1.5, True):
        with dask.config.set({"daskgpu.chain-graphs": wrong}), pytest.raises(
                ConfigError, match="chain-graphs"):
            graphs.ChainGraphs.pays(4, 1)


class _Replay:
    """A cache entry standing for a graph: it hands back the values it is replayed on."""

    def replay(self, values, name):
        return tuple(values)


def test_the_cache_captures_a_key_the_second_time_and_keeps_at_most_its_bound():
    made = []

    def capture(values, sources, launch_chain):
        made.append(values)
        return graphs.REFUSED if values == ("refuse",) else _Replay()

    cache = graphs.ChainGraphs(maxsize=2, capture=capture, device=lambda: 0)
    assert cache.run("a", (1,), (), None) is None  # first chunk of a key: launched
    assert cache.entry("a", 0) is graphs.SEEN and not made
    assert cache.run("a", (2,), (), None) == (2,)  # the second captures, and replays
    assert cache.run("a", (3,), (), None) == (3,)  # later ones replay the same graph
    assert made == [(2,)] and cache.captures == 1
    assert cache.entry("a", 1) is None  # kept per device
    cache.run("r", ("refuse",), (), None)
    assert cache.run("r", ("refuse",), (), None) is None  # refused: launched one by one
    assert cache.entry("r", 0) is graphs.REFUSED and cache.captures == 1
    cache.run("b", (4,), (), None)  # a third key: the least recently used goes
    assert len(cache) == 2 and cache.entry("a", 0) is None
    assert cache.run("a", (5,), (), None) is None  # forgotten: seen afresh
    cache.clear()
    assert len(cache) == 0


def test_the_process_cache_is_bounded():
    assert graphs.chain_graphs.maxsize == graphs.GRAPHS_KEPT


# -- on a GPU --------------------------------------------------------------------------
@pytest.fixture
def on_gpu():
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "sync",
                          "daskgpu.chain-graphs": 4}):
        graphs.chain_graphs.clear()
        yield graphs.chain_graphs
        graphs.chain_graphs.clear()


@pytest.mark.gpu
def test_a_graph_gives_what_separate_launches_give_for_chunks_of_two_shapes(on_gpu):
    step, _ = _kernels()
    xn = np.random.default_rng(2).random((12, 48), dtype=np.float32)
    x = da.from_array(xn, chunks=((4, 4, 2, 2), (24, 24)))  # (4, 24) four times, (2, 24) four
    with dask.config.set({"daskgpu.chain-graphs": 0}):
        apart = _chain(step, x, SCALARS).compute()
    before = on_gpu.captures
    graphed = _chain(step, x, SCALARS).compute()
    assert on_gpu.captures - before == 2  # one graph per shape, each from its second chunk
    np.testing.assert_array_equal(graphed, apart)
    np.testing.assert_allclose(graphed, _expected(xn, SCALARS), rtol=1e-5)


@pytest.mark.gpu
def test_a_second_chunk_of_a_shape_captures_and_later_ones_reuse_the_graph(on_gpu):
    step, _ = _kernels()
    xn = np.random.default_rng(3).random(64 * 8, dtype=np.float32)
    x = da.from_array(xn, chunks=64)
    fused = _fused(_chain(step, x, SCALARS))
    before = on_gpu.captures
    results = []
    for k in range(5):
        chunk = xn[64 * k:64 * (k + 1)]
        results.append(fused(chunk, *SCALARS, ChunkPlace((k,), (64,), (64 * k,))))
        assert on_gpu.captures - before == (0 if k == 0 else 1)
    key = fused.graph_key((xn[:64], *SCALARS), ChunkPlace((0,), (64,), (0,)))
    graph = on_gpu.entry(key, 0)
    assert isinstance(graph, graphs.ChainGraph) and graph.launches == 4  # chunks 1 to 4
    for k, got in enumerate(results):
        np.testing.assert_allclose(got, _expected(xn[64 * k:64 * (k + 1)], SCALARS), rtol=1e-5)


@pytest.mark.gpu
def test_new_host_arrays_each_chunk_give_their_own_results(on_gpu):
    step, _ = _kernels()
    rng = np.random.default_rng(4)
    x = da.from_array(rng.random((16, 16), dtype=np.float32), chunks=8)
    fused = _fused(_chain(step, x, SCALARS))
    place = ChunkPlace((0, 0), (8, 8), (0, 0))
    with dask.config.set({"daskgpu.chain-graphs": 0}):
        def apart(chunk):
            return fused(chunk, *SCALARS, place)

        chunks = [rng.random((8, 8), dtype=np.float32) for _ in range(6)]
        expected = [apart(c) for c in chunks]
    before = on_gpu.captures
    for chunk, want in zip(chunks, expected):  # fresh arrays: other host addresses each time
        np.testing.assert_array_equal(fused(chunk.copy(), *SCALARS, place), want)
    # A Fortran-ordered chunk has another key, and its own graph, with the same results.
    for chunk, want in zip(chunks, expected):
        np.testing.assert_array_equal(fused(np.asfortranarray(chunk), *SCALARS, place), want)
    assert on_gpu.captures - before == 2


@pytest.mark.gpu
def test_a_broadcast_input_is_refused_and_launched_one_by_one(on_gpu):
    @dg.jit
    def add(out, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + y[i]

    step, _ = _kernels()
    xn = np.random.default_rng(5).random((8, 32), dtype=np.float32)
    row = np.random.default_rng(6).random(32, dtype=np.float32)
    x, r = da.from_array(xn, chunks=(2, 32)), da.from_array(row, chunks=32)
    z = dg.map_kernel(add, dg.Out(np.float32, like=x), _chain(step, x, SCALARS[:4]), r)
    before = on_gpu.captures
    got = z.compute()
    np.testing.assert_allclose(got, _expected(xn, SCALARS[:4]) + row, rtol=1e-5)
    assert on_gpu.captures == before  # the row is broadcast to each chunk: no graph stages it
