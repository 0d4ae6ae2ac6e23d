"""The small-chunks section: map_kernel over many small chunks, end to end, against map_blocks."""

import dask
import pytest

from daskgpu._cli.bench.common import BenchCluster, BenchOptions
from daskgpu._cli.bench.scale import bench_small_chunks


@pytest.mark.gpu  # the baseline launches a Numba dispatcher, which needs a GPU
@pytest.mark.slow
def test_on_a_gpu_the_section_measures_both_and_extrapolates_past_what_it_measured():
    with dask.config.set({"daskgpu.simulate": False}), \
            BenchCluster(BenchOptions(array_bytes=1 << 20)) as cluster:
        rows = bench_small_chunks(cluster, counts=(20, 40), measured=20, repeat=1)
    assert [r["what"] for r in rows] == [
        "map over 20 chunks of 256 float32, end to end",
        "map over 40 chunks of 256 float32, end to end",
        "map over 40 chunks of 256 float32, per chunk"]
    assert "extrapolated from 20 chunks" in rows[1]["baseline_name"]
    assert rows[1]["baseline"] == pytest.approx(2 * rows[0]["baseline"])
    assert all(r["ours"] > 0 for r in rows)
