"""Launch configurations as values, their geometry and device limits: no GPU needed."""

import math
import pickle

import numpy as np
import pytest

import daskgpu as dg
from daskgpu._image.launch_config import (
    DeviceLimits,
    LaunchConfig,
    block_shape,
    launch_dims,
    pad3,
    task_counts,
)


def test_config_dims_are_padded_to_three():
    c = LaunchConfig(4, (128, 2))
    assert c.griddim == (4, 1, 1) and c.blockdim == (128, 2, 1)
    assert LaunchConfig([2, 3, 4], 1).griddim == (2, 3, 4)
    assert LaunchConfig(np.int64(3), np.int32(32)).griddim == (3, 1, 1)


def test_config_value_semantics():
    a, b = LaunchConfig(4, 128), LaunchConfig((4,), (128, 1, 1))
    assert a == b and hash(a) == hash(b)
    assert a != LaunchConfig(4, 64)
    assert a != LaunchConfig(4, 128, 0, 1024)
    assert LaunchConfig(4, 128, None) == a  # None and 0 are both the default stream
    assert LaunchConfig(ntasks=10) == LaunchConfig(ntasks=10)
    assert LaunchConfig(ntasks=10) != LaunchConfig(ntasks=10, tpb=64)
    assert LaunchConfig(ntasks=(10, 5)) == LaunchConfig(ntasks=[10, 5])
    assert a != (4, 128) and a != LaunchConfig(ntasks=512)
    assert len({a, b, LaunchConfig(4, 64)}) == 2


def test_config_with_an_int_stream_compares_by_value():
    handle = 2**40 + 12345
    a = LaunchConfig(1, 32, int(str(handle)))
    b = LaunchConfig(1, 32, int(str(handle)))
    assert a.stream is not b.stream
    assert a == b and hash(a) == hash(b)
    assert a != LaunchConfig(1, 32, handle + 1)


def test_config_with_a_stream_object_compares_by_identity():
    s1, s2 = object(), object()
    assert LaunchConfig(1, 32, s1) == LaunchConfig(1, 32, s1)
    assert LaunchConfig(1, 32, s1) != LaunchConfig(1, 32, s2)
    assert LaunchConfig(1, 32, s1) != LaunchConfig(1, 32)


def test_config_repr():
    assert repr(LaunchConfig(4, 128)) == "LaunchConfig(griddim=(4, 1, 1), blockdim=(128, 1, 1))"
    assert repr(LaunchConfig(2, (8, 8), 0, 256)) == (
        "LaunchConfig(griddim=(2, 1, 1), blockdim=(8, 8, 1), sharedmem=256)")
    assert repr(LaunchConfig(ntasks=1000)) == "LaunchConfig(ntasks=1000)"
    assert repr(LaunchConfig(ntasks=(10, 20), tpb=64)) == "LaunchConfig(ntasks=(10, 20), tpb=64)"
    assert repr(LaunchConfig(1, 1, 7)) == (
        "LaunchConfig(griddim=(1, 1, 1), blockdim=(1, 1, 1), stream=7)")


@pytest.mark.parametrize("kwargs, match", [
    (dict(griddim=0, blockdim=1), r"griddim 0 has a dimension below 1"),
    (dict(griddim=(4, 0), blockdim=1), r"griddim \(4, 0\) has a dimension below 1"),
    (dict(griddim=1, blockdim=-32), r"blockdim -32 has a dimension below 1"),
    (dict(griddim=(1, 1, 1, 1), blockdim=1),
     r"griddim must have 1 to 3 dimensions, got \(1, 1, 1, 1\)"),
    (dict(griddim=1, blockdim=(2, 2, 2, 2)), r"blockdim must have 1 to 3 dimensions"),
    (dict(griddim=(), blockdim=1), r"griddim must have 1 to 3 dimensions, got \(\)"),
    (dict(griddim=1.5, blockdim=1), r"griddim must be integers, got 1\.5"),
    (dict(griddim=1, blockdim="32"), r"blockdim must be integers, got '32'"),
    (dict(griddim=1), r"a launch needs both griddim and blockdim"),
    (dict(blockdim=1), r"a launch needs both griddim and blockdim"),
    (dict(griddim=1, blockdim=1, sharedmem=-1), r"sharedmem must be non-negative, got -1"),
    (dict(ntasks=-1), r"forall ntasks must be 1 to 3 non-negative integers, got -1"),
    (dict(ntasks=(1, 2, 3, 4)), r"forall ntasks must be 1 to 3"),
    (dict(ntasks=()), r"forall ntasks must be 1 to 3"),
    (dict(ntasks=10, tpb=-1), r"tpb must be 0 \(automatic\) or positive, got -1"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(dg.LaunchConfigError, match=match) as info:
        LaunchConfig(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, dg.DaskGPUError)


def test_config_pickles_without_a_stream_only():
    for c in (LaunchConfig(4, (8, 8), 0, 64), LaunchConfig(ntasks=(3, 4), tpb=16)):
        back = pickle.loads(pickle.dumps(c))
        assert back == c and repr(back) == repr(c)
    with pytest.raises(dg.PicklingError,
                       match=r"bound to a CUDA stream.*configure it without a stream"):
        pickle.dumps(LaunchConfig(1, 1, 5))


# -- geometry ----------------------------------------------------------------------------


@pytest.mark.parametrize("ntasks", [(4096, 4096), (5, 1000), (4096, 100), (4096, 3),
                                    (64, 64, 64), (8, 8, 1000), (100, 3, 2), (3, 5, 7)])
@pytest.mark.parametrize("size", [1024, 256, 96, 32])
def test_block_fits_the_size_and_the_device_limits(ntasks, size):
    block = block_shape(size, ntasks)
    assert len(block) == len(ntasks)
    assert math.prod(block) <= size
    assert block[1] <= 1024 and (len(block) < 3 or block[2] <= 64)
    assert all(b >= 1 for b in block)


@pytest.mark.parametrize("ntasks", [(4096, 4096), (7, 300), (64, 64, 64), (2, 2, 500)])
def test_warps_run_along_the_last_axis_when_it_holds_one(ntasks):
    # Threads are numbered x-fastest: a block one thread wide in every other axis
    # puts 32 consecutive threads on consecutive elements of a C-ordered row.
    block = block_shape(1024, ntasks)
    assert block[:-1] == (1,) * (len(ntasks) - 1)
    assert block[-1] >= 32


def test_one_dimensional_blocks_take_the_whole_size():
    assert block_shape(768, (10**6,)) == (768,)


def test_short_last_axis_spends_the_rest_of_the_block_on_the_others():
    assert block_shape(1024, (4096, 3)) == (256, 4)


def test_launch_dims_takes_the_block_size_as_an_int_or_a_callable():
    config = LaunchConfig(ntasks=10_000)
    asked = []

    def occupancy(sharedmem):
        asked.append(sharedmem)
        return 256

    grid, block = launch_dims(config, occupancy)
    assert (grid, block) == launch_dims(config, 256) == ((40, 1, 1), (256, 1, 1))
    assert asked == [0]
    assert grid[0] * block[0] >= 10_000


def test_launch_dims_asks_for_no_block_size_when_the_config_gives_one():
    def occupancy(sharedmem):
        raise AssertionError("not needed: tpb is given")

    assert launch_dims(LaunchConfig(ntasks=1000, tpb=128), occupancy) == ((8, 1, 1), (128, 1, 1))
    grid_block = LaunchConfig(4, (16, 8))
    assert launch_dims(grid_block, occupancy) == ((4, 1, 1), (16, 8, 1))


def test_launch_dims_keeps_grid_axes_within_their_limits():
    grid, block = launch_dims(LaunchConfig(ntasks=(10, 1_000_000)), 1024, (2**31 - 1, 1000, 1000))
    assert all(g <= m for g, m in zip(grid, (2**31 - 1, 1000, 1000)))
    assert grid[1] * block[1] >= 1_000_000 and math.prod(block) <= 1024


def test_task_counts_and_pad3():
    assert task_counts(LaunchConfig(ntasks=7)) == (7,)
    assert task_counts(LaunchConfig(ntasks=(0, 3))) == (0, 3)
    assert task_counts(LaunchConfig(2, 32)) is None
    assert pad3((5,)) == (5, 1, 1) and pad3([2, 3, 4]) == (2, 3, 4)


def test_device_limits_name_every_problem_and_the_fix():
    limits = DeviceLimits(1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), 49152)
    limits.check((1, 1, 1), (1024, 1, 1), 49152, 1024, "k")  # at the limits: fine
    with pytest.raises(dg.LaunchConfigError) as info:
        limits.check((1, 70000, 1), (32, 32, 2), 50000, 512, "k")
    msg = str(info.value)
    assert "block (32, 32, 2) has 2048 threads, but kernel 'k' allows at most 512" in msg
    assert "(limited by its register use)" in msg
    assert "grid (1, 70000, 1) exceeds the device's grid limits" in msg
    assert "dynamic shared memory of 50000 bytes exceeds the device's 49152 bytes" in msg
    assert msg.endswith("or use kernel.forall(n) to let daskgpu pick the block size.")
