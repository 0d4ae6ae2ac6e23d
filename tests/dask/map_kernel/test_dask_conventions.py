"""map_kernel follows Dask's conventions: key names as ``map_blocks`` makes them,
and results that distributed's progress bar follows."""

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import progress, wait
from kit.kernels import scale64
from numba import cuda

import daskgpu as dg

SIG = "void(float64[::1], float64, float64[::1])"


@dg.jit("void(float64[::1], float64[::1], float64, float64[::1])")
def scale_both(out, out2, a, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i]
        out2[i] = -a * x[i]


@pytest.fixture
def x():
    return da.arange(40.0, chunks=10)


def test_token_is_a_prefix_and_different_calls_never_share_keys(x):
    # As in da.map_blocks: token= is the prefix, a hash of the arguments follows.
    with dask.config.set({"daskgpu.simulate": True}):
        two = dg.map_kernel(scale64, dg.Out(np.float64, like=x), 2.0, x, token="scaled")
        three = dg.map_kernel(scale64, dg.Out(np.float64, like=x), 3.0, x, token="scaled")
        again = dg.map_kernel(scale64, dg.Out(np.float64, like=x), 2.0, x, token="scaled")
        assert two.name.startswith("scaled-") and three.name.startswith("scaled-")
        assert two.name != three.name      # the bug: both were "scaled", one result
        assert again.name == two.name      # equal calls, equal keys, as in map_blocks
        a, b = dask.compute(two, three)
    np.testing.assert_array_equal(a, 2 * np.arange(40.0))
    np.testing.assert_array_equal(b, 3 * np.arange(40.0))


def test_name_gives_the_full_name(x):
    # As in da.map_blocks: name= is the whole key name, and wins over token=.
    with dask.config.set({"daskgpu.simulate": True}):
        z = dg.map_kernel(scale64, dg.Out(np.float64, like=x), 2.0, x, name="my-scale")
        assert z.name == "my-scale"
        assert dg.map_kernel(scale64, dg.Out(np.float64, like=x), 2.0, x, name="a",
                             token="b").name == "a"
        outs = dg.map_kernel(scale_both, dg.Out(np.float64, like=x),
                             dg.Out(np.float64, like=x), 2.0, x, token="both")
        assert [o.name.rsplit("-out", 1)[1] for o in outs] == ["0", "1"]
        assert outs[0].name.startswith("both-")


def test_default_name_is_the_kernel_and_a_token(x):
    with dask.config.set({"daskgpu.simulate": True}):
        z = dg.map_kernel(scale64, dg.Out(np.float64, like=x), 2.0, x)
        assert z.name.startswith("scale-") and len(z.name) > len("scale-") + 16


def test_distributed_progress_follows_map_kernel_results(client, x, capsys):
    z = client.persist(dg.map_kernel(scale64, dg.Out(np.float64, like=x), 2.0, x))
    outs = client.persist(list(dg.map_kernel(scale_both, dg.Out(np.float64, like=x),
                                             dg.Out(np.float64, like=x), 2.0, x)))
    total = client.persist(dg.map_kernel(
        scale64, dg.Out(np.float64, per_chunk=(1,), combine="sum", fill=0.0), 1.0, x))
    progress(z, *outs, total, notebook=False)  # returns once every task has finished
    err = capsys.readouterr()
    assert "100% Completed" in err.out + err.err
    wait([z, *outs, total])
    assert all(f.status == "finished" for f in client.futures_of([z, *outs, total]))
    np.testing.assert_array_equal(z.compute(), 2 * np.arange(40.0))
    np.testing.assert_array_equal(outs[1].compute(), -2 * np.arange(40.0))
