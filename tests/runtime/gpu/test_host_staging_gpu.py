"""On a GPU: a launch's host arrays that do not fit are refused with the sizes."""

import numpy as np
import pytest

import daskgpu as dg
from daskgpu._cli.bench.kernels import saxpy

pytestmark = pytest.mark.gpu


def test_host_array_larger_than_free_device_memory_is_refused_with_the_sizes():
    from cuda.bindings import driver

    from daskgpu._runtime.gpu import device

    device.current()
    pool = driver.cuDeviceGetDefaultMemPool(0)[1]
    driver.cuCtxSynchronize()
    driver.cuMemPoolTrimTo(pool, 0)  # memory the pool kept would serve the copy
    free = driver.cuMemGetInfo()[1]
    err, hog = driver.cuMemAlloc(free - (1 << 30))  # leave 1 GiB free
    assert err == driver.CUresult.CUDA_SUCCESS
    try:
        n = (2 << 30) // 4  # 2 GiB of host float32
        x = np.ones(n, np.float32)
        out = np.full(16, -1, np.float32)
        with pytest.raises(dg.DeviceError,
                           match=r"host array of 2\.00 GiB does not fit on the GPU"):
            saxpy.forall(16)(out, np.float32(2), x, x[:16])
        assert (out == -1).all()  # nothing launched, arrays unchanged
    finally:
        driver.cuMemFree(hog)
    assert saxpy.forall(16)(out, np.float32(2), x[:16], x[:16]) is out  # the worker goes on
    np.testing.assert_array_equal(out, 3)
