"""The ``iterate`` section: a 2-D heat equation with ``dg.iterate`` against the one-device
loop, a loop of ``map_kernel`` steps and a Dask + CuPy ``map_overlap`` loop."""

import pytest

from daskgpu._cli.bench import command, device
from daskgpu._cli.bench.common import BenchCluster, BenchOptions, table


def test_iterate_is_a_section_of_a_quarter_of_the_run_size():
    assert command.SECTIONS["iterate"] is device.bench_iterate
    assert command.section_sizes("iterate", 1 << 30) == {"size_bytes": 256 << 20}


@pytest.mark.nogpu
def test_without_a_gpu_it_says_so_in_one_line(capsys):
    cluster = BenchCluster(BenchOptions(time_steps=4))  # never started: no GPU to bench
    assert device.bench_iterate(cluster, size_bytes=1 << 16) == []
    out = capsys.readouterr().out
    assert out.startswith("iterate: skipped, it needs a GPU") and out.count("\n") == 1
    assert not cluster.started


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_every_way_gives_the_one_device_result_and_a_cost_per_step():
    with BenchCluster(BenchOptions(time_steps=30)) as cluster:
        rows = device.bench_iterate(cluster, size_bytes=1 << 20, chunks=4, block_steps=8)
    assert rows[0]["what"].startswith("iterate, 2-D heat 512x512 float32, 4 host chunks")
    assert all(r["daskgpu"] > 0 and r["baseline"] > 0 for r in rows)
    assert "per step" in table(rows)
