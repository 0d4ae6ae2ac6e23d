"""Without a GPU and with ``daskgpu.simulate`` off, every launch path fails with one line
that names the setting, never the driver loader's own error."""

import dask
import dask.array as da
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._errors import DeviceError

pytestmark = pytest.mark.nogpu


@dg.jit
def add_one(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1


def _assert_names_the_setting(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message
    assert "no CUDA GPU" in message and "daskgpu.simulate" in message


def test_a_local_launch_names_daskgpu_simulate():
    with dask.config.set({"daskgpu.simulate": False}), pytest.raises(DeviceError) as excinfo:
        add_one[1, 32](np.arange(8.0), np.zeros(8))
    _assert_names_the_setting(excinfo)


def test_map_kernel_on_the_local_scheduler_names_daskgpu_simulate():
    x = da.arange(8.0, chunks=4)
    with dask.config.set({"daskgpu.simulate": False, "scheduler": "threads"}):
        result = dg.map_kernel(add_one, x, dg.Out(np.float64, like=x))
        with pytest.raises(DeviceError) as excinfo:
            result.compute()
    _assert_names_the_setting(excinfo)


def test_the_same_launch_simulates_with_the_setting_on():
    out = np.zeros(8)
    with dask.config.set({"daskgpu.simulate": True}):
        add_one[1, 32](np.arange(8.0), out)
    np.testing.assert_array_equal(out, np.arange(8.0) + 1)
