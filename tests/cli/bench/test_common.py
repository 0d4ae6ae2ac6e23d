"""What the sections share: the per-chunk baselines and the run's cluster."""

import pickle

import dask
import numpy as np
import pytest

import daskgpu as dg
from daskgpu._cli.bench.common import BenchCluster, BenchOptions, host_inputs, noop_chunk


def test_noop_chunk_travels_by_reference_and_returns_its_first_chunk():
    assert pickle.loads(pickle.dumps(noop_chunk)) is noop_chunk
    x = np.arange(3)
    assert noop_chunk(x, np.ones(3)) is x


@pytest.mark.slow
def test_the_bench_cluster_page_locks_what_the_chain_section_holds():
    # Two persisted 1 GiB outputs and a third map's: with the 2 GiB default the third
    # map's outputs would go through the copy threads, and the page-locked-input row
    # would measure them instead of the inputs.
    with dask.config.set({"daskgpu.simulate": True}):
        with BenchCluster(BenchOptions(array_bytes=1 << 30)) as cluster:
            seen = cluster.client.run(lambda: dg._config.get("pinned-output-bytes"))
    assert set(seen.values()) == {4 << 30}


@pytest.mark.slow
def test_closing_the_bench_cluster_loses_no_data_someone_still_wants(caplog):
    # The sections keep their persisted inputs to the end of the run: with the
    # workers gone first, the scheduler warned of lost tasks under every table.
    with dask.config.set({"daskgpu.simulate": True}):
        with caplog.at_level("WARNING", logger="distributed.scheduler"):
            with BenchCluster(BenchOptions(array_bytes=1 << 20)) as cluster:
                cluster.start()
                inputs = host_inputs(1 << 16, 1 << 14)
            assert all(a.npartitions == 4 for a in inputs)
    assert not [r for r in caplog.records if "lose already computed" in r.getMessage()]
