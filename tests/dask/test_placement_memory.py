"""Launches share a GPU by its memory: each asks what its chunk needs on the device, of
the GPU-memory its worker offers, so launches running at once never ask for more."""

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, get_task_stream, wait
from numba import cuda

import daskgpu as dg
from daskgpu._dask.placement import GPU_MEMORY

dg._config.register()  # before dask.config.set, so the defaults outlive its blocks

OFFER = 64 * 1024  # a simulated device of 64 KiB


@dg.jit("void(float32[::1], float32[::1])")
def double(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i]


@pytest.fixture(scope="module")
def client():
    with dask.config.set({"daskgpu.device-memory": OFFER}), \
            dg.LocalGPUCluster(simulate=True, devices=1, threads_per_worker=2,
                               dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1)
        yield client


#: Seconds by which a worker's recorded start and stop of back-to-back tasks may
#: overlap (it records the stop after it has freed the resources).
SKEW = 0.1


def _most_at_once(stream, name="double-") -> int:
    """The most launch tasks of ``stream`` (keys with ``name``) that ran at the same time."""
    spans = [(s["start"] + SKEW, s["stop"] - SKEW) for t in stream
             if name in str(t["key"]) for s in t["startstops"]
             if s["action"] == "compute" and s["stop"] - s["start"] > 2 * SKEW]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _launch_tasks(stream, name) -> int:
    """How many tasks of ``stream`` (keys with ``name``) computed: a count of zero would
    make :func:`_most_at_once` hold vacuously."""
    return sum(1 for t in stream if name in str(t["key"])
               for s in t["startstops"] if s["action"] == "compute")


def _resources(client):
    (worker,) = client.scheduler_info(n_workers=-1)["workers"].values()
    return worker["resources"]


def test_a_worker_offers_its_device_memory(client):
    assert _resources(client) == {"GPU": 1, GPU_MEMORY: OFFER}


def test_chunks_over_half_the_device_never_run_together(client):
    x = da.arange(5000 * 4, chunks=5000, dtype=np.float32)  # 40 KB a chunk: 20 in, 20 out
    z = dg.map_kernel(double, dg.Out(np.float32, like=x), x)
    with get_task_stream(client) as ts:
        got = client.compute(z).result()
    np.testing.assert_array_equal(got, 2 * np.arange(20000, dtype=np.float32))
    assert _most_at_once(ts.data) == 1


def test_small_chunks_still_run_as_many_as_the_threads(client):
    x = da.arange(2000 * 8, chunks=2000, dtype=np.float32)  # 16 KB a chunk
    z = dg.map_kernel(double, dg.Out(np.float32, like=x), x)
    with get_task_stream(client) as ts:
        client.compute(z).result()
    assert _most_at_once(ts.data) == 2


def test_each_launch_asks_what_its_own_chunk_needs(client):
    # One map of large and small chunks: each task asks for its own chunk (4 bytes in,
    # 4 out per element), not the largest's, so the small ones still share the device.
    sizes = (5000, 1000, 1000, 5000, 1000, 1000)
    x = da.arange(sum(sizes), chunks=(sizes,), dtype=np.float32)
    z = dg.map_kernel(double, dg.Out(np.float32, like=x), x).persist()
    np.testing.assert_array_equal(z.compute(), 2 * np.arange(sum(sizes), dtype=np.float32))

    def asked(dask_scheduler):  # by block: the launches, fused with arange or not
        return {ts.key[1]: ts.resource_restrictions[GPU_MEMORY]
                for ts in dask_scheduler.tasks.values()
                if GPU_MEMORY in (ts.resource_restrictions or {})}

    assert client.run_on_scheduler(asked) == {i: 8 * n for i, n in enumerate(sizes)}
    del z


def test_a_chunk_larger_than_any_worker_offers_is_refused_when_the_graph_is_built(client):
    x = da.arange(10000 * 2, chunks=10000, dtype=np.float32)  # 80 KB a chunk
    with pytest.raises(ValueError, match=r"^kernel 'double' needs 78.12 kiB of device memory "
                                         r"for its largest chunk .* \(64.00 kiB of GPU-memory\); "
                                         r"use smaller chunks"):
        dg.map_kernel(double, dg.Out(np.float32, like=x), x)


def test_a_submitted_launch_asks_for_its_arrays_bytes(client):
    x = np.arange(1000, dtype=np.float32)
    future = client.submit(double.forall(1000), np.zeros_like(x), x, pure=False)
    np.testing.assert_array_equal(future.result(), 2 * x)

    def asked(dask_scheduler, key=future.key):
        return dict(dask_scheduler.tasks[key].resource_restrictions or {})

    assert client.run_on_scheduler(asked)[GPU_MEMORY] == 8000

    # More than the worker has: asks for all of it, runs alone, and does not wait forever.
    big = np.arange(20_000, dtype=np.float32)
    future = client.submit(double.forall(big.size), np.zeros_like(big), big, pure=False)
    np.testing.assert_array_equal(future.result(timeout=60), 2 * big)
    assert client.run_on_scheduler(asked, key=future.key)[GPU_MEMORY] == OFFER


@pytest.mark.slow
def test_without_the_setting_simulated_workers_offer_no_memory():
    # (This module's cluster sets it while it is open.)
    with dask.config.set({"daskgpu.device-memory": None}), \
            dg.LocalGPUCluster(simulate=True, devices=1, processes=False,
                            dashboard_address=None) as cluster, Client(cluster) as client:
        assert _resources(client) == {"GPU": 1}
        x = da.arange(1000, chunks=500, dtype=np.float32)
        out = dg.map_kernel(double, dg.Out(np.float32, like=x), x).compute()
        np.testing.assert_array_equal(out, 2 * np.arange(1000, dtype=np.float32))


@pytest.mark.slow
@pytest.mark.gpu
def test_a_gpu_worker_offers_its_device_less_the_margin():
    from daskgpu._runtime import backends

    with dask.config.set({"daskgpu.simulate": False, "daskgpu.device-memory": None}), \
            dg.LocalGPUCluster(simulate=False, devices=[0], dashboard_address=None) as cluster, \
            Client(cluster) as client:
        total = client.run(dg.device_info)
        (facts,) = total.values()
        margin = dg._config.get("device-memory-margin")
        assert _resources(client)[GPU_MEMORY] == facts["total_memory"] - margin
    assert backends.GPU.memory()[1] == facts["total_memory"]


@dg.jit("void(float32[::1], float32[::1], int32)")
def slow_double(out, x, ms):
    # About ms milliseconds on the device whatever the chunk: tasks long enough to overlap.
    # One thread spins on dependent multiply-adds (cuda.nanosleep may return at once, and
    # were every block to wait, an 80M-element chunk would take minutes).
    i = cuda.grid(1)
    if i < out.size:
        v = x[i]
        if i == 0:
            half = v * np.float32(0.5)
            for _ in range(ms * 400_000):
                v = v * np.float32(0.5) + half  # stays x[0]: halving is exact
        out[i] = 2 * v


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_large_chunks_run_one_at_a_time_and_small_ones_four_at_a_time():
    # A 1 GiB offer; each large chunk needs 640 MB on the device (320 MB in, 320 MB out).
    with dask.config.set({"daskgpu.simulate": False, "daskgpu.device-memory": "1GiB"}), \
            dg.LocalGPUCluster(simulate=False, devices=[0], threads_per_worker=4,
                               dashboard_address=None) as cluster, \
            Client(cluster) as client:
        n = 80 * 2**20
        x = da.ones(4 * n, chunks=n, dtype=np.float32)
        big = dg.map_kernel(slow_double, dg.Out(np.float32, like=x), x, np.int32(300))
        # The launches persisted, so that they are tasks of their own: a reduction over
        # them (.sum()) fuses each launch into its sum task, under the sum's name.
        with get_task_stream(client) as ts:
            big = client.persist(big)
            wait(big)
        assert _launch_tasks(ts.data, "slow_double-") == 4
        assert _most_at_once(ts.data, "slow_double-") == 1
        assert big.sum().compute() == 2 * 4 * n
        small = da.ones(8 * 2**16, chunks=2**16, dtype=np.float32)  # 512 KB a chunk
        z = dg.map_kernel(slow_double, dg.Out(np.float32, like=small), small, np.int32(300))
        with get_task_stream(client) as ts:
            wait(client.persist(z))
        assert _launch_tasks(ts.data, "slow_double-") == 8
        assert _most_at_once(ts.data, "slow_double-") == 4


def test_a_margin_at_or_above_the_device_memory_is_refused_not_an_offer_of_nothing():
    from daskgpu._dask.placement import memory_offer

    # device-memory unset: this module's cluster sets it while it is open.
    with dask.config.set({"daskgpu.device-memory-margin": "2GiB",
                          "daskgpu.device-memory": None}):
        with pytest.raises(dg.ConfigError, match="device-memory-margin"):
            memory_offer(2**30, simulated=False)
