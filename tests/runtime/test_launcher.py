"""Launch geometry, without a GPU: the pure parts of the launcher."""

import math

import pytest

from daskgpu._runtime.launcher import block_shape, stream_handle


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


@pytest.mark.parametrize("stream, handle", [(None, 0), (0, 0), (1234, 1234)])
def test_stream_handles(stream, handle):
    assert stream_handle(stream) == handle


def test_stream_objects_by_protocol_and_attribute():
    class CudaStream:
        def __cuda_stream__(self):
            return (0, 99)

    class Numbaish:
        handle = type("c_void_p", (), {"value": 77})()

    assert stream_handle(CudaStream()) == 99
    assert stream_handle(Numbaish()) == 77
    with pytest.raises(TypeError, match="cannot use object as a CUDA stream"):
        stream_handle(object())


def test_out_of_memory_message_names_sizes_and_the_fix():
    from daskgpu._runtime.launcher import out_of_memory_message

    gib = 1 << 30
    msg = out_of_memory_message(200 * gib, 3 * gib, 12 * gib, 140 * gib)
    assert "a host array of 200.00 GiB does not fit on the GPU" in msg
    assert "12.00 GiB of 140.00 GiB are free" in msg
    assert "3.00 GiB of this launch's arrays already there" in msg
    assert "Nothing was launched and the arrays are unchanged" in msg
    assert "rechunk" in msg
    assert "already there" not in out_of_memory_message(gib, 0, 0, gib)


def test_threads_asking_first_at_once_share_one_copy_pipeline_and_output_pool():
    # Each owns page-locked memory under a bound: a second one would exceed it.
    import threading

    from daskgpu._runtime.launcher import _one_per_process

    made = []
    start = threading.Barrier(8)

    @_one_per_process
    def pool():
        made.append(object())
        threading.Event().wait(0.05)  # a slow make: the others arrive meanwhile
        return made[-1]

    got = []

    def ask():
        start.wait()
        got.append(pool())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)
