"""On a GPU: images linked once per device, from memory, disk or the linker; occupancy blocks."""

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import daskgpu as dg
from daskgpu._cli.bench.kernels import saxpy

pytestmark = pytest.mark.gpu


def test_pickled_launch_links_once_per_device():
    from daskgpu._runtime.gpu.linked_kernel import module_cache

    launch = pickle.loads(pickle.dumps(saxpy.forall(64)))
    x = np.ones(64, np.float32)
    launch(np.zeros_like(x), 1.0, x, x)
    links = module_cache.links
    for _ in range(3):
        out = launch(np.zeros_like(x), 1.0, x, x)
    assert module_cache.links == links
    np.testing.assert_allclose(out, 2.0)


def test_forall_uses_occupancy_block_size():
    from daskgpu._image.launch_config import launch_dims
    from daskgpu._runtime.gpu import device
    from daskgpu._runtime.gpu.linked_kernel import linked

    image = saxpy.images[0]
    lk = linked(image, device.current())
    grid, block = launch_dims(dg.LaunchConfig(ntasks=10_000), lk.block_size)
    assert block[0] == lk.block_size(0) and block[0] % 32 == 0
    assert grid[0] * block[0] >= 10_000


@pytest.mark.slow
def test_disk_cache_hits_in_a_fresh_process(tmp_path):
    blob = tmp_path / "launch.pkl"
    blob.write_bytes(pickle.dumps(saxpy.forall(16)))
    script = textwrap.dedent(f"""
        import pickle, sys, numpy as np, dask
        sys.modules["numba"] = None
        with dask.config.set({{"daskgpu.cache-dir": {str(tmp_path / 'cubins')!r}}}):
            import daskgpu._runtime.gpu.linker as linker
            calls = []
            orig = linker.link_cubin
            import daskgpu._runtime.gpu.linked_kernel as linked_kernel
            linked_kernel.link_cubin = lambda *a: calls.append(1) or orig(*a)
            launch = pickle.load(open({str(blob)!r}, "rb"))
            x = np.ones(16, np.float32)
            out = launch(np.zeros_like(x), 1.0, x, x)
            assert (out == 2).all()
            print("LINKED", len(calls))
    """)
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "LINKED 1" in first.stdout
    assert "LINKED 0" in second.stdout
    assert os.listdir(tmp_path / "cubins")
