"""Grouping you can trust: chunks are grouped by default only where the kernel's results
cannot depend on where a launch begins or ends, and a grouped launch still speaks of the
user's chunks (key names, device memory, time limits, errors)."""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.core import PerformanceWarning
from kit.kernels import (
    chunk_cumsum,
    chunk_index,
    fails_at_85,
    hist,
    minus_first,
    saxpy,
    smooth,
    uniform,
    where_am_i,
)
from layers import EXPRESSIONS
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_layout import group_chunks, launch_bytes
from daskgpu._dask.map_kernel.api import graph_layer
from daskgpu._dask.map_kernel.chunk_task import ChunkLaunch
from daskgpu._dask.map_kernel.plan import launch_footprint, plan_map

pytestmark = pytest.mark.grouped  # the default daskgpu.launch-bytes


@dg.jit
def lookup(out, x, lut):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = lut[int(x[i]) % lut.size]


def _x(n=1024, chunks=16):
    return da.from_array(np.arange(n, dtype=np.float32) % 7, chunks=chunks)


def _computed(make):
    """The map ``make(group)`` by default (any warning caught) and with group=False."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        default = make(None)
    apart = make(False)
    return default, apart, [w for w in caught if issubclass(w.category, PerformanceWarning)]


# -- 1. grouped only where it cannot change a result -----------------------------------

CHUNK_DEPENDENT = {
    "chunk-local index": (lambda x, g: dg.map_kernel(chunk_index, dg.Out(np.int64, like=x),
                                                     group=g),
                          "uses the thread's position as a value", "out[i] = i"),
    "halo-less stencil": (lambda x, g: dg.map_kernel(smooth, dg.Out(like=x), x, group=g),
                          "reads x 1 element(s) from the thread's position along axis 0, "
                          "beyond a halo of 0", "x[i - 1] + x[i] + x[i + 1]"),
    "chunk's first element": (lambda x, g: dg.map_kernel(minus_first, dg.Out(like=x), x,
                                                         group=g),
                              "reads x, a chunk, elsewhere than at the thread's position",
                              "out[i] = x[i] - x[0]"),
    "per-chunk scan": (lambda x, g: dg.map_kernel(chunk_cumsum, dg.Out(like=x), x, group=g),
                       "reads x, a chunk, elsewhere than at the thread's position",
                       "total += x[k]"),
}


@pytest.mark.parametrize("case", list(CHUNK_DEPENDENT))
def test_a_chunk_dependent_kernel_launches_per_chunk_by_default_and_says_why(simulate, case):
    make, why, code = CHUNK_DEPENDENT[case]
    x = _x()
    default, apart, warned = _computed(lambda g: make(x, g))
    assert default.chunks == apart.chunks == x.chunks  # 64 launches, as the user chunked
    np.testing.assert_array_equal(default.compute(), apart.compute())
    (w,) = warned
    text = str(w.message)
    assert "once per chunk (64 launches" in text and "group=True" in text
    assert why in text and code in text and "test_grouping_rule.py" in w.filename
    grouped = make(x, True)  # asked for: grouped, and then it computes otherwise
    assert grouped.numblocks[0] < x.numblocks[0]
    assert not np.array_equal(grouped.compute(), apart.compute())


def test_the_warning_comes_only_where_grouping_would_cut_the_launches_fourfold(simulate):
    x = _x(n=48, chunks=16)  # three chunks: grouped, one launch, a threefold cut
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        y = dg.map_kernel(minus_first, dg.Out(like=x), x)
    assert y.chunks == x.chunks


SAFE = {
    "elementwise": lambda x: dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x),
    "global offsets": lambda x: dg.map_kernel(where_am_i, dg.Out(np.int64, like=x), dg.offset),
    "halo stencil": lambda x: dg.map_kernel(smooth, dg.Out(like=x), x, depth=1, boundary=0),
    "reduction": lambda x: dg.map_kernel(hist, dg.Out(np.int64, per_chunk=8, combine="sum"),
                                         x.astype(np.int64)),
    "random states": lambda x: dg.map_kernel(uniform, dg.Out(like=x), dg.random_states(7)),
}


@pytest.mark.parametrize("case", list(SAFE))
def test_what_the_bench_and_guide_map_stays_grouped_and_exact(simulate, case):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        grouped = SAFE[case](x)
    with dask.config.set({"daskgpu.launch-bytes": 0}):
        apart = SAFE[case](x)
    if case != "reduction":
        assert grouped.numblocks[0] < x.numblocks[0] == apart.numblocks[0]
    np.testing.assert_array_equal(grouped.compute(), apart.compute())


def test_an_old_bundle_without_position_records_is_mapped_per_chunk(tmp_path):
    # Built, not computed: a loaded bundle runs on GPUs only.
    import json

    from daskgpu._image.bundle import integrity

    path = tmp_path / "saxpy.dgk"
    dg.save(saxpy, path)
    doc = json.loads(path.read_text())
    for image in doc["images"]:
        del image["positions"]  # as daskgpu wrote bundles before it recorded them
    doc["sha256"] = integrity.digest({k: v for k, v in doc.items() if k != "sha256"})
    path.write_text(json.dumps(doc))
    x = _x()
    old, _, warned = _computed(
        lambda g: dg.map_kernel(dg.load(path), dg.Out(like=x), np.float32(2), x, x, group=g))
    assert old.chunks == x.chunks and "save it again" in str(warned[0].message)
    fresh = tmp_path / "fresh.dgk"
    dg.save(saxpy, fresh)  # saved again: it records them, and is grouped
    y = dg.map_kernel(dg.load(fresh), dg.Out(like=x), np.float32(2), x, x)
    assert y.numblocks[0] < x.numblocks[0]


# -- 2. one launch layout, read by everything ------------------------------------------

def test_key_names_differ_where_the_launch_layouts_differ(simulate):
    x = _x(n=2048)
    with dask.config.set({"daskgpu.launch-bytes": "4 KiB"}):
        z1 = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x)
    with dask.config.set({"daskgpu.launch-bytes": "64 KiB"}):
        z2 = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x)
    assert z1.chunks != z2.chunks and z1.name != z2.name
    both = da.concatenate([z1, z2]).compute()
    assert both.shape == (4096,)
    np.testing.assert_array_equal(both, np.concatenate([3 * x.compute()] * 2))


def test_a_group_counts_every_byte_its_launch_puts_on_the_device(simulate):
    # 256 float32 outputs and 256 random states a chunk: 5 KiB, where the outputs alone
    # are 1 KiB. On a GPU of 64 KiB (16 KiB launches) such chunks are left alone, where
    # counting the outputs alone grouped them into launches of 80 KiB.
    out = dg.Out(np.float32, shape=8192, chunks=256)
    plan = plan_map(uniform, (out, dg.random_states(7)), layer=graph_layer(), group=False)
    assert launch_footprint(plan.params, plan.arrays) == (4 + 16, 0)
    assert group_chunks(plan.out_chunks, 20, 16 << 10) is None
    assert max(group_chunks(plan.out_chunks, 4, 16 << 10)[0]) * 20 == 80 << 10
    assert max(group_chunks(plan.out_chunks, 20, 64 << 10)[0]) * 20 <= 64 << 10
    x = _x(8192, 256)
    lut = np.zeros(1000, dtype=np.float32)  # passed whole to every launch: 4,000 bytes
    plan = plan_map(lookup, (out, x, lut), layer=graph_layer(), group=False)
    assert launch_footprint(plan.params, plan.arrays) == (4 + 4, 4000)
    plan = plan_map(hist, (dg.Out(np.int64, per_chunk=8, combine="sum"), x.astype(np.int64)),
                    layer=graph_layer(), group=False)
    assert launch_footprint(plan.params, plan.arrays) == (8, 64)
    with_lut = max(group_chunks(((256,) * 64,), 8, 40 << 10, fixed=4000)[0])
    without = max(group_chunks(((256,) * 64,), 8, 40 << 10)[0])
    assert with_lut * 8 + 4000 <= 40 << 10 < without * 8 + 4000


def _chunk_launch(arr) -> ChunkLaunch:
    """The map's launch, wherever in ``arr``'s graph a task holds it."""
    def find(node, depth=0):
        node = getattr(node, "value", node)  # a DataNode
        if isinstance(node, ChunkLaunch) or depth > 8:
            return node if isinstance(node, ChunkLaunch) else None
        inner = [getattr(node, "func", None), *getattr(node, "args", ()),
                 *getattr(node, "kwargs", {}).values()] if hasattr(node, "func") else (
            list(node.values()) if isinstance(node, dict) else
            list(node) if isinstance(node, (tuple, list)) else [])
        return next((f for f in (find(v, depth + 1) for v in inner) if f is not None), None)

    found = find(dict(arr.__dask_graph__()))
    assert found is not None, "no launch in the graph"
    return found


def test_timeout_is_per_chunk_and_a_group_may_run_that_times_its_chunks(simulate):
    x = _x()
    grouped = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, timeout=2,
                            group="1 KiB")
    per_group = max(grouped.chunks[0]) // 16  # chunks in the largest group
    assert per_group > 1 and _chunk_launch(grouped).timeout == 2 * per_group
    apart = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, timeout=2, group=False)
    assert _chunk_launch(apart).timeout == 2


def test_a_kernel_error_in_a_grouped_launch_names_the_users_chunk(simulate):
    x = _x(n=160, chunks=16)  # element 85 lies in chunk 5, which starts at 80
    y = dg.map_kernel(fails_at_85, dg.Out(like=x), x, dg.offset, group=True)
    assert y.numblocks[0] < x.numblocks[0]
    with pytest.raises(ValueError, match=r"on chunk \(5,\) at offset \(80,\) \(in a grouped "
                                         r"launch over chunks \(0,\) to \(9,\)\).*element 85"):
        y.compute()


@pytest.mark.parametrize("size", [np.int64(8192), np.int32(4096), "8 KiB"])
def test_numpy_integers_are_sizes_everywhere(simulate, size):
    from daskgpu import _config
    from daskgpu._dask.batch.groups import check_group
    from daskgpu._dask.cluster_facts import ClusterFacts

    x = _x()
    y = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x, group=size)
    assert y.numblocks[0] < x.numblocks[0]
    assert launch_bytes(size, ClusterFacts()) == int(size) if not isinstance(size, str) else 8192
    assert check_group(size) == size
    with dask.config.set({"daskgpu.launch-bytes": size}):
        assert _config.get("launch-bytes") == (8192 if isinstance(size, str) else int(size))


# -- 3. array expressions: a grouped map lowers fully ----------------------------------

def test_dask_optimize_takes_a_grouped_map_over_a_creation_function(simulate):
    x = da.arange(4096, chunks=256, dtype=np.float32)
    y = dg.map_kernel(saxpy, dg.Out(like=x), np.float32(2), x, x)
    assert y.numblocks[0] < x.numblocks[0]
    (optimized,) = dask.optimize(y)
    assert len(dict(optimized.__dask_graph__())) > 0
    np.testing.assert_array_equal(optimized.compute(), 3 * np.arange(4096, dtype=np.float32))
    if EXPRESSIONS:
        assert y.persist().numblocks == y.numblocks


# -- on a GPU --------------------------------------------------------------------------

@dg.jit(debug=True, opt=False)
def fails_at_85_debug(out, x, start):
    i = cuda.grid(1)
    if i < out.size:
        if start + i == 85:
            raise ValueError("element 85 is bad")
        out[i] = x[i]


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CHUNK_DEPENDENT))
def test_on_a_gpu_chunk_dependent_kernels_give_what_group_false_gives(case):
    make, _, _ = CHUNK_DEPENDENT[case]
    x = _x()
    with dask.config.set({"scheduler": "sync"}):
        default, apart, warned = _computed(lambda g: make(x, g))
        assert warned and default.chunks == x.chunks
        np.testing.assert_array_equal(default.compute(), apart.compute())


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(SAFE))
def test_on_a_gpu_grouped_maps_give_what_group_false_gives(case):
    x = _x()
    with dask.config.set({"scheduler": "sync"}):
        grouped = SAFE[case](x)
        with dask.config.set({"daskgpu.launch-bytes": 0}):
            apart = SAFE[case](x)
        np.testing.assert_array_equal(grouped.compute(), apart.compute())


@pytest.mark.gpu
def test_on_a_gpu_a_debug_kernels_error_in_a_grouped_launch_names_the_users_chunk():
    x = _x(n=160, chunks=16)
    with dask.config.set({"scheduler": "sync"}):
        y = dg.map_kernel(fails_at_85_debug, dg.Out(like=x), x, dg.offset, group=True)
        assert y.numblocks[0] < x.numblocks[0]
        with pytest.raises(ValueError, match=r"on chunk \(5,\) at offset \(80,\) \(in a "
                                             r"grouped launch over chunks"):
            y.compute()
