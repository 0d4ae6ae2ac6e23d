"""daskgpu on dask-cuda's LocalCUDACluster: submit, map_kernel over NumPy and CuPy
chunks, and device-resident outputs spilled under ``device_memory_limit`` (GPU only)."""

import importlib.util
import pathlib

import dask.array as da
import numpy as np
import pytest
from distributed import Client, wait
from kit.kernels import saxpy

import daskgpu as dg

pytestmark = pytest.mark.gpu
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "dask_cuda.py"


@pytest.fixture(scope="module")
def cluster():
    dask_cuda = pytest.importorskip("dask_cuda")
    pytest.importorskip("cupy")
    # 256 MB a GPU: the 1 GiB of outputs below cannot all stay on the device.
    with dask_cuda.LocalCUDACluster(device_memory_limit="256MB", dashboard_address=None) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as c:
        c.register_plugin(dg.GPUWorkerPlugin())
        yield c


def test_the_plugin_sets_up_dask_cuda_workers(client):
    info = client.run(dg.device_info)
    assert len(info) == len(client.scheduler_info()["workers"]) >= 1
    assert all(not i.get("simulated") for i in info.values())


def test_submit_a_launch(client):
    x = np.arange(1 << 20, dtype=np.float32)
    out = client.submit(saxpy.forall(x.size), np.empty_like(x), np.float32(2), x, x).result()
    np.testing.assert_array_equal(out, 3 * x)


def test_map_kernel_over_numpy_chunks(client):
    x = da.arange(1 << 22, dtype=np.float32, chunks=1 << 20)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
    np.testing.assert_array_equal(z.compute(), 3 * np.arange(1 << 22, dtype=np.float32))


def test_map_kernel_outputs_on_the_device_spill_under_device_memory_limit(client):
    import cupy as cp

    n = 1 << 28  # 1 GiB of float32 outputs, in 64 MiB chunks
    x = (da.arange(n, dtype=np.int64, chunks=1 << 24) % 4096).astype(np.float32)
    x = x.map_blocks(cp.asarray)
    z = client.persist(dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x))
    assert isinstance(z._meta, cp.ndarray)
    wait(z)  # persist returns at once; count where the chunks are only once they all exist

    def where(dask_worker):
        data = dask_worker.data
        return {k: len(getattr(data, k, None) or ()) for k in ("device", "host", "disk")}

    counts = list(client.run(where).values())
    assert sum(c["host"] + c["disk"] for c in counts) > 0, counts  # spilled
    assert all(c["device"] <= 4 for c in counts), counts            # 4 x 64 MiB = 256 MiB
    # Spilled chunks come back to the device when a task needs them, unchanged.
    block = client.compute(z.blocks[3]).result()
    assert isinstance(block, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(block), 3 * (np.arange(1 << 24) % 4096))
    total = float(client.compute(z.sum(dtype=np.float64)).result())
    assert total == 3.0 * (n // 4096) * (4095 * 4096 // 2)


def test_the_example_runs(cluster):
    spec = importlib.util.spec_from_file_location("daskgpu_example_dask_cuda", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(gib=0.5, cluster=cluster)
    assert result["sum"] == 3.0 * (1 << 27)
    assert sum(c["host"] + c["disk"] for c in result["spilled"].values()) > 0
