"""map_kernel, Out and offset: every test but the gpu-marked ones runs simulated."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import numpy as np
import pytest
from kit.kernels import saxpy as saxpy_eager
from kit.kernels import saxpy_lazy as saxpy
from kit.kernels import smooth
from layers import EXPRESSIONS, hlg_only
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.resources import LAUNCH_SHARE
from daskgpu._dask.launch_core.walk import runs_launch
from daskgpu._dask.map_kernel.chunk_task import ChunkLaunch

# -- kernels ------------------------------------------------------------------

@dg.jit
def add_row(out, x, b):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = x[i, j] + b[j]


@dg.jit
def flat_scale(out, x, a):
    i = cuda.grid(1)  # 1-D over the elements of a 2-D chunk
    if i < out.size:
        r = i // out.shape[1]
        c = i % out.shape[1]
        out[r, c] = a * x[r, c]


@dg.jit
def global_index(out, start):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = start + i


@dg.jit
def global_index_2d(out, r0, c0, ncols):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = (r0 + i) * ncols + (c0 + j)


@dg.jit
def split(double, plus_one, x):
    i = cuda.grid(1)
    if i < x.size:
        double[i] = 2 * x[i]
        plus_one[i] = x[i] + 1


@dg.jit
def increment(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@dg.jit
def scaled_and_increment(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 3 * x[i]
        x[i] += 1


@dg.jit
def laplace(out, u):
    i, j = cuda.grid(2)
    n, m = u.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        out[i, j] = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4 * u[i, j]


@dg.jit
def lookup(out, idx, table):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = table[idx[i]]


@dg.jit
def scribble(out, x, table):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i]
        table[0] = -1.0


# -- 1-D and N-D maps ---------------------------------------------------------

def test_saxpy_1d(simulate):
    xn = np.arange(300, dtype=np.float32)
    yn = np.linspace(0, 1, 300, dtype=np.float32)
    x, y = da.from_array(xn, chunks=100), da.from_array(yn, chunks=100)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, y)
    assert isinstance(z, da.Array)
    assert z.dtype == np.float32 and z.chunks == x.chunks
    np.testing.assert_array_equal(z.compute(), np.float32(2) * xn + yn)


def test_eager_kernel_and_ptx_kernel(simulate):
    x = da.arange(200, chunks=50, dtype=np.float32)
    expected = 2 * np.arange(200, dtype=np.float32)
    z = dg.map_kernel(saxpy_eager, dg.Out(np.float32, like=x), 1.0, x, x)
    np.testing.assert_array_equal(z.compute(), expected)
    # What a Kernel pickles into (or dg.load returns) maps too.
    ptx = pickle.loads(pickle.dumps(saxpy_eager))
    assert isinstance(ptx, dg.PTXKernel)
    z = dg.map_kernel(ptx, dg.Out(np.float32, like=x), 1.0, x, x)
    np.testing.assert_array_equal(z.compute(), expected)


def test_grid2_kernel_launches_over_chunk_shape(simulate):
    xn = np.arange(48.0).reshape(6, 8)
    bn = np.arange(8.0) * 100
    x = da.from_array(xn, chunks=(3, 4))
    b = da.from_array(bn, chunks=4)  # 1-D, broadcast against the rows
    z = dg.map_kernel(add_row, dg.Out(np.float64, like=x), x, b)
    np.testing.assert_array_equal(z.compute(), xn + bn)


def test_grid_ndim_override_and_1d_launch_over_2d_chunks(simulate):
    xn = np.arange(30.0).reshape(5, 6)
    x = da.from_array(xn, chunks=(2, 3))
    z = dg.map_kernel(flat_scale, dg.Out(np.float64, like=x), x, 3.0)
    np.testing.assert_array_equal(z.compute(), 3 * xn)
    z = dg.map_kernel(flat_scale, dg.Out(np.float64, like=x), x, 3.0, grid_ndim=1)
    np.testing.assert_array_equal(z.compute(), 3 * xn)


def test_grid2_kernel_over_1d_arrays_is_refused(simulate):
    @dg.jit
    def grid2(out):
        i, j = cuda.grid(2)
        if i < out.size and j == 0:
            out[i] = i

    x = da.ones(10, chunks=5)
    with pytest.raises(ValueError, match=r"2-D grid over 1-D chunks.*grid_ndim=1"):
        dg.map_kernel(grid2, dg.Out(np.float64, like=x))


def test_several_outputs_in_argument_order(simulate):
    xn = np.arange(40, dtype=np.int32)
    x = da.from_array(xn, chunks=15)
    double, plus_one = dg.map_kernel(
        split, dg.Out(np.int64, like=x), dg.Out(np.float32, like=x), x)
    assert (double.dtype, plus_one.dtype) == (np.int64, np.float32)
    d, p = dask.compute(double, plus_one)
    np.testing.assert_array_equal(d, 2 * xn)
    np.testing.assert_array_equal(p, xn + 1)


# -- offsets ------------------------------------------------------------------

def test_offset_1d_irregular_chunks(simulate):
    out = dg.map_kernel(global_index, dg.Out(np.int64, shape=(10,), chunks=((3, 5, 2),)),
                        dg.offset)
    np.testing.assert_array_equal(out.compute(), np.arange(10))


def test_offset_nd_is_one_int64_per_axis(simulate):
    shape = (5, 7)
    out = dg.map_kernel(global_index_2d, dg.Out(np.int64, shape=shape, chunks=(2, 3)),
                        dg.offset, shape[1])
    np.testing.assert_array_equal(out.compute(), np.arange(35).reshape(shape))
    assert global_index_2d.signatures == ["(int64[:, ::1], int64, int64, int64)"]


def test_offset_with_halo_is_the_start_of_the_extended_chunk(simulate):
    like = da.zeros(12, chunks=4)
    for boundary in ("none", "reflect", 0):
        out = dg.map_kernel(global_index, dg.Out(np.int64, like=like), dg.offset,
                            depth=2, boundary=boundary)
        np.testing.assert_array_equal(out.compute(), np.arange(12))


def test_offset_pickles_as_the_singleton():
    assert pickle.loads(pickle.dumps(dg.offset)) is dg.offset
    assert dask.base.tokenize(dg.offset) == dask.base.tokenize(dg.offset)


# -- halos --------------------------------------------------------------------

def test_halo_1d_periodic(simulate):
    xn = np.arange(24.0) ** 2
    x = da.from_array(xn, chunks=8)
    out = dg.map_kernel(smooth, dg.Out(np.float64, like=x), x, depth=1, boundary="periodic")
    assert out.chunks == x.chunks
    np.testing.assert_array_equal(out.compute(), np.roll(xn, 1) + xn + np.roll(xn, -1))


def test_halo_2d_reflect(simulate):
    un = np.random.default_rng(0).random((10, 12))
    u = da.from_array(un, chunks=(5, 4))
    out = dg.map_kernel(laplace, dg.Out(np.float64, like=u), u, depth=1, boundary="reflect")
    p = np.pad(un, 1, mode="symmetric")
    expected = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * un
    np.testing.assert_allclose(out.compute(), expected, rtol=1e-12)


@pytest.mark.parametrize("boundary", ["periodic", "reflect", 0])
def test_a_halo_deeper_than_a_chunk_rechunks_as_map_overlap_does(simulate, boundary):
    xn = np.arange(10.0) ** 2
    x = da.from_array(xn, chunks=((4, 4, 2),))
    out = dg.map_kernel(smooth, dg.Out(np.float64, like=x), x, depth=3, boundary=boundary)
    # The chunks da.map_overlap gives, and the values of the same map over them.
    assert out.chunks == da.map_overlap(lambda b: b, x, depth=3, boundary=boundary).chunks
    assert min(out.chunks[0]) >= 3
    rechunked = x.rechunk(out.chunks)
    want = dg.map_kernel(smooth, dg.Out(np.float64, like=rechunked), rechunked, depth=3,
                         boundary=boundary)
    np.testing.assert_array_equal(out.compute(), want.compute())
    if boundary == "periodic":
        np.testing.assert_array_equal(out.compute(), np.roll(xn, 1) + xn + np.roll(xn, -1))


def test_a_halo_deeper_than_the_axis_is_refused(simulate):
    x = da.ones(10, chunks=((4, 4, 2),))
    with pytest.raises(ValueError, match=r"depth 11 on axis 0 is deeper than the axis is "
                                         r"long \(10 elements"):
        dg.map_kernel(smooth, dg.Out(np.float64, like=x), x, depth=11)


# -- alignment and argument kinds ---------------------------------------------

def test_unaligned_chunks_are_unified(simulate):
    xn = np.arange(15, dtype=np.float32)
    yn = np.ones(15, dtype=np.float32)
    x = da.from_array(xn, chunks=5)
    y = da.from_array(yn, chunks=((4, 4, 4, 3),))
    z = dg.map_kernel(saxpy, dg.Out(np.float32, shape=(15,)), np.float32(3), x, y)
    assert z.chunks == ((4, 1, 3, 2, 2, 3),)
    np.testing.assert_array_equal(z.compute(), 3 * xn + yn)


def test_shapes_that_cannot_align_are_refused(simulate):
    x, y = da.ones(10, chunks=5), da.ones(12, chunks=6)
    with pytest.raises(ValueError, match=r"cannot align the chunks.*\(10,\).*\(12,\)"):
        dg.map_kernel(saxpy, dg.Out(np.float64, like=x), 1.0, x, y)


def test_broadcast_size_one_row(simulate):
    xn = np.arange(24.0).reshape(4, 6)
    bn = np.arange(6.0).reshape(1, 6)

    @dg.jit
    def add_first_row(out, x, b):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = x[i, j] + b[0, j]

    x = da.from_array(xn, chunks=(2, 3))
    b = da.from_array(bn, chunks=(1, 3))
    z = dg.map_kernel(add_first_row, dg.Out(np.float64, like=x), x, b)
    np.testing.assert_array_equal(z.compute(), xn + bn)


def test_numpy_argument_is_passed_whole(simulate):
    idx = da.from_array(np.array([9, 0, 3, 3, 7, 1, 2, 8]), chunks=3)
    table = np.arange(10.0) * 10
    z = dg.map_kernel(lookup, dg.Out(np.float64, like=idx), idx, table)
    np.testing.assert_array_equal(z.compute(), table[[9, 0, 3, 3, 7, 1, 2, 8]])


def test_written_numpy_argument_is_copied(simulate):
    x = da.arange(6, chunks=3, dtype=np.float64)
    table = np.zeros(2)
    z = dg.map_kernel(scribble, dg.Out(np.float64, like=x), x, table)
    np.testing.assert_array_equal(z.compute(), np.arange(6.0))
    np.testing.assert_array_equal(table, [0.0, 0.0])


def test_out_shapes_and_chunks(simulate):
    x = da.arange(9, chunks=3, dtype=np.float32)
    like_numpy = dg.Out(np.float32, like=np.empty(9))  # one chunk, aligned to x
    z = dg.map_kernel(saxpy, like_numpy, np.float32(1), x, x)
    assert z.chunks == ((3, 3, 3),)
    np.testing.assert_array_equal(z.compute(), 2 * np.arange(9, dtype=np.float32))


def test_non_contiguous_chunks_are_made_contiguous(simulate):
    xn = np.arange(24.0).reshape(4, 6)
    x = da.from_array(xn, chunks=(2, 3)).T  # F-ordered chunks
    z = dg.map_kernel(flat_scale, dg.Out(np.float64, like=x), x, 2.0)
    assert flat_scale.signatures[-1] == "(float64[:, ::1], float64[:, ::1], float64)"
    np.testing.assert_array_equal(z.compute(), 2 * xn.T)


def test_empty_chunks_launch_nothing(simulate):
    z = dg.map_kernel(global_index, dg.Out(np.int64, shape=(0,)), dg.offset)
    assert z.compute().shape == (0,)


# -- written inputs -----------------------------------------------------------

def test_written_input_comes_back_as_new_array(simulate):
    xn = np.arange(10.0)
    x = da.from_array(xn, chunks=4)
    y = dg.map_kernel(increment, x)
    np.testing.assert_array_equal(y.compute(), xn + 1)
    np.testing.assert_array_equal(xn, np.arange(10.0))
    np.testing.assert_array_equal(x.compute(), np.arange(10.0))
    # The same chunk object may feed several tasks: computed together, both
    # read the unmodified input.
    y2 = dg.map_kernel(increment, x, name="second-increment")
    a, b, c = dask.compute(x, y, y2)
    np.testing.assert_array_equal(a, xn)
    np.testing.assert_array_equal(b, xn + 1)
    np.testing.assert_array_equal(c, xn + 1)


def test_written_input_comes_after_outputs(simulate):
    xn = np.arange(8.0)
    x = da.from_array(xn, chunks=3)
    out, x_new = dg.map_kernel(scaled_and_increment, dg.Out(np.float64, like=x), x)
    o, xw = dask.compute(out, x_new)
    np.testing.assert_array_equal(o, 3 * xn)
    np.testing.assert_array_equal(xw, xn + 1)
    np.testing.assert_array_equal(xn, np.arange(8.0))


# -- graph, names, compilation ------------------------------------------------

def _task_function(arr) -> ChunkLaunch:
    """The ChunkLaunch of ``arr``'s launch tasks: carried by its first task in a small graph."""
    task = dict(arr.__dask_graph__())[(arr.name,) + (0,) * arr.ndim]
    return task.args[0].value


def _launch_tasks(arr) -> list:
    return [t for t in dict(arr.__dask_graph__()).values() if runs_launch(t)]


def test_names_are_deterministic(simulate):
    x = da.arange(20, chunks=5, dtype=np.float32)

    def build(a=1.0, **kw):
        return dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(a), x, x, **kw)

    assert build().name == build().name
    assert build().name.startswith("saxpy-")
    assert build(2.0).name != build().name
    assert build(tpb=32).name != build().name
    # As da.map_blocks (issue #25): token= is a prefix, name= the full key name.
    assert build(token="my-saxpy").name.startswith("my-saxpy-")
    assert build(token="my-saxpy", a=2.0).name != build(token="my-saxpy").name
    assert build(name="my-saxpy").name == "my-saxpy"


def test_a_reused_token_never_mixes_results(simulate):
    # Two calls with token="t" over different data: each keeps its own result.
    @dg.jit("void(float32[::1], float32[::1])")
    def copy(out, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i]

    zeros, ones = da.zeros(8, chunks=4, dtype=np.float32), da.ones(8, chunks=4, dtype=np.float32)
    a = dg.map_kernel(copy, dg.Out(np.float32, like=zeros), zeros, token="t")
    b = dg.map_kernel(copy, dg.Out(np.float32, like=ones), ones, token="t")
    got_a, got_b = dask.compute(a, b)
    np.testing.assert_array_equal(got_a, 0)
    np.testing.assert_array_equal(got_b, 1)


def test_one_task_per_chunk_outputs_have_none_of_their_own(simulate):
    # Output chunks are allocated inside the launch task; a task per output
    # chunk would double the scheduler's work (measured: 33 tasks for 16 chunks).
    x = da.arange(20, chunks=5, dtype=np.float32)
    out = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2.0), x, x)
    graph = dict(out.__dask_optimize__(out.__dask_graph__(), out.__dask_keys__()))
    # The input's arange tasks and the launches (a small graph: no launch key).
    assert len(graph) == 2 * x.numblocks[0]
    only_out = dg.map_kernel(global_index, dg.Out(np.int64, shape=(20,), chunks=5), dg.offset)
    graph = dict(only_out.__dask_graph__())
    assert len(graph) == 4
    np.testing.assert_array_equal(only_out.compute(), np.arange(20))


def test_lazy_kernel_compiles_at_graph_build():
    @dg.jit
    def double(out, x):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = 2 * x[i, j]

    x = da.ones((4, 6), chunks=(2, 3), dtype=np.int16)
    assert double.signatures == []
    # No GPU and no simulator needed to build the graph: only to run it.
    z = dg.map_kernel(double, dg.Out(np.int32, like=x), x)
    assert double.signatures == ["(int32[:, ::1], int16[:, ::1])"]
    fn = _task_function(z)
    assert isinstance(fn.kernel, dg.PTXKernel)
    assert [im.py_func for im in fn.kernel.images] == [None]  # PTX only
    # Plain pickle cannot pickle this local function: the graph does not hold it.
    pickle.dumps(dict(z.__dask_graph__()))
    assert pickle.loads(pickle.dumps(fn)).kernel.images == fn.kernel.images
    # A graph this small carries the PTX in each of its 4 launch tasks (the
    # launch key is for graphs of many chunks: test_mapping_costs.py).
    assert len(_launch_tasks(z)) == 4
    assert all(b".entry" in pickle.dumps(t) for t in _launch_tasks(z))

    with dask.config.set({"daskgpu.simulate": True, "scheduler": "sync"}):
        z = dg.map_kernel(double, dg.Out(np.int32, like=x), x)
        assert _task_function(z).kernel.images[0].py_func is not None
        np.testing.assert_array_equal(z.compute(), np.full((4, 6), 2))


# -- errors -------------------------------------------------------------------

def test_out_without_dtype_or_shape_is_completed_by_map_kernel(simulate):
    # dg.Out() waits for map_kernel's dtype= and the mapped arrays' shape; with
    # neither to give, map_kernel says so when the graph is built.
    x = da.arange(6, chunks=3, dtype=np.float32)
    with pytest.raises(TypeError, match=r"without a dtype; give it one.*or pass dtype="):
        dg.map_kernel(saxpy, dg.Out(), np.float32(1), x, x)
    with pytest.raises(ValueError, match=r"no dask array to take its shape from"):
        dg.map_kernel(global_index, dg.Out(np.int64), dg.offset)
    with pytest.raises(TypeError, match=r"needs like= \(an array to copy shape .*\) or shape="):
        dg.Out(np.float32, chunks=3)


def test_out_like_an_array_takes_its_dtype_unless_one_is_given(simulate):
    # As np.empty_like: like= gives the dtype too, after Out's own and map_kernel's.
    x = da.arange(6, chunks=3, dtype=np.float32)
    z = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x)
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z.compute(), 3 * np.arange(6, dtype=np.float32))
    assert dg.map_kernel(saxpy, dg.Out(like=x), 2.0, x, x, dtype=np.float64).dtype == np.float64
    y = da.arange(6, chunks=3, dtype=np.float64)
    assert dg.map_kernel(saxpy, dg.Out(like=y), 2.0, y, y).dtype == np.float64


def test_out_of_another_rank_is_refused(simulate):
    x = da.ones((4, 4), chunks=2)
    with pytest.raises(ValueError, match=r"outputs must have the rank.*2-D"):
        dg.map_kernel(add_row, dg.Out(np.float64, shape=(4,)), x, x)


def test_eager_signature_mismatch_lists_signatures(simulate):
    x = da.ones(10, chunks=5, dtype=np.float64)
    with pytest.raises(TypeError, match=r"(?s)C-contiguous.*float32\[::1\], float32"):
        dg.map_kernel(saxpy_eager, dg.Out(np.float64, like=x), 1.0, x, x)


def test_kernel_must_be_a_daskgpu_kernel():
    @cuda.jit
    def plain(x):
        pass

    with pytest.raises(TypeError, match=r"dg.kernel\(dispatcher\)"):
        dg.map_kernel(plain, da.ones(3))
    with pytest.raises(TypeError, match="argument 1 is a str"):
        dg.map_kernel(saxpy, dg.Out(np.float32, shape=(3,)), "a")


def test_nothing_to_return(simulate):
    @dg.jit
    def reads(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[0] = x[i]

    with pytest.raises(ValueError, match=r"nothing to return: give an output dg.Out"):
        dg.map_kernel(reads, da.ones(4, chunks=2), np.zeros(1))
    with pytest.raises(ValueError, match="at least one dask array or dg.Out"):
        dg.map_kernel(reads, np.ones(4), np.zeros(1))


# -- distributed --------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    from distributed import Scheduler, SpecCluster, Worker

    with dask.config.set({"daskgpu.simulate": True}):
        spec = {
            "gpu": {"cls": Worker, "options": {"nthreads": 1, "resources": {"GPU": 1}}},
            "cpu": {"cls": Worker, "options": {"nthreads": 1}},
        }
        with SpecCluster(workers=spec, scheduler={
                "cls": Scheduler, "options": {"dashboard_address": ":0"}}) as c:
            assert isinstance(c, distributed.SpecCluster)
            yield c


@pytest.fixture
def client(cluster):
    from distributed import Client

    with Client(cluster) as c, dask.config.set({"daskgpu.simulate": True}):
        yield c


def test_failing_chunk_leaves_the_others_computable(client):
    # The table covers indices 0..9: the last chunk reads past it and fails.
    idx = da.arange(12, chunks=4)
    table = np.arange(10.0) * 2
    z = dg.map_kernel(lookup, dg.Out(np.float64, like=idx), idx, table)
    futures = client.compute([z[i * 4:(i + 1) * 4] for i in range(3)])
    np.testing.assert_array_equal(futures[0].result(), [0, 2, 4, 6])
    np.testing.assert_array_equal(futures[1].result(), [8, 10, 12, 14])
    with pytest.raises(IndexError, match=r"^kernel 'lookup'<<<.*>>> on chunk \(2,\) at offset "
                                         r"\(8,\), thread \(2, 0, 0\) of block \(0, 0, 0\), "
                                         r"at .*out of bounds"):
        futures[2].result()
    np.testing.assert_array_equal(client.compute(z[:8]).result(), np.arange(8.0) * 2)


def test_chunks_ask_for_a_gpu_when_the_cluster_offers_one(client):
    x = da.arange(40, chunks=10, dtype=np.float32)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
    if not EXPRESSIONS:  # expressions carry no annotations: placement rests on the plugin
        assert z.__dask_graph__().layers[z.name].annotations == {
            "resources": {"GPU": LAUNCH_SHARE}}
    gpu = [a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
           if w["resources"].get("GPU")]
    from distributed import get_task_stream

    # Dask's low-level fusion drops annotations (dask/dask#7036): with it off
    # every launch runs on the GPU worker.
    with get_task_stream(client) as ts, dask.config.set({"optimization.fuse.active": False}):
        result = client.compute(z).result()
    np.testing.assert_array_equal(result, 3 * np.arange(40, dtype=np.float32))
    ran = {rec["worker"] for rec in ts.data
           if isinstance(rec["key"], tuple) and rec["key"][0] == z.name}
    assert ran == set(gpu)


@hlg_only
def test_no_gpu_annotation_without_a_client(simulate):
    x = da.arange(4, chunks=2, dtype=np.float32)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
    assert not z.__dask_graph__().layers[z.name].annotations


# -- on a GPU -----------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_numpy_chunks():
    xn = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
    x = da.from_array(xn, chunks=1 << 18)
    with dask.config.set({"daskgpu.simulate": False}):
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
        np.testing.assert_allclose(z.compute(), 3 * xn, rtol=1e-6)
        u = da.from_array(np.random.default_rng(1).random((512, 384)), chunks=(128, 128))
        out = dg.map_kernel(laplace, dg.Out(np.float64, like=u), u, depth=1,
                            boundary="reflect")
        p = np.pad(u.compute(), 1, mode="symmetric")
        un = u.compute()
        expected = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * un
        np.testing.assert_allclose(out.compute(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_gpu_cupy_chunks_stay_on_the_device():
    cupy = pytest.importorskip("cupy")
    xc = cupy.arange(1 << 16, dtype=cupy.float32)
    x = da.from_array(xc, chunks=1 << 14, asarray=False)
    with dask.config.set({"daskgpu.simulate": False}):
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
        assert isinstance(z._meta, cupy.ndarray)
        result = z.compute()
        assert isinstance(result, cupy.ndarray)
        cupy.testing.assert_allclose(result, 3 * xc)
        y = dg.map_kernel(increment, x)
        assert isinstance(y.compute(), cupy.ndarray)
        cupy.testing.assert_allclose(y.compute(), xc + 1)
        cupy.testing.assert_allclose(xc, cupy.arange(1 << 16, dtype=cupy.float32))
