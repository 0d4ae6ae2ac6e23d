"""The fill kernels give a block's cells outside the array what ``fill_host`` gives them
(what Dask's ``map_overlap`` pads with), here in the simulator; on the device they run
in tests/dask/iterate/test_iterate_gpu.py."""

import numpy as np
import pytest

from daskgpu._compiler.boundary_fill import CONSTANT, NEAREST, REFLECT, fill_kernel
from daskgpu._dask.iterate.block_task import Fill, fill_host


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("kind, mode, value", [("constant", CONSTANT, 7.5),
                                               ("reflect", REFLECT, 0),
                                               ("nearest", NEAREST, 0)])
def test_the_kernel_fills_as_numpy_does(axis, kind, mode, value):
    rng = np.random.default_rng(0)
    a = rng.random((7, 6)).astype(np.float32)
    want = a.copy()
    lo, hi = 2, a.shape[axis] - 1  # two cells before the array, one after
    fill = Fill(axis, kind, mode, value)
    fill_host(want, fill, lo, hi)
    kernel = fill_kernel(np.float32, 2, simulate=True)
    for first, count in ((0, lo), (hi, a.shape[axis] - hi)):
        ntasks = tuple(count if ax == axis else n for ax, n in enumerate(a.shape))
        kernel.forall(ntasks, 4)(a, axis, first, count, lo, hi, mode, np.float32(value))
    np.testing.assert_array_equal(a, want)
