"""The ``scale`` section: its graph rows need no GPU, no CuPy and no cluster."""

import sys

import dask
import pytest

from daskgpu._cli.bench import command, scale
from daskgpu._cli.bench.common import table

pytest.importorskip("distributed")


def test_scale_is_a_section_that_takes_no_size():
    assert command.SECTIONS["scale"] is scale.bench_scale
    assert command.section_sizes("scale", 1 << 30) == {}


def test_the_graph_rows_need_no_cupy_and_no_cluster(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # importing it would fail
    rows = scale.bench_scale(chunk_counts=(10, 300), memory_chunks=None, repeat=1)
    assert [r["what"].split(",")[0] for r in rows] == [
        "graph bytes per chunk", "build+optimize+pickle per chunk"] * 2
    assert "300 chunks" in rows[2]["what"]
    assert [r["unit"] for r in rows] == ["B", "us"] * 2
    for r in rows:
        assert r["baseline_name"] == scale.BASELINE and r["ratio"] > 0
    assert rows[2]["ratio"] <= 2  # bytes per chunk, near map_blocks'
    assert "graph bytes per chunk" in table(rows)


def test_the_memory_rows_compare_peak_memory_and_build_time_at_one_count(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert scale.MEMORY_CHUNKS == 20_000  # the default: what issue #38 measured
    rows = scale.bench_scale(chunk_counts=(), memory_chunks=300, repeat=2)
    peak, held, seconds = rows
    assert peak["what"] == "graph memory, 300 chunks (peak: build+optimize)"
    assert held["what"] == "graph memory, 300 chunks (held: optimized graph)"
    assert seconds["what"] == "graph build+optimize, 300 chunks"
    assert [r["unit"] for r in rows] == ["MiB", "MiB", "s"]
    assert [r["goal"] for r in rows] == [1.5] * 3
    assert len(peak["samples_daskgpu"]) == 1 and len(seconds["samples_daskgpu"]) == 2
    # Both graphs hold 300 tasks or more: well over a few KiB each, in MiB.
    for r in (peak, held):
        assert 0.01 < r["daskgpu"] < 100 and 0.01 < r["baseline"] < 100
    assert peak["daskgpu"] >= held["daskgpu"]
    assert seconds["daskgpu"] > 0 and seconds["baseline"] > 0
    assert "graph memory, 300 chunks" in table(rows)


def test_graph_memory_counts_what_building_the_graph_allocates():
    small = scale.graph_memory(scale.add, scale.ones(10))
    large = scale.graph_memory(scale.add, scale.ones(1_000))
    assert (small.chunks, large.chunks) == (10, 1_000)
    assert small.peak >= small.held > 0 and large.peak >= large.held
    # A hundred times the chunks: many times the memory (the tasks), and held
    # to the end (the optimized graph is counted while still alive).
    assert large.peak > 20 * small.peak and large.held > 20 * small.held


def test_a_graph_cost_counts_every_task_of_the_optimized_graph():
    x = scale.ones(5)
    ours, base = scale.graph_cost(scale.saxpy, x), scale.graph_cost(scale.add, x)
    assert (ours.chunks, ours.tasks) == (5, 10)  # ones, launches (each carrying the launch)
    assert (base.chunks, base.tasks) == (5, 10)
    assert ours.nbytes > base.nbytes > 0 and ours.seconds > 0


class InProcessCluster:
    """A stand-in for the run's BenchCluster: a client of simulated in-process workers."""

    def __init__(self, client):
        self.client = client

    def start(self):
        return self.client


@pytest.mark.slow
def test_the_compute_row_runs_on_the_run_cluster():
    from distributed import Client, LocalCluster

    # Simulated: a saxpy over 8 tiny chunks, against map_blocks, checked and timed.
    with dask.config.set({"daskgpu.simulate": True}), LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False,
            dashboard_address=None) as cluster, Client(cluster) as client:
        rows = scale.bench_scale(InProcessCluster(client), chunk_counts=(),
                                 memory_chunks=None, compute_chunks=8, repeat=1)
    (row,) = rows
    assert row["what"].startswith("client.compute per chunk, 8 chunks")
    assert row["unit"] == "us" and row["daskgpu"] > 0 and row["baseline"] > 0
