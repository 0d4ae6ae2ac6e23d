"""The "Seeing the GPU" page says what its examples do: the launches its sample output
counts, a dashboard a reader can open, and Dask's progress bars on a map."""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap

import dask.array as da
import numpy as np
from numba import cuda

import daskgpu as dg

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "seeing-the-gpu.md"
# As tests/docs/test_guide_examples.py reads a page's fenced blocks.
FENCE = re.compile(r"^( *)```(\w+)[^\n]*\n(.*?)^\1```", re.DOTALL | re.MULTILINE)


def blocks(page: pathlib.Path) -> list:
    return [(lang, textwrap.dedent(code)) for _, lang, code in FENCE.findall(page.read_text())]


def guide_pages() -> list:
    return [ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


@dg.jit
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def test_the_sample_output_counts_the_launches_the_example_map_makes():
    # The page's map, as its Prometheus example builds it: the sample showed two launches
    # a worker where a grouped map makes one in all.
    x = da.ones(4_000, dtype=np.float32, chunks=1_000)
    z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
    samples = [float(n) for n in re.findall(r'^daskgpu_launches_total\{kernel="saxpy"\} (\S+)$',
                                            PAGE.read_text(), re.MULTILINE)]
    assert samples == [float(z.npartitions)]


def _cluster_calls(code):
    return [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("LocalGPUCluster")]


def test_some_example_shows_the_dashboard_the_guide_describes():
    # Every example passed dashboard_address=None: no reader ever saw the dashboard.
    shown = []
    for page in guide_pages():
        for lang, code in blocks(page):
            if lang != "python":
                continue
            for call in _cluster_calls(code):
                given = {k.arg: ast.unparse(k.value) for k in call.keywords}
                if given.get("dashboard_address") != "None":
                    shown.append(page.name)
    assert "seeing-the-gpu.md" in shown
    text = PAGE.read_text()
    assert "cluster.dashboard_link" in text


def test_the_page_says_dask_s_progress_bars_work_with_maps():
    text = PAGE.read_text()
    code = "\n".join(c for lang, c in blocks(PAGE) if lang == "python")
    for name in ("ProgressBar", "progress("):
        assert name in code
    assert "dask.diagnostics.ProgressBar" in text and "distributed.progress" in text
