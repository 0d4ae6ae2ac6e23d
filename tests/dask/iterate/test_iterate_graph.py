"""``dg.iterate``'s graph: a layer of tasks per block, its names, and what it refuses."""

import dask
import dask.array as da
import numpy as np
import pytest
from kit.kernels import heat_1d, heat_2d, saxpy_lazy, wave_1d

import daskgpu as dg
from daskgpu._dask.iterate.block_task import BlockLaunch
from daskgpu._dask.iterate.plan import block_lengths, default_block_steps
from daskgpu._dask.launch_core.walk import launches_in

A = np.float32(0.2)


def _tasks(array) -> int:
    return len(dict(array.__dask_graph__()))


def test_the_graph_holds_at_most_a_third_of_a_loop_of_map_kernel_steps(simulate):
    u0 = da.zeros((8, 8), chunks=4, dtype=np.float32)
    u = u0
    for _ in range(12):
        u = dg.map_kernel(heat_2d, dg.Out(np.float32, like=u0), u, A, depth=1,
                          boundary="periodic")
    blocked = dg.iterate(heat_2d, dg.Out(np.float32, like=u0), u0, A, steps=12, depth=1,
                         boundary="periodic")
    assert _tasks(blocked) * 3 <= _tasks(u)


def test_a_block_is_one_layer_of_launches_that_asks_as_a_map_does(simulate):
    u0 = da.zeros(12, chunks=4, dtype=np.float32)
    u = dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, steps=10, depth=1,
                   boundary="periodic", group=False, block_steps=4, timeout=30)
    graph = dict(u.__dask_graph__())
    found = [launch for task in graph.values()
             for _, launch, _ in launches_in(task, graph.get)]
    assert len(found) == 3 * 3  # blocks of 4, 4 and 2 steps, three chunks each
    assert sorted(launch.steps for launch in found) == [2] * 3 + [4] * 6
    assert all(isinstance(launch, BlockLaunch) for launch in found)
    # the time limit a map's task has, and the memory of a state and its output buffer
    assert {launch.timeout for launch in found} == {30}
    assert {launch.device_bytes((12,)) for launch in found} == {12 * (4 + 4)}


def _launch_names(array) -> set:
    graph = dict(array.__dask_graph__())
    return {key[0] for key, task in graph.items() if isinstance(key, tuple)
            and next(launches_in(task, graph.get), None) is not None}


def test_names_follow_the_arguments_and_token_and_name_name_the_launches(simulate):
    u0 = da.zeros(8, chunks=4, dtype=np.float32)

    def run(**kw):
        return dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, depth=1, **kw)

    assert run(steps=3).name == run(steps=3).name
    assert run(steps=3).name != run(steps=4).name
    assert run(steps=3).name != run(steps=3, block_steps=1).name
    assert all(n.startswith("heat_1d-") for n in _launch_names(run(steps=3)))
    assert all(n.startswith("diffuse-") for n in _launch_names(run(steps=3, token="diffuse")))
    assert "final" in _launch_names(run(steps=3, name="final"))  # the last block's, as in
    # map_kernel with depth: the trimmed result has a name of its own


def test_the_default_block_and_the_blocks():
    assert block_lengths(7, 3) == (3, 3, 1)
    # larger chunks of host data: longer blocks, at most what a chunk holds as a halo
    small = default_block_steps(1000, ((64,) * 4,) * 2, (1, 1), 4, on_device=False)
    large = default_block_steps(1000, ((1024,) * 4,) * 2, (1, 1), 4, on_device=False)
    assert 1 <= small <= 64 and small < large
    assert default_block_steps(1000, ((64,) * 4,), (4,), 4, on_device=False) <= 16


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(steps=-1), ValueError, "steps"),
    (dict(steps=2, group=False, block_steps=0), ValueError, "block_steps"),
    (dict(steps=4, group=False, block_steps=4), ValueError, "use block_steps of at most 2"),
    (dict(steps=2, boundary="wrap"), ValueError, "boundary"),
    (dict(steps=2, state={"v": "out"}), ValueError, "no parameter of kernel 'heat_1d'"),
    (dict(steps=2, state={"a": "out"}), ValueError, "must be a dask array input"),
    (dict(steps=2, state=[1, 0]), TypeError, "takes a dict"),
])
def test_what_it_refuses_says_why(simulate, kwargs, error, match):
    u0 = da.zeros(6, chunks=(2, 4), dtype=np.float32)
    kwargs = {"depth": 1, **kwargs}
    with pytest.raises(error, match=match):
        dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, **kwargs)


def test_an_output_that_feeds_no_state_is_refused(simulate):
    u0 = da.zeros(6, chunks=3, dtype=np.float32)
    with pytest.raises(ValueError, match="feed no state"):
        dg.iterate(wave_1d, dg.Out(np.float32, like=u0), u0, u0, u0, steps=2, depth=1,
                   state={"u_prev": "u"})


def test_a_kernel_that_writes_its_input_is_refused(simulate):
    x = da.ones(4, chunks=2, dtype=np.float32)
    with pytest.raises(ValueError, match="write each next state to a dg.Out"):
        dg.iterate(saxpy_lazy, x, np.float32(2), x, x, steps=2, state={1: 0})


def test_a_state_of_another_dtype_is_refused(simulate):
    u0 = da.zeros(6, chunks=3, dtype=np.float32)
    with pytest.raises(ValueError, match="dtype"):
        dg.iterate(heat_1d, dg.Out(np.float64, like=u0), u0, A, steps=2, depth=1)


def test_without_a_cluster_it_simulates_with_the_setting(simulate):
    with dask.config.set({"daskgpu.simulate": True}):
        u0 = da.ones(4, chunks=2, dtype=np.float32)
        u = dg.iterate(heat_1d, dg.Out(np.float32, like=u0), u0, A, steps=2, tpb=16)
        np.testing.assert_array_equal(u.compute(), np.ones(4, np.float32))
