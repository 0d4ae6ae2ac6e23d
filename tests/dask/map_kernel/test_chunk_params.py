"""map_kernel's parameter types: each prepares itself for one chunk, and pickles small."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np
import pytest
from layers import launch_keys
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.task import ChunkPlace, run_chunk
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkContext,
    ChunkParam,
    ChunkPlaces,
    FlatChunkParam,
    FlatOutParam,
    FlatView,
    OffsetParam,
    OutParam,
    PerChunkParam,
    StatesParam,
    ValueParam,
    WholeParam,
)
from daskgpu._dask.map_kernel.chunk_task import ChunkLaunch
from daskgpu._image.array_info import Zeroed
from daskgpu._image.random_states import host_states
from daskgpu._runtime import backends
from daskgpu._runtime.launch import unwrap


class RecordingChain:
    """What a fused task's device chain is asked to do, without a GPU."""

    def __init__(self):
        self.calls = []

    def to_device(self, array):
        self.calls.append(("to_device", array))
        return ("on the device", array)

    def zeros(self, shape, dtype, order):
        self.calls.append(("zeros", shape, dtype, order))
        return ("zeros on the device", shape)


class RecordingBackend:
    simulated, name = True, "recording"

    def __init__(self):
        self.calls = []

    def random_states(self, seed, base, shape, strides, builder):
        self.calls.append((seed, base, shape, strides, builder))
        return "states"


def chunk(shape=(2, 3), start=(4, 6), block_id=(2, 2), backend=None, **kw):
    return ChunkContext(block_id, shape, start, np, backend or backends.SIMULATOR, **kw)


ALL = [ChunkParam("C", False), OutParam("<f4", "F"), WholeParam(True), ValueParam(),
       OffsetParam(1), PerChunkParam("<i8", (4,), 7, "C"), StatesParam(3, (6, 1), None),
       FlatChunkParam("C", True), FlatOutParam("<f8", "C")]


# -- each kind, prepared for one chunk ---------------------------------------

def test_a_chunk_is_laid_out_as_the_signature_asks():
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    c = ChunkParam("C", written=False).for_chunk(chunk(), f)
    assert c.flags.c_contiguous and np.array_equal(c, f)
    assert ChunkParam("F", written=False).for_chunk(chunk(), f) is f
    assert ChunkParam("A", written=False).for_chunk(chunk(), f) is f


def test_a_written_chunk_is_a_copy():
    x = np.arange(6.0).reshape(2, 3)
    got = ChunkParam("F", written=True).for_chunk(chunk(), x)
    assert got is not x and np.array_equal(got, x) and got.flags.f_contiguous
    assert ChunkParam("C", written=True).result(got, chunk()) is got


def test_in_a_chain_host_chunks_go_to_the_device_once_and_intermediates_stay():
    chain = RecordingChain()
    x = np.arange(6.0).reshape(2, 3)
    assert ChunkParam("C", False).for_chunk(chunk(chain=chain), x) == ("on the device", x)
    middle = object()  # an earlier launch's output, on the device already
    assert ChunkParam("C", False).for_chunk(chunk(chain=chain), middle) is middle
    assert [c[0] for c in chain.calls] == ["to_device"]


def test_an_output_is_zeroed_in_the_chunks_shape_and_layout():
    out = OutParam("<f4", "F").for_chunk(chunk(shape=(2, 3)))
    assert isinstance(out, Zeroed)  # zero-filled on the GPU, not copied there
    array = OutParam("<f4", "F").result(out, chunk())
    assert array is unwrap(out)
    assert array.shape == (2, 3) and array.dtype == np.float32 and array.flags.f_contiguous


def test_an_intermediate_output_of_a_chain_stays_on_the_device():
    chain = RecordingChain()
    got = OutParam("<f4", "A").for_chunk(chunk(shape=(2, 3), chain=chain, keep=True))
    assert got == ("zeros on the device", (2, 3))
    assert chain.calls == [("zeros", (2, 3), "<f4", "C")]
    # The chain's last launch returns its output to the host as usual.
    assert isinstance(OutParam("<f4", "A").for_chunk(chunk(chain=chain)), Zeroed)


class DeviceArray:
    """A C-contiguous device array as a fused task's chain makes one: no reshape of its own."""

    def __init__(self, shape):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f8", "data": (4096, False),
                                         "strides": None, "version": 3}


def test_flat_chunks_are_c_ordered_views_of_the_launch_shape():
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    flat = FlatChunkParam("A", written=False).for_chunk(chunk(), f)
    assert flat.shape == (6,) and np.array_equal(flat, f.ravel())
    x = np.arange(6.0).reshape(2, 3)
    got = FlatChunkParam("C", written=True).for_chunk(chunk(), x)
    assert got.shape == (6,) and not np.shares_memory(got, x)
    assert FlatChunkParam("C", written=True).result(got, chunk()).shape == (2, 3)


def test_in_a_chain_flat_chunks_go_flat_and_intermediates_get_a_flat_view():
    chain = RecordingChain()
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    where, host = FlatChunkParam("C", False).for_chunk(chunk(chain=chain), f)
    assert where == "on the device" and host.shape == (6,) and np.array_equal(host, f.ravel())
    middle = DeviceArray((2, 3))
    view = FlatChunkParam("C", False).for_chunk(chunk(chain=chain), middle)
    assert isinstance(view, FlatView) and view.base is middle
    assert view.__cuda_array_interface__["shape"] == (6,)
    assert view.__cuda_array_interface__["data"] == (4096, False)


def test_a_flat_output_is_allocated_flat_and_returned_in_the_chunks_shape():
    out = FlatOutParam("<f8", "A").for_chunk(chunk(shape=(2, 3)))
    assert isinstance(out, Zeroed) and out.array.shape == (6,)
    assert FlatOutParam("<f8", "A").result(out, chunk()).shape == (2, 3)

    class Chain(RecordingChain):
        def zeros(self, shape, dtype, order):
            super().zeros(shape, dtype, order)
            return DeviceArray(shape)

    chain = Chain()
    kept = FlatOutParam("<f8", "C").for_chunk(chunk(shape=(2, 3), chain=chain, keep=True))
    assert chain.calls == [("zeros", (2, 3), "<f8", "C")]  # kept in the chunk's shape
    assert kept.__cuda_array_interface__["shape"] == (6,)
    assert FlatOutParam("<f8", "C").result(kept, chunk()) is kept.base


def test_a_whole_array_is_copied_only_when_written():
    w = np.arange(3)
    assert WholeParam(False).for_chunk(chunk(), w) is w
    copy = WholeParam(True).for_chunk(chunk(), w)
    assert copy is not w and np.array_equal(copy, w)


def test_a_value_passes_as_it_is():
    v = np.float32(2.5)
    assert ValueParam().for_chunk(chunk(), v) is v


def test_an_offset_is_one_axis_of_the_chunks_start():
    c = chunk(start=(4, -1))
    got = [OffsetParam(ax).for_chunk(c) for ax in (0, 1)]
    assert got == [4, -1] and all(type(g) is np.int64 for g in got)


def test_a_per_chunk_output_has_its_own_shape_and_fill():
    p = PerChunkParam("<i8", (4,), 7, "C")
    out = p.for_chunk(chunk(shape=(2, 3)))
    assert type(out) is np.ndarray and out.shape == (4,) and (out == 7).all()
    assert p.result(out, chunk(shape=(2, 3))).shape == (1, 1, 4)  # one block of the result
    zero = PerChunkParam("<i8", (2, 2), 0, "F").for_chunk(chunk())
    assert isinstance(zero, Zeroed) and unwrap(zero).shape == (2, 2)


def test_random_states_start_at_the_chunks_global_flat_index():
    backend = RecordingBackend()
    p = StatesParam(seed=3, strides=(6, 1), builder=None)
    assert p.for_chunk(chunk(shape=(2, 3), start=(4, 3), backend=backend)) == "states"
    assert backend.calls == [(3, 4 * 6 + 3, (2, 3), (6, 1), None)]
    assert StatesParam.strides_of((5, 4, 6)) == (24, 6, 1)


def test_simulated_random_states_are_the_whole_arrays():
    p = StatesParam(seed=11, strides=StatesParam.strides_of((4, 6)), builder=None)
    states = p.for_chunk(chunk(shape=(2, 3), start=(2, 3)))
    whole = host_states(11, np.arange(24, dtype=np.uint64)).reshape(4, 6)
    np.testing.assert_array_equal(states, whole[2:4, 3:6].ravel())


# -- plain data -----------------------------------------------------------------

@pytest.mark.parametrize("param", ALL, ids=lambda p: type(p).__name__)
def test_parameters_are_frozen_and_pickle_small(param):
    assert not hasattr(param, "__dict__")  # slots only
    again = pickle.loads(pickle.dumps(param))
    assert again == param and hash(again) == hash(param) and repr(again) == repr(param)
    assert len(pickle.dumps(param)) < 120
    with pytest.raises(AttributeError):
        param.written = True


def test_a_record_dtype_keeps_its_fields():
    from daskgpu._dask.map_kernel.arrays import plain_dtype

    record = np.dtype([("a", "<f4"), ("b", "<i8")])
    assert plain_dtype(np.float32) == "<f4" and plain_dtype(record) == record


def test_places_give_each_block_its_own_id_shape_and_start():
    places = ChunkPlaces(((3, 3, 2), (4,)), ((-1, 2, 5), (0,)))
    assert places.numblocks == (3, 1)
    assert places[2, 0] == ((2, 0), (2, 4), (5, 0), None)
    assert pickle.loads(pickle.dumps(places))[1, 0] == places[1, 0]


# -- one task's size ------------------------------------------------------------

@dg.jit("void(float32[::1], float32, float32[::1], float32[::1], int64)")
def saxpy_at(out, a, x, y, start):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i] + start


def _one_task(n_chunks):
    x = da.zeros(4 * n_chunks, chunks=4, dtype=np.float32)
    z = dg.map_kernel(saxpy_at, dg.Out(np.float32, like=x), np.float32(2), x, x, dg.offset)
    task = dict(z.__dask_graph__())[(z.name, n_chunks - 1)]
    assert task.func is run_chunk
    (key,) = launch_keys(z.__dask_graph__())
    assert isinstance(dict(z.__dask_graph__())[key].value, ChunkLaunch)
    return task


def test_a_tasks_size_does_not_grow_with_the_number_of_chunks():
    small, large = _one_task(100), _one_task(10_000)
    # Only the block index in the keys (99, 9999) tells them apart.
    assert abs(len(pickle.dumps(small)) - len(pickle.dumps(large))) <= 8
    # Its own chunk's place is all a task learns about the chunking.
    place = large.args[-1].value
    assert isinstance(place, ChunkPlace) and place == ((9_999,), (4,), (39_996,), None)
    # Three small tuples, and the record's class by name, which a graph's pickle
    # holds once for all its tasks.
    assert len(pickle.dumps(place)) < 90
