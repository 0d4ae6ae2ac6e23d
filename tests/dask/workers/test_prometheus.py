"""daskgpu's figures at a worker's Prometheus endpoint, after a map_kernel."""

import urllib.request

import dask.array as da
import numpy as np
import pytest
from distributed import Client
from kit.kernels import saxpy

import daskgpu as dg
from daskgpu._dask.workers.prometheus import KERNELS_LABELLED, OTHER, GPUFigures

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def _scrape(url) -> dict:
    """``{(sample name, labels): value}`` of daskgpu's samples at ``url``."""
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith("daskgpu_")}


def _worker_metrics_urls(client):
    def where(dask_worker):
        host = dask_worker.address.split("://")[1].rsplit(":", 1)[0]
        return f"http://{host}:{dask_worker.http_server.port}/metrics"

    return client.run(where)


@pytest.mark.slow
def test_a_worker_endpoint_shows_launches_and_gpu_seconds_after_a_map():
    with dg.LocalGPUCluster(simulate=True, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        x = da.arange(256, chunks=64, dtype=np.float32)
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
        np.testing.assert_array_equal(client.compute(z).result(),
                                      3 * np.arange(256, dtype=np.float32))
        seen = [_scrape(url) for url in _worker_metrics_urls(client).values()]
    launches = sum(s.get(("daskgpu_launches_total", (("kernel", "saxpy"),)), 0) for s in seen)
    assert launches == 4  # one per chunk, over the workers
    kernel_seconds = sum(
        s.get(("daskgpu_gpu_seconds_total", (("activity", "kernel"), ("kernel", "saxpy"))), 0)
        for s in seen)
    assert kernel_seconds > 0
    assert all(("daskgpu_links_total", ()) in s for s in seen)
    # Simulated workers have no device memory to report.
    assert not any(name.startswith("daskgpu_device_memory") for s in seen for name, _ in s)


def test_kernel_names_are_bounded_per_process():
    figures = GPUFigures()
    for i in range(KERNELS_LABELLED + 10):
        figures(f"k{i}", "kernel", 1.0)
    assert len(figures.launches) == KERNELS_LABELLED + 1
    assert figures.launches[OTHER] == 10 and figures.seconds[OTHER, "kernel"] == 10.0
    families = {f.name: f for f in figures.collect()}
    assert families["daskgpu_launches"].samples[0].name == "daskgpu_launches_total"


@pytest.mark.slow
@pytest.mark.gpu
def test_a_gpu_worker_endpoint_shows_device_memory_and_copies():
    import dask

    n = 1 << 20
    with dask.config.set({"daskgpu.simulate": False}), \
            dg.LocalGPUCluster(simulate=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        x = da.arange(n, chunks=n // 4, dtype=np.float32)
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
        client.compute(z).result()
        seen = [_scrape(url) for url in _worker_metrics_urls(client).values()]
    for s in seen:
        used = s[("daskgpu_device_memory_used_bytes", ())]
        total = s[("daskgpu_device_memory_total_bytes", ())]
        assert 0 < used <= total
    assert sum(v for (name, labels), v in ((k, v) for s in seen for k, v in s.items())
               if name == "daskgpu_gpu_seconds_total" and ("activity", "copy-in") in labels) > 0
    assert sum(s[("daskgpu_links_total", ())] for s in seen) >= 1


def test_a_kernel_named_other_keeps_its_own_series_apart_from_the_overflow():
    figures = GPUFigures()
    for i in range(KERNELS_LABELLED - 2):
        figures(f"k{i}", "kernel", 1.0)
    figures("other", "kernel", 2.0)  # a kernel of that name, within the bound
    figures(OTHER, "kernel", 4.0)  # and one named as the overflow's label: the 64th
    figures("k-past-the-bound", "kernel", 8.0)  # counted under the overflow
    samples = {s.labels["kernel"]: s.value for f in figures.collect()
               if f.name == "daskgpu_gpu_seconds" for s in f.samples}
    assert samples["other"] == 2.0
    assert samples["(" + OTHER] == 4.0
    assert samples[OTHER] == 8.0
