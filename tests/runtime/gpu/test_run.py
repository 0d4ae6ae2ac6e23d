"""The general launch path's pure parts, without a GPU."""

import pytest

from daskgpu._runtime.gpu.run import stream_handle


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
