"""Launches sized for the GPU: small chunks grouped into larger launches, results unchanged.

Each case maps the same kernel grouped (the default ``daskgpu.launch-bytes``)
and once per chunk (``group=False``), and checks the results are identical and
the grouped graph has fewer launch tasks.
"""

import dask
import dask.array as da
import numpy as np
import pytest
from kit.kernels import hist, saxpy, smooth, uniform, where_am_i
from kit.kernels import scale_lazy as scale
from layers import EXPRESSIONS, hlg_only
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.walk import runs_launch
from daskgpu._dask.launch_layout import group_chunks

pytestmark = pytest.mark.grouped


@dg.jit
def where_am_i_2d(out, r0, c0):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = (r0 + i) * 1000 + c0 + j


def _launches(arr) -> int:
    """How many tasks of ``arr``'s optimized graph run a launch."""
    # dask.optimize materializes an expression's graph before Dask's own passes, which
    # a rechunk's expression cannot take: expressions optimize themselves.
    opt = arr.optimize() if EXPRESSIONS else dask.optimize(arr)[0]
    return sum(1 for task in dict(opt.__dask_graph__()).values() if runs_launch(task))


def _tasks(arr) -> int:
    """How many tasks ``arr``'s optimized graph holds, constants included, without the
    aliases that Dask's fusion leaves under the old keys."""
    from dask._task_spec import Alias

    # dask.optimize materializes an expression's graph before Dask's own passes, which
    # a rechunk's expression cannot take: expressions optimize themselves.
    opt = arr.optimize() if EXPRESSIONS else dask.optimize(arr)[0]
    return sum(1 for task in dict(opt.__dask_graph__()).values() if not isinstance(task, Alias))


class Recorded:
    """An array-like that is not NumPy's, so that ``da.from_array`` reads it with a
    task per chunk (``graph_from_arraylike``), and that records each piece read."""

    def __init__(self, data):
        self.data, self.shape, self.dtype, self.ndim = data, data.shape, data.dtype, data.ndim
        self.reads = []

    def __getitem__(self, index):
        self.reads.append(tuple((s.start, s.stop) for s in index))
        return self.data[index]


def _source(kind, xn, chunks):
    """``xn`` as ``da.from_array`` (or ``da.from_zarr``) makes it in each of its graphs."""
    if kind == "numpy":  # sliced on the client, a constant per chunk
        return da.from_array(xn, chunks=chunks)
    if kind == "locked":  # a lock: read by a task per chunk
        return da.from_array(xn, chunks=chunks, lock=True)
    if kind == "inline":  # the source in every task rather than a key of its own
        return da.from_array(Recorded(xn), chunks=chunks, inline_array=True)
    if kind == "zarr":
        zarr = pytest.importorskip("zarr")
        z = zarr.create_array(zarr.storage.MemoryStore(), shape=xn.shape, chunks=chunks,
                              dtype=xn.dtype)
        z[...] = xn
        return da.from_zarr(z)
    return da.from_array(Recorded(xn), chunks=chunks)


def _both(build):
    with dask.config.set({"daskgpu.simulate": True}):
        grouped, apart = build(None), build(False)
        return grouped, apart, grouped.compute(), apart.compute()


def test_a_plain_map_groups_small_chunks_into_one_launch():
    x = da.from_array(np.arange(4096, dtype=np.float32), chunks=256)
    grouped, apart, g, a = _both(
        lambda group: dg.map_kernel(scale, dg.Out(like=x), 2.0, x, group=group))
    np.testing.assert_array_equal(g, a)
    assert grouped.chunks == ((4096,),) and apart.chunks == x.chunks
    assert (_launches(grouped), _launches(apart)) == (1, 16)


def test_a_size_sets_the_groups_and_false_turns_grouping_off():
    x = da.from_array(np.arange(4096, dtype=np.float32), chunks=256)
    with dask.config.set({"daskgpu.simulate": True}):
        # 8 bytes an element (x and the output): 8 KiB is 1024 elements, 4 chunks.
        z = dg.map_kernel(scale, dg.Out(like=x), 2.0, x, group="8 KiB")
        assert z.chunks == ((1024,) * 4,)
        assert dg.map_kernel(scale, dg.Out(like=x), 2.0, x, group=False).chunks == x.chunks
        with dask.config.set({"daskgpu.launch-bytes": 0}):
            assert dg.map_kernel(scale, dg.Out(like=x), 2.0, x).chunks == x.chunks
        with pytest.raises(ValueError, match=r"group='lots'.*False \(no grouping\)"):
            dg.map_kernel(scale, dg.Out(like=x), 2.0, x, group="lots")


def test_a_halo_map_grouped_gives_the_same_result():
    x = da.from_array(np.arange(2048, dtype=np.float64) ** 2, chunks=128)
    grouped, apart, g, a = _both(
        lambda group: dg.map_kernel(smooth, dg.Out(like=x), x, depth=1, boundary=0,
                                    group=group))
    np.testing.assert_array_equal(g, a)
    assert _launches(grouped) < _launches(apart) == 16


def test_offsets_stay_global_in_one_and_two_dimensions():
    x = da.zeros(3000, chunks=100, dtype=np.int64)
    grouped, _, g, a = _both(
        lambda group: dg.map_kernel(where_am_i, dg.Out(like=x), dg.offset, group=group))
    np.testing.assert_array_equal(g, np.arange(3000))
    np.testing.assert_array_equal(g, a)
    y = da.zeros((60, 50), chunks=(10, 10), dtype=np.int64)
    grouped, apart, g, a = _both(
        lambda group: dg.map_kernel(where_am_i_2d, dg.Out(like=y), dg.offset, group=group))
    np.testing.assert_array_equal(g, a)
    assert grouped.numblocks < apart.numblocks


def test_a_combined_reduction_groups_and_one_kept_per_block_does_not():
    xn = (np.arange(5000) % 13).astype(np.int64)
    x = da.from_array(xn, chunks=100)
    grouped, apart, g, a = _both(lambda group: dg.map_kernel(
        hist, dg.Out(np.int64, per_chunk=8, combine="sum"), x, group=group))
    np.testing.assert_array_equal(g, a)
    np.testing.assert_array_equal(g, np.bincount(xn % 8, minlength=8))
    assert _launches(grouped) < _launches(apart) == 50
    with dask.config.set({"daskgpu.simulate": True}):
        kept = dg.map_kernel(hist, dg.Out(np.int64, per_chunk=8), x)
    assert kept.shape == (50, 8)  # one per storage chunk, as without grouping


def test_random_states_do_not_depend_on_the_grouping():
    x = da.zeros(4000, chunks=250, dtype=np.float32)
    grouped, apart, g, a = _both(lambda group: dg.map_kernel(
        uniform, dg.Out(like=x), dg.random_states(7), group=group))
    np.testing.assert_array_equal(g, a)
    assert _launches(grouped) < _launches(apart)


def test_chunks_given_are_kept():
    x = da.from_array(np.arange(4096, dtype=np.float32), chunks=256)
    with dask.config.set({"daskgpu.simulate": True}):
        z = dg.map_kernel(scale, dg.Out(like=x), 2.0, x, chunks=x.chunks)
    assert z.chunks == x.chunks


@pytest.mark.skipif(not EXPRESSIONS, reason="the source is reached on array expressions")
def test_on_expressions_a_from_array_source_reads_the_groups_itself():
    x = da.from_array(np.arange(4096, dtype=np.float32), chunks=256)
    with dask.config.set({"daskgpu.simulate": True}):
        z = dg.map_kernel(scale, dg.Out(like=x), 2.0, x)
    assert len(dict(z.optimize().__dask_graph__())) == 2  # one read, one launch


def test_groups_merge_neighbours_and_never_split_a_chunk():
    chunks = ((3, 5, 2, 7, 1, 4, 6, 6, 6),)
    grouped = group_chunks(chunks, per_element=4, target=4 * 28)
    assert grouped == ((28, 12),)  # runs of whole chunks, at most 28 elements
    assert sum(grouped[0]) == sum(chunks[0])
    # The last axis first; an earlier one once the last is a single run.
    assert group_chunks(((4,) * 3, (5,) * 4), per_element=1, target=80) == ((4,) * 3, (20,))
    assert group_chunks(((4,) * 3, (5,) * 4), per_element=1, target=160) == ((8, 4), (20,))
    # A chunk a quarter of the target or more: already large enough.
    assert group_chunks(((3, 7),), per_element=1, target=27) is None


@hlg_only
@pytest.mark.parametrize("kind", ["numpy", "locked", "array-like", "inline", "zarr"])
def test_on_the_hlg_a_from_array_source_reads_the_groups_itself(kind):
    xn = np.arange(4096, dtype=np.float32)
    x = _source(kind, xn, 256)
    grouped, apart, g, a = _both(
        lambda group: dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, group=group))
    np.testing.assert_array_equal(g, a)
    np.testing.assert_array_equal(g, 3 * xn)
    assert grouped.chunks == ((4096,),)
    # One task: the launch, its piece read or held in it; no read of a chunk, no
    # task that joins 16 of them.
    assert _tasks(grouped) == _launches(grouped) == 1
    assert _launches(apart) == 16


@hlg_only
def test_on_the_hlg_the_source_is_read_once_a_group_in_two_dimensions():
    xn = np.arange(60 * 50, dtype=np.float32).reshape(60, 50)
    source = Recorded(xn)
    x = da.from_array(source, chunks=(10, 10))
    with dask.config.set({"daskgpu.simulate": True}):
        # 12 bytes an element (x twice, the output): 12 KiB is 1024 elements, rows
        # of 50 in groups of 20.
        z = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, group="12 KiB")
        assert z.chunks == ((20, 20, 20), (50,))
        source.reads.clear()  # from_array's read of an empty piece, for its meta
        got = z.compute()
    np.testing.assert_array_equal(got, 3 * xn)
    assert sorted(source.reads) == [((r, r + 20), (0, 50)) for r in (0, 20, 40)]


@hlg_only
def test_on_the_hlg_a_source_read_again_keeps_its_annotations():
    from dask.utils import key_split

    xn = np.arange(4096, dtype=np.float32)
    with dask.annotate(priority=7):
        x = da.from_array(Recorded(xn), chunks=256)
    with dask.config.set({"daskgpu.simulate": True}):
        z = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x)
    reads = {name: layer for name, layer in z.dask.layers.items()
             if key_split(name) in ("array", "original-array")}
    assert len(reads) == 2  # the source's key and its reads, once for both arguments
    assert all(layer.annotations == {"priority": 7} for layer in reads.values())


@pytest.mark.parametrize("kind", ["computed", "sliced", "own getitem"])
def test_an_input_that_is_not_a_plain_source_still_groups_with_the_same_results(kind):
    xn = np.arange(4096, dtype=np.float32)
    source = Recorded(xn)
    if kind == "computed":
        x = da.from_array(xn, chunks=256) + np.float32(1)
    elif kind == "sliced":
        x = da.from_array(np.arange(8192, dtype=np.float32), chunks=256)[::2]
    else:  # a getitem of the user's may not read a larger piece as Dask's getters do
        x = da.from_array(source, chunks=256, getitem=lambda a, b: a[b])
    source.reads.clear()  # from_array's read of an empty piece, for its meta
    grouped, apart, g, a = _both(
        lambda group: dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, group=group))
    np.testing.assert_array_equal(g, a)
    assert grouped.chunks == ((4096,),)
    assert _launches(grouped) == 1
    if kind == "own getitem" and not EXPRESSIONS:  # read chunk by chunk, as given
        assert source.reads and all(stop - start == 256 for ((start, stop),) in source.reads)


@pytest.mark.parametrize("kind", ["numpy", "locked", "zarr"])
def test_on_a_cluster_a_source_read_in_groups_gives_the_ungrouped_results(client, kind,
                                                                          tmp_path):
    xn = np.arange(4096, dtype=np.float32)
    if kind == "zarr":  # a store on disk, which the workers open themselves
        if EXPRESSIONS:
            pytest.skip("Dask's array expressions have no from_zarr yet")
        zarr = pytest.importorskip("zarr")
        z = zarr.create_array(str(tmp_path / "x.zarr"), shape=xn.shape, chunks=(256,),
                              dtype=xn.dtype)
        z[...] = xn
        x = da.from_zarr(z)
    else:
        x = _source(kind, xn, 256)
    grouped = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x)
    apart = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, group=False)
    g, a = client.compute([grouped, apart], sync=True)
    np.testing.assert_array_equal(g, a)
    np.testing.assert_array_equal(g, 3 * xn)
    # One group per thread of the GPU workers, not one launch that leaves the others idle.
    threads = sum(client.nthreads().values())
    assert threads > 1 and grouped.numblocks == (threads,)


@pytest.mark.parametrize("kind", ["numpy", "array-like"])
def test_two_sources_chunked_differently_each_read_the_groups_pieces(kind):
    # Their chunks are unified first, which rechunks one of them; the groups are read
    # from the arrays as given, not joined from that rechunk.
    xn = np.arange(4096, dtype=np.float32)
    yn = xn[::-1].copy()
    x, y = _source(kind, xn, 256), _source(kind, yn, 512)
    grouped, apart, g, a = _both(
        lambda group: dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, y, group=group))
    np.testing.assert_array_equal(g, a)
    np.testing.assert_array_equal(g, 2 * xn + yn)
    # One group, or one per thread of a cluster this module started (its in-process
    # workers keep a client current).
    groups = grouped.numblocks[0]
    assert groups <= 2 and grouped.chunks == ((4096 // groups,) * groups,)
    # Each launch, and for each source at most one read and its source's own key:
    # nothing per chunk.
    assert _launches(grouped) == groups and _tasks(grouped) <= groups * (1 + 2 * 2)
