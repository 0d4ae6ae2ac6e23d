"""Launches share a GPU by its memory: each asks what its chunk needs on the device, of
the GPU-memory its worker offers, so launches running at once never ask for more."""

import re
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, get_task_stream, wait
from kit.kernels import double, uniform
from numba import cuda

import daskgpu as dg
from daskgpu._dask.launch_core.resources import GPU_MEMORY

OFFER = 64 * 1024  # a simulated device of 64 KiB


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


def _asked(client, keys) -> dict:
    """The GPU-memory each of ``keys`` asks of the scheduler."""
    def asked(dask_scheduler, keys=tuple(keys)):
        return {k: (dask_scheduler.tasks[k].resource_restrictions or {}).get(GPU_MEMORY)
                for k in keys}

    return client.run_on_scheduler(asked)


def _slowly(chunk):
    time.sleep(2)
    return chunk


def _made_late(n):
    time.sleep(1)  # not computed yet when the launches that read it are submitted
    return np.arange(n, dtype=np.float32)


def test_a_launch_reading_a_future_not_yet_computed_asks_for_it_once_known(client):
    # Two launches of 48 KB each (a 24 KB output, and a 24 KB future that is pending at
    # submit): together more than the device's 64 KiB, so they never run at once.
    n = 6000
    with get_task_stream(client) as ts:
        pending = client.submit(_made_late, n, pure=False)
        launches = [client.submit(double.forall(n), np.zeros(n, np.float32), pending,
                                  pure=False) for _ in range(2)]
        for future in launches:
            np.testing.assert_array_equal(future.result(timeout=120),
                                          2 * np.arange(n, dtype=np.float32))
    assert _asked(client, [f.key for f in launches]) == {f.key: 8 * n for f in launches}
    assert _launch_tasks(ts.data, "double-") == 2
    assert _most_at_once(ts.data) == 1


def test_a_launch_whose_input_is_made_within_its_fused_task_asks_as_for_a_pending_one(client):
    # Dask's low-level fusion of delayed puts the input's task inside the launch's: its
    # size is not known until it runs, as for a future not yet computed, so the launch
    # asks for the largest offer (it runs alone), never for its output's bytes alone.
    n = 1000
    with dask.config.set({"optimization.fuse.delayed": True}):
        made = dask.delayed(_made_late)(n, dask_key_name=f"made-{time.monotonic_ns()}")
        launch = dask.delayed(double.forall(n), pure=False)(np.zeros(n, np.float32), made)
        graph = dict(launch.__dask_optimize__(launch.__dask_graph__(), launch.__dask_keys__()))
        assert made.key not in graph  # fused
        future = client.compute(launch)
        np.testing.assert_array_equal(future.result(timeout=60),
                                      2 * np.arange(n, dtype=np.float32))
    (fused,) = [k for k in graph if k != launch.key]
    assert _asked(client, [fused]) == {fused: OFFER}


def test_random_states_are_counted_16_bytes_an_element(client):
    x = da.zeros(4000, chunks=1000, dtype=np.float32)
    z = dg.map_kernel(uniform, dg.Out(np.float32, like=x), dg.random_states(7)).persist()
    wait(z)
    keys = [k for k in client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.tasks)) if "uniform-" in str(k)]
    assert keys and set(_asked(client, keys).values()) == {1000 * (4 + 16)}
    del z
    # A chunk whose states take the device past its offer is refused when the graph is built.
    big = da.zeros(8000, chunks=4000, dtype=np.float32)  # 16 KB out, 64 KB of states
    with pytest.raises(ValueError, match=r"^kernel 'uniform' needs 78.12 kiB of device memory"):
        dg.map_kernel(uniform, dg.Out(np.float32, like=big), dg.random_states(7))


def test_a_submitted_launch_counts_its_random_states(client):
    n = 1000
    future = client.submit(uniform.forall(n), np.zeros(n, np.float32),
                           dg.random_states(7, n), pure=False)
    assert future.result(timeout=60).shape == (n,)
    assert _asked(client, [future.key]) == {future.key: n * (4 + 16)}


def test_chained_maps_that_fit_only_apart_are_not_fused(client):
    # Each map needs 36 KB a chunk (4 bytes in, 4 out an element); fused into one task
    # both are on the device at once, 72 KB, more than the 64 KiB offer.
    x = da.arange(4500 * 2, chunks=4500, dtype=np.float32)
    y = dg.map_kernel(double, dg.Out(np.float32, like=x), x)
    z = dg.map_kernel(double, dg.Out(np.float32, like=y), y)
    got = client.compute(z).result(timeout=120)
    np.testing.assert_array_equal(got, 4 * np.arange(9000, dtype=np.float32))
    assert _in_graph(z, y)  # the first map's launches are tasks of their own

    # Maps that fit together are still fused: the first map's launches run in the second's.
    x = da.arange(1000 * 2, chunks=1000, dtype=np.float32)
    y = dg.map_kernel(double, dg.Out(np.float32, like=x), x)
    z = dg.map_kernel(double, dg.Out(np.float32, like=y), y)
    assert not _in_graph(z, y)
    np.testing.assert_array_equal(client.compute(z).result(timeout=120),
                                  4 * np.arange(2000, dtype=np.float32))


def _in_graph(result, earlier) -> bool:
    """Whether the tasks of the map ``earlier`` are in ``result``'s graph (not fused)."""
    return any(key[0] == earlier.name for key in dict(result.__dask_graph__()))


@pytest.mark.slow
def test_a_launch_no_worker_can_take_fails_after_the_timeout_naming_what_it_asks():
    # Two workers, one offering 64 KiB and one 16 KiB: a map of 36 KB chunks can run only
    # on the first. It leaves; the map's tasks wait for a worker that never comes, and
    # fail after daskgpu.no-worker-timeout, naming what they ask and what is offered.
    with dask.config.set({"daskgpu.device-memory": OFFER, "daskgpu.no-worker-timeout": 3}), \
            dg.LocalGPUCluster(simulate=True, processes=False, devices=[0, 1],
                               dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        large, small = sorted(client.scheduler_info(n_workers=-1)["workers"])

        async def offer_less(dask_worker):
            await dask_worker.set_resources(**{GPU_MEMORY: 16 * 1024})

        client.run(offer_less, workers=[small])
        x = da.arange(4500 * 4, chunks=4500, dtype=np.float32)  # 36 KB a chunk
        x = x.map_blocks(_slowly, dtype=x.dtype)  # the launches wait: "mid-compute"
        z = dg.map_kernel(double, dg.Out(np.float32, like=x), x)
        future = client.compute(z)
        time.sleep(0.5)
        client.retire_workers([large], close_workers=True)
        started = time.monotonic()
        with pytest.raises(Exception, match=r"^kernel 'double' \(task .*\) asks for "
                                            r"GPU=0.000976562, GPU-memory=35.16 kiB, and no worker "
                                            r"of the cluster offered that for 3 s "
                                            r"\(daskgpu.no-worker-timeout\): the workers offer "
                                            rf"{re.escape(small)}: GPU=1, GPU-memory=16.00 kiB; start"):
            future.result(timeout=60)
        assert time.monotonic() - started < 30


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
    from daskgpu._dask.launch_core.resources import memory_offer

    # device-memory unset: this module's cluster sets it while it is open.
    with dask.config.set({"daskgpu.device-memory-margin": "2GiB",
                          "daskgpu.device-memory": None}):
        with pytest.raises(dg.ConfigError, match="device-memory-margin"):
            memory_offer(2**30, simulated=False)
