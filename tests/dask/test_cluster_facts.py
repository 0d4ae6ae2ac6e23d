"""What the client learns of the cluster's workers before it builds a graph."""

import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client
from kit.kernels import saxpy

import daskgpu as dg
from daskgpu._dask import cluster_facts
from daskgpu._dask.workers.plugin import DEVICE_METRIC


def _report_old_linker(dask_worker):
    # What the plugin of a worker with an old nvJitLink sends with its heartbeats.
    dask_worker.metrics[DEVICE_METRIC] = lambda worker: {
        "cc": [9, 0], "driver": [11, 0], "linker": [11, 0]}


def _wait_until_the_scheduler_sees(client, address, linker=None, timeout=30):
    """Until ``address``'s heartbeat carried its device (with ``linker``, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = (cluster_facts.workers_info(client)[address].get("metrics") or {}).get(
            DEVICE_METRIC)
        if seen and (linker is None or list(seen["linker"] or ()) == linker):
            return
        assert time.monotonic() < deadline, "the heartbeat never carried the device"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_worker_with_an_old_linker_fails_the_map_once_when_the_graph_is_built():
    # Threaded workers: what the client reads of them is the same, and they start at once.
    with dg.LocalGPUCluster(simulate=True, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        old = sorted(cluster_facts.workers_info(client))[0]
        client.run(_report_old_linker, workers=[old])
        _wait_until_the_scheduler_sees(client, old, linker=[11, 0])
        cluster_facts.gpu_clusters.clear()
        x = da.arange(256, chunks=64, dtype=np.float32)
        with pytest.raises(dg.PTXVersionError) as caught:
            dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
        message = str(caught.value)
        assert message.startswith("kernel 'saxpy' cannot run on 1 of the cluster's GPU worker(s)")
        assert old in message and "nvJitLink 11.0 reads up to 7.0" in message
        assert message.count("(PTX ISA") == 1  # the other worker reported no device: not judged


@pytest.mark.slow
def test_facts_are_asked_again_once_stale(monkeypatch):
    with dg.LocalGPUCluster(simulate=True, devices=1, processes=False,
                            dashboard_address=None) as cluster, \
            Client(cluster):
        cluster_facts.gpu_clusters.clear()
        first = cluster_facts.cluster_facts()
        assert first.offers_gpu and first.simulates and first.devices == ()
        asked = []
        real = cluster_facts.workers_info
        monkeypatch.setattr(cluster_facts, "workers_info",
                            lambda client: asked.append(1) or real(client))
        cluster_facts.cluster_facts()
        assert asked == []  # fresh: no round trip
        monkeypatch.setattr(cluster_facts, "FRESH_SECONDS", 0.0)
        cluster_facts.cluster_facts()
        assert asked == [1]


@pytest.mark.slow
@pytest.mark.gpu
def test_real_gpu_workers_report_their_device_and_the_map_runs():
    with dask.config.set({"daskgpu.simulate": False}), \
            dg.LocalGPUCluster(simulate=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        address = sorted(cluster_facts.workers_info(client))[0]
        _wait_until_the_scheduler_sees(client, address)
        cluster_facts.gpu_clusters.clear()
        facts = cluster_facts.cluster_facts()
        assert [a for a, _ in facts.devices] == sorted(cluster_facts.workers_info(client))
        x = da.arange(1 << 16, chunks=1 << 14, dtype=np.float32)
        z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
        np.testing.assert_array_equal(z.compute(), 3 * np.arange(1 << 16, dtype=np.float32))
        client.run(_report_old_linker, workers=[address])
        _wait_until_the_scheduler_sees(client, address, linker=[11, 0])
        cluster_facts.gpu_clusters.clear()
        with pytest.raises(dg.PTXVersionError, match=address):
            dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)


# -- a worker's odd facts refuse that worker, not every map ---------------------------
_GOOD = {"resources": {"GPU": 1, "GPU-memory": 2**30},
         "metrics": {DEVICE_METRIC: {"cc": [9, 0], "driver": [13, 0], "linker": None}}}


class _Image:
    """An image with PTX for cc 7.5 and up, of PTX ISA 8.0."""

    def ptx_for(self, cc):
        return ".version 8.0\n" if cc >= (7, 5) else None


@pytest.mark.parametrize(("odd", "named"), [
    ({"metrics": {DEVICE_METRIC: {"cc": "9.0", "driver": [13, 0], "linker": None}}},
     "device facts {'cc': '9.0'"),
    ({"metrics": {DEVICE_METRIC: {"cc": [9, 0], "driver": "13.0", "linker": None}}},
     "'driver': '13.0'"),
    ({"metrics": {DEVICE_METRIC: [9, 0]}}, "device facts [9, 0]"),
    ({"metrics": [DEVICE_METRIC]}, "metrics ['daskgpu-device']"),
    ({"resources": {"GPU": 1, "GPU-memory": float("inf")}}, "GPU-memory=inf"),
    ({"resources": {"GPU": 1, "GPU-memory": float("nan")}}, "GPU-memory=nan"),
    ({"resources": {"GPU": 1, "GPU-memory": "16GB"}}, "GPU-memory='16GB'"),
], ids=["cc-text", "driver-text", "facts-list", "metrics-list", "memory-inf", "memory-nan",
        "memory-text"])
def test_a_worker_with_odd_facts_is_left_out_with_a_warning_naming_it(odd, named):
    workers = {"tcp://good:1": _GOOD, "tcp://odd:2": {"resources": {"GPU": 1}, **odd}}
    with pytest.warns(cluster_facts.OddWorkerWarning,
                      match=r"the worker tcp://odd:2 reports .*Other workers are not affected"
                      ) as caught:
        facts = cluster_facts._facts(workers)
    assert named in str(caught[0].message)
    assert facts.offers_gpu
    assert [address for address, _ in facts.devices][0] == "tcp://good:1"
    assert facts.gpu_memory == 2**30  # the odd offer is not counted
    # What a map checks with these facts runs, judging only the good worker.
    cluster_facts.check_workers_link(_Image(), "saxpy", facts)
    cluster_facts.check_chunk_fits(2**20, "saxpy", facts)


@pytest.mark.slow
def test_a_map_runs_on_a_cluster_where_a_worker_reports_odd_device_facts():
    with dg.LocalGPUCluster(simulate=True, processes=False, devices=2,
                            dashboard_address=None) as cluster, Client(cluster) as client:
        odd = sorted(cluster_facts.workers_info(client))[0]
        client.run(_report_odd_device, workers=[odd])
        _wait_until_the_scheduler_sees(client, odd)
        cluster_facts.gpu_clusters.clear()
        x = da.arange(256, chunks=64, dtype=np.float32)
        with pytest.warns(cluster_facts.OddWorkerWarning, match=odd):
            z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), 2.0, x, x)
        np.testing.assert_array_equal(z.compute(), 3 * np.arange(256, dtype=np.float32))


def _report_odd_device(dask_worker):
    # A worker of another build, sending its compute capability as text.
    dask_worker.metrics[DEVICE_METRIC] = lambda worker: {
        "cc": "9.0", "driver": [13, 0], "linker": None}
