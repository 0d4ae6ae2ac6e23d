"""The batch section: daskgpu batch over a store of many small chunks, grouped against one
task a chunk."""

import dask
import pytest

from daskgpu._cli.bench.common import BenchCluster, BenchOptions
from daskgpu._cli.bench.scale import bench_batch


@pytest.mark.slow
@pytest.mark.parametrize("simulate", [True, pytest.param(False, marks=pytest.mark.gpu)],
                         ids=["simulated", "gpu"])
def test_the_section_runs_both_and_scales_what_it_measured_on_fewer_chunks(simulate, tmp_path):
    with dask.config.set({"daskgpu.simulate": simulate}), \
            BenchCluster(BenchOptions(array_bytes=1 << 20)) as cluster:
        rows = bench_batch(cluster, count=40, measured=20, chunk_bytes=16, directory=tmp_path)
    (row,) = rows
    assert row["what"] == "batch over 40 zarr chunks of 16 B, grouped"
    assert row["goal"] == 0.2
    assert "one task a chunk (group=False)" in row["baseline_name"]
    assert "measured over 20 chunks and scaled to 40" in row["baseline_name"]
    assert row["daskgpu"] > 0 and row["baseline"] > 0
    assert list(tmp_path.iterdir()) == []  # the store and the outputs are removed


def test_without_room_on_its_disk_the_section_says_so_and_writes_nothing(tmp_path, capsys):
    with BenchCluster(BenchOptions(array_bytes=1 << 20)) as cluster:
        # 2**40 chunks of 64 KiB: far more than any disk holds.
        assert bench_batch(cluster, count=1 << 40, directory=tmp_path) == []
        assert not cluster.started  # nothing started for it
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"batch: skipped, it writes up to 128.00 PiB under {tmp_path} and ")
    assert line.endswith("free there; point TMPDIR at a larger disk")
    assert list(tmp_path.iterdir()) == []
