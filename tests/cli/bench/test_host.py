"""The map-host section without a GPU: the launches it times without Dask's tasks."""

import pytest
from distributed import Client

from daskgpu._cli.bench.common import host_inputs
from daskgpu._cli.bench.host import launches_without_dask
from daskgpu._dask.cluster import LocalGPUCluster


@pytest.mark.slow
def test_each_worker_launches_on_its_own_chunks_without_dask():
    with LocalGPUCluster(simulate=True, threads_per_worker=2, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        x, y = host_inputs(4 * 1024 * 4, 1024 * 4)  # 4 chunks of 1024 float32
        # The function checks the first launch's output (2 x + y) itself.
        done = client.run(launches_without_dask, x.name, y.name, 1)
    assert sum(count for _, count in done.values()) == x.npartitions
    assert all(seconds > 0 for seconds, count in done.values() if count)
