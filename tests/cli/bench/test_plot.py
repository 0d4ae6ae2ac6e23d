import pytest

from daskgpu._cli.bench.command import main
from daskgpu._cli.bench.common import ratio
from daskgpu._cli.bench.plot import plot

pytest.importorskip("matplotlib")


def _rows():
    return [ratio("launch", [2e-6], [4e-6], "us", "numba", goal=0.3, scale=1e6),
            ratio("cold start", [0.7], [2.0], "s", "numba pickled dispatcher")]


def test_plot_draws_one_bar_per_row_into_the_named_file(tmp_path):
    import matplotlib.pyplot as plt

    path = tmp_path / "ratios.png"
    drawn = []
    original = plt.Axes.barh

    def barh(self, y, width, *args, **kwargs):
        drawn.append(list(width))
        return original(self, y, width, *args, **kwargs)

    plt.Axes.barh = barh
    try:
        plot(_rows(), str(path))
    finally:
        plt.Axes.barh = original
    assert drawn == [[0.5, 0.35]]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_option_writes_the_run_s_rows(tmp_path, monkeypatch):
    from daskgpu._cli.bench import command

    monkeypatch.setitem(command.SECTIONS, "fake", lambda: _rows())
    path = tmp_path / "run.svg"
    assert main(["fake", "--plot", str(path)]) == 0
    assert b"<svg" in path.read_bytes()[:500]
