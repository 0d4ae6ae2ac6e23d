"""The examples and ``daskgpu demo``, run simulated at small sizes."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"daskgpu_example_{name}",
                                                  EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_saxpy_dask(cluster, capsys):
    z = load("saxpy_dask").main(n=1_000, cluster=cluster)
    assert z.shape == (1_000,) and z.dtype == np.float32
    assert "matches NumPy" in capsys.readouterr().out


def test_heat2d(cluster):
    heat2d = load("heat2d")
    u = heat2d.main(n=16, cluster=cluster, steps=3)
    np.testing.assert_allclose(u, heat2d.reference(heat2d.initial(16), 3, 0.2), rtol=1e-12)
    # Heat flows out of the hot square but none is created.
    assert u.max() < 100.0
    assert u.sum() == pytest.approx(heat2d.initial(16).sum(), rel=1e-12)  # not at the edge yet


def test_monte_carlo_pi(cluster, capsys):
    mc = load("monte_carlo_pi")
    estimate, hits = mc.main(streams=600, draws=4, cluster=cluster, chunks=250)
    np.testing.assert_array_equal(hits, mc.reference_hits(600, 4, 2024))
    assert abs(estimate - np.pi) < 0.2
    assert "matches Numba's own states" in capsys.readouterr().out
    # Numba's random streams, the same however they are chunked.
    _, hits_again = mc.main(streams=600, draws=4, cluster=cluster, chunks=(77, 500, 23))
    np.testing.assert_array_equal(hits_again, hits)


def test_batch_map(cluster):
    results = load("batch_map").main(n=100, cluster=cluster, batch=4)
    assert len(results) == 5
    assert all(isinstance(r, np.ndarray) for r in results)


def test_demo_run_on_a_given_cluster(cluster, capsys):
    from daskgpu._cli import demo as _demo

    summary = _demo.run(size=1_000, cluster=cluster)
    assert summary["ok"] and summary["simulated"]
    assert summary["max_abs_error"] == 0.0
    assert sorted(summary["placement"]) == list(range(len(summary["placement"])))
    assert set(summary["placement"].values()) <= set(summary["workers"])
    out = capsys.readouterr().out
    assert "saxpy over 1,000 float32 elements" in out and "OK" in out
    assert cluster.status.name == "running"  # a given cluster is left running


@pytest.mark.slow
def test_demo_main_starts_its_own_cluster(capsys):
    from daskgpu._cli import demo as _demo

    assert _demo.main(["--size", "1000", "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "(simulated)" in out and "OK" in out


def test_demo_refuses_a_contradictory_simulate(cluster):
    from daskgpu._cli import demo as _demo

    with pytest.raises(ValueError, match="leave simulate=None"):
        _demo.run(size=100, simulate=False, cluster=cluster)


def test_histogram(cluster, capsys):
    hist = load("histogram")
    counts = hist.main(n=3_000, cluster=cluster, chunks=700)
    assert counts.shape == (256,) and counts.dtype == np.int64
    assert "matches NumPy" in capsys.readouterr().out
    assert 2_990 < counts.sum() <= 3_000  # normal samples: hardly any beyond 4 sigma


def test_chunk_stats(cluster, capsys):
    table, overall = load("chunk_stats").main(n=2_000, cluster=cluster, chunks=300)
    assert table.shape == (7, 5)
    np.testing.assert_array_equal(table[:, 0], [300] * 6 + [200])
    assert overall[0] == 2_000
    assert table[:, 3].min() == overall[3] and table[:, 4].max() == overall[4]
    assert "(matches NumPy)" in capsys.readouterr().out


def test_xarray_apply(cluster, capsys):
    pytest.importorskip("xarray")
    hot, counts = load("xarray_apply").main(shape=(4, 5, 6), cluster=cluster)
    assert hot.dims == ("time", "lat", "lon") and hot.name == "t2m"
    assert counts.dims == ("bin",) and counts.sizes["bin"] == 64
    assert "matching NumPy" in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_each_example_guards_its_cluster_and_starts_no_dashboard(path):
    text = path.read_text()
    assert 'if __name__ == "__main__":' in text  # spawned workers re-import it
    for start in ("LocalGPUCluster(", "LocalCUDACluster("):
        for call in text.split(start)[1:]:
            assert "dashboard_address=None" in call.split("\n\n")[0], (path.name, call[:200])


@pytest.mark.slow
@pytest.mark.nogpu
def test_an_example_as_a_script_is_quiet_even_when_8787_is_taken():
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", 8787))
            taken.listen()
        except OSError:
            pass  # someone else holds it: the same case
        proc = subprocess.run([sys.executable, str(EXAMPLES / "saxpy_dask.py"), "-n", "400"],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "matches NumPy" in proc.stdout
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # the one simulated line
    assert "already in use" not in proc.stderr


def test_game_of_life(cluster, capsys):
    life = load("game_of_life")
    board = life.main(n=8, cluster=cluster, generations=3, block_steps=2)
    np.testing.assert_array_equal(board, life.reference(life.initial(8), 3))
    assert "matches NumPy" in capsys.readouterr().out
