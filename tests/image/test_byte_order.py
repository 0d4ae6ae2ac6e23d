"""A big-endian array gets a message that names its byte order."""

import numpy as np

from daskgpu._image.argspec import ArgSpec, mismatch


def test_big_endian_mismatch_names_the_byte_order():
    spec = ArgSpec("array", "float32", 1, "C")
    text = mismatch(spec, np.zeros(3, ">f4"))
    assert "got float32 in big-endian byte order (>f4)" in text
    assert ".astype('float32')" in text
