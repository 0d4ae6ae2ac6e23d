"""``daskgpu bench``'s sections: their order, and what each is given."""

from daskgpu._cli.bench import command
from daskgpu._cli.bench.common import BenchCluster, BenchOptions


def test_sections_run_first_task_after_cold_and_keep_the_rest():
    names = list(command.SECTIONS)
    assert names[:2] == ["cold", "first-task"]
    assert {"launch", "submit", "map-host", "map-device", "chain", "compute",
            "scaling"} <= set(names)


def test_a_section_gets_the_run_cluster_only_if_it_takes_one(monkeypatch):
    seen = {}

    def on_cluster(cluster, size_bytes=0, chunk_bytes=64 << 20):
        seen["on_cluster"] = (cluster, size_bytes, chunk_bytes)
        return {"row": 1}

    def alone(repeat=3):
        seen["alone"] = repeat
        return [{"row": 2}, {"row": 3}]

    monkeypatch.setitem(command.SECTIONS, "map-host", on_cluster)
    monkeypatch.setitem(command.SECTIONS, "cold", alone)
    cluster = BenchCluster(BenchOptions(array_bytes=256 << 20))  # never started here
    assert command.run_section("map-host", cluster) == [{"row": 1}]
    assert command.run_section("cold", cluster) == [{"row": 2}, {"row": 3}]
    assert seen == {"on_cluster": (cluster, 256 << 20, 16 << 20), "alone": 3}
