"""Dask's dashboard of a simulated LocalGPUCluster, as headless Chromium draws it.

One run of ``docs/check_dashboard.py`` (a simulated cluster, ``saxpy`` computed
as it is and ``square`` fused into a sum, then screenshots of the dashboard's
pages) serves every test here; they judge its screenshots, the Bokeh documents
the browser received and the workers' ``/metrics`` it saved. Dashboard pages
are drawn on canvases inside shadow roots, so the figures' words are read from
the page's Bokeh document, not from its HTML. Skipped without Chromium
(``apt-get install -y chromium``), bokeh or prometheus_client (the ``dashboard``
extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "check_dashboard.py"
#: Each page and the fewest colours its figures show: a blank capture shows one. The GPU
#: pages, empty when simulated, show a frame round their figure.
PAGES = {"status": 16, "fine-performance-metrics": 16,
         "fine-performance-metrics-by-kernel": 16, "gpu-memory": 2, "gpu-utilization": 2}
KERNELS, CHUNKS = ("saxpy", "square"), 4
#: Pixels at the top of the status page above its figures: the navigation bar.
NAVBAR = 50


def _chromium():
    spec = importlib.util.spec_from_file_location("check_in_browser",
                                                  ROOT / "docs" / "check_in_browser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.chromium()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    pytest.importorskip("bokeh")
    pytest.importorskip("prometheus_client")
    if _chromium() is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    out = tmp_path_factory.mktemp("dashboard")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, json.loads((out / "report.json").read_text())


def colours(png: pathlib.Path, top: int = 0) -> int:
    """How many colours the screenshot shows below its first ``top`` rows."""
    image = pytest.importorskip("PIL.Image").open(png).convert("RGB")
    figures = image.crop((0, top, *image.size))
    return len(figures.getcolors(maxcolors=figures.width * figures.height))


@pytest.mark.parametrize("page", PAGES)
def test_each_page_is_drawn_not_blank(shots, page):
    out, report = shots
    png = out / f"{page}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    top = NAVBAR if page == "status" else 0
    assert colours(png, top) >= PAGES[page], f"{page}: blank"
    assert report["pages"][page]["titles"], f"{page}: its Bokeh document has no figure"


def test_status_page_shows_the_task_stream(shots):
    titles = shots[1]["pages"]["status"]["titles"]
    assert "Task Stream" in titles and any(t.startswith("Progress") for t in titles), titles


def test_fine_metrics_page_shows_gpu_time_by_activity(shots):
    page = shots[1]["pages"]["fine-performance-metrics"]
    assert page["unit"] == "seconds"
    assert "Task execution, by activity" in page["titles"]
    assert "daskgpu kernel" in page["legend"], page["legend"]


def test_fine_metrics_in_kernel_seconds_name_each_kernel(shots):
    page = shots[1]["pages"]["fine-performance-metrics-by-kernel"]
    assert page["unit"] == "kernel-seconds"
    for kernel in KERNELS:  # square's launches ran inside the sum's tasks
        assert f"{kernel} kernel" in page["legend"], page["legend"]


def test_gpu_pages_are_empty_when_simulated(shots):
    pages = shots[1]["pages"]
    assert pages["gpu-memory"]["titles"] == ["GPU Memory: 0 B / 0 B"]
    assert pages["gpu-utilization"]["titles"] == ["GPU Utilization"]


def test_each_workers_metrics_count_its_launches(shots):
    from prometheus_client.parser import text_string_to_metric_families

    out, report = shots
    launches, seconds = {}, {}
    texts = sorted(out.glob("metrics-*.txt"))
    assert len(texts) == 2  # one a simulated worker
    for path in texts:
        samples = [s for f in text_string_to_metric_families(path.read_text())
                   for s in f.samples]
        assert {"daskgpu_launches_total", "daskgpu_gpu_seconds_total",
                "daskgpu_links_total"} <= {s.name for s in samples}, path.name
        for s in samples:
            if s.name == "daskgpu_launches_total":
                launches[s.labels["kernel"]] = launches.get(s.labels["kernel"], 0) + s.value
            if s.name == "daskgpu_gpu_seconds_total":
                assert s.labels["activity"] == "kernel"  # the simulator has no copies
                seconds[s.labels["kernel"]] = seconds.get(s.labels["kernel"], 0) + s.value
    assert launches == dict.fromkeys(KERNELS, CHUNKS)
    # The dashboard's figures are the workers' own: the same seconds reached the scheduler.
    for kernel in KERNELS:
        shown = report["gpu_time"][f"{kernel} kernel (kernel-seconds)"]
        assert shown == pytest.approx(seconds[kernel], rel=1e-6)


def test_cluster_links_its_dashboard_as_local_cluster_does(shots):
    cluster = shots[1]["cluster"]
    assert cluster["repr"].startswith("LocalGPUCluster(")
    assert cluster["dashboard_link"].startswith("http://127.0.0.1:")
    assert cluster["dashboard_link"].endswith("/status")
    assert cluster["html_repr_links_dashboard"]
