"""A chain of launches captured as a CUDA graph on a GPU, without Dask: its replays, its
refusals, and the memory it gives back."""

import gc

import numpy as np
import pytest
from numba import cuda

import daskgpu as dg

pytestmark = pytest.mark.gpu


@dg.jit("void(float32[::1], float32[::1])")
def affine(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * 3 + 1


@dg.jit("void(float32[::1], float32[::1], float32[::1])")
def add(out, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


def _chain(n, steps=4):
    """``launch_chain`` of ``steps`` affine launches on value 0, then ``+ value 1``."""

    def launch_chain(chain):
        z = chain.to_device(chain.values[0])
        for _ in range(steps):
            out = chain.zeros((n,), np.float32)
            affine.forall(n, stream=chain.handle)(out, z)
            z = out
        total = chain.zeros((n,), np.float32)
        add.forall(n, stream=chain.handle)(total, z, chain.to_device(chain.values[1]))
        return (total,)

    return launch_chain


def _expected(x, y, steps=4):
    z = x.astype(np.float64)
    for _ in range(steps):
        z = z * 3 + 1
    return z + y


def _warm(n):
    # Links both kernels and checks their configurations, as a key's first chunk does.
    x = np.ones(n, np.float32)
    affine.forall(n)(np.empty_like(x), x)
    add.forall(n)(np.empty_like(x), x, x)


def test_a_captured_chain_replays_on_new_host_arrays():
    from daskgpu._runtime.gpu.chains.graphs import ChainGraph, capture_graph

    n = 1000
    _warm(n)
    rng = np.random.default_rng(0)
    first = (rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32))
    graph = capture_graph(first, (0, 1), _chain(n))
    assert isinstance(graph, ChainGraph)
    for _ in range(3):  # new arrays each time: other host addresses, the graph's own buffers
        x, y = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
        (got,) = graph.replay((x, y))
        np.testing.assert_allclose(got, _expected(x, y), rtol=1e-5)
    assert graph.launches == 3


def test_what_capture_cannot_hold_is_refused_and_the_stream_still_works():
    from daskgpu._runtime.gpu.chains.graphs import REFUSED, capture_graph

    n = 256
    _warm(n)
    x = np.ones(n, np.float32)

    def host_output(chain):  # a host array: its launch waits for its copy back
        out = np.zeros(n, np.float32)
        affine.forall(n, stream=chain.handle)(out, chain.to_device(x))
        return (out,)

    def broadcast(chain):  # an input the staging cannot fill from its value
        wide = np.ascontiguousarray(np.broadcast_to(chain.values[0], (2, n))).reshape(-1)
        out = chain.zeros(wide.shape, np.float32)
        affine.forall(wide.size, stream=chain.handle)(out, chain.to_device(wide))
        return (out,)

    assert capture_graph((x,), (0,), host_output) is REFUSED
    assert capture_graph((x,), (0,), broadcast) is REFUSED
    # The thread's stream captures no more: launches on it run as usual.
    out = np.zeros(n, np.float32)
    affine.forall(n)(out, x)
    np.testing.assert_array_equal(out, 4)


def test_an_evicted_graph_frees_its_buffers_once_nothing_holds_it():
    from cuda.bindings import driver

    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.chains.graphs import ChainGraph, ChainGraphs
    from daskgpu._runtime.gpu.driver import SUCCESS

    n = 1024
    _warm(n)
    x, y = np.ones(n, np.float32), np.ones(n, np.float32)
    here = device.current().id
    cache = ChainGraphs(maxsize=1)
    assert cache.run("a", (x, y), (0, 1), _chain(n)) is None  # a key's first chunk: launched
    (got,) = cache.run("a", (x, y), (0, 1), _chain(n))  # its second: captured, replayed
    np.testing.assert_allclose(got, _expected(x, y), rtol=1e-5)
    graph = cache.entry("a", here)
    assert isinstance(graph, ChainGraph) and cache.captures == 1
    staging = graph.fills[0][0].ctypes.data  # a page-locked buffer of the graph's own
    assert driver.cuMemHostGetFlags(staging)[0] == SUCCESS
    cache.run("b", (x, y), (0, 1), _chain(n))  # another key: "a" goes
    assert cache.entry("a", here) is None
    assert driver.cuMemHostGetFlags(staging)[0] == SUCCESS  # still held here
    del graph
    gc.collect()
    assert driver.cuMemHostGetFlags(staging)[0] != SUCCESS  # freed


def test_a_replay_reports_its_copies_and_its_run_under_the_chains_name(seen):
    from daskgpu._runtime.gpu.chains.graphs import capture_graph

    n = 512
    _warm(n)
    x, y = np.ones(n, np.float32), np.ones(n, np.float32)
    graph = capture_graph((x, y), (0, 1), _chain(n))  # capture reports each launch's own
    seen.clear()
    graph.replay((x, y), "affine+add")
    times = seen.by_activity("affine+add")
    assert set(times) == {"copy-in", "kernel", "copy-out"}
    assert all(seconds >= 0 for seconds in times.values()) and times["kernel"] > 0
    assert [kernel for kernel, *_ in seen] == ["affine+add"] * 3  # nothing per kernel
