"""The documentation site builds without a warning and documents the whole public surface.

One build (``sphinx-build -W -b html``) serves every test here; the API reference,
the settings and the command line are generated from the code when it runs, so a
name added to ``daskgpu.__all__``, a setting or a subcommand shows up in the
site or fails a test below.
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import subprocess
import sys

import pytest

import daskgpu
from daskgpu import _config

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
         str(DOCS), str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-5000:]
    return out


def _ids(page: pathlib.Path) -> set:
    return {html.unescape(i) for i in re.findall(r'id="([^"]+)"', page.read_text())}


def test_the_site_builds_without_warnings(site):
    for page in ("index", "guide/index", "guide/map-kernel", "reference/api",
                 "reference/settings", "reference/cli", "developer/index"):
        assert (site / f"{page}.html").is_file(), page


def test_every_guide_page_is_built(site):
    for page in (DOCS / "guide").glob("*.md"):
        assert (site / "guide" / f"{page.stem}.html").is_file(), page.name


def _api_page(site, name) -> pathlib.Path:
    return site / "reference" / "api" / f"daskgpu.{name}.html"


@pytest.mark.parametrize("name", daskgpu.__all__)
def test_every_public_name_has_an_api_entry(site, name):
    assert f"daskgpu.{name}" in _ids(_api_page(site, name))
    listing = html.unescape((site / "reference" / "api.html").read_text())
    assert f'href="api/daskgpu.{name}.html#daskgpu.{name}"' in listing


def test_each_public_name_has_a_page_of_its_own(site):
    pages = {p.stem for p in (site / "reference" / "api").glob("daskgpu.*.html")}
    assert pages == {f"daskgpu.{name}" for name in daskgpu.__all__}
    for name in daskgpu.__all__:  # one entry a page, not the whole API on each
        others = {f"daskgpu.{n}" for n in daskgpu.__all__ if n != name}
        assert not others & _ids(_api_page(site, name)), name


def test_public_classes_document_their_methods(site):
    for name, entry in (("Kernel", "daskgpu.Kernel.specialize"),
                        ("Kernel", "daskgpu.Kernel.compile"),
                        ("PTXKernel", "daskgpu.PTXKernel.forall")):
        ids = _ids(_api_page(site, name))
        assert entry in ids or entry.replace("PTXKernel", "Launch") in ids, entry


def test_no_two_pages_share_a_title(site):
    # Search lists results by page title: two alike read as one page twice.
    index = (site / "searchindex.js").read_text()
    titles = json.loads(index[index.index("(") + 1:index.rindex(")")])["titles"]
    assert sorted(t for t in set(titles) if titles.count(t) > 1) == []


@pytest.mark.parametrize("key", list(_config.SETTINGS))
def test_every_setting_has_an_entry_with_its_documentation(site, key):
    page = (site / "reference" / "settings.html").read_text()
    anchor = f'id="setting-daskgpu.{key}"'
    assert anchor in page
    entry = page.partition(anchor)[2].partition('id="setting-daskgpu.')[0]
    env = "DASK_DASKGPU__" + key.upper().replace("-", "_")
    assert env in entry
    text = re.sub(r"<[^>]+>", "", entry)
    assert "See daskgpu/daskgpu.yaml" not in text, f"{key} has no comment in daskgpu.yaml"


def test_every_command_has_its_help(site):
    from daskgpu._cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli.html").read_text()))
    assert "usage: daskgpu [-h]" in page
    for name in sub.choices:
        assert f"usage: daskgpu {name}" in page, name
        assert f"daskgpu {name} --help" in page, name


def test_the_guide_links_to_the_references_that_resolve(site):
    page = (site / "guide" / "map-kernel.html").read_text()
    assert 'href="../reference/api/daskgpu.map_kernel.html#daskgpu.map_kernel"' in page
    assert 'href="../reference/settings.html#setting-daskgpu.fuse-chains"' in page


def test_the_picture_of_how_it_works_is_shipped(site):
    assert (site / "_images" / "how-it-works.svg").is_file()
    svg = (DOCS / "_static" / "how-it-works.svg").read_text()
    for step in ("compile once", "KernelImage", "pickled as plain data", "link per device",
                 "cached cubin"):
        assert step in svg


# -- what the guide and the README hold ------------------------------------------------------
TEXTS = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
HISTORY = [
    (r"[Ii]ssue #?\d+", "an internal issue number"),
    (r"\b20\d\d-\d\d-\d\d\b", "a dated measurement"),
    (r"\bH[12]00\b|\bA100\b", "a figure of one machine"),
    (r"\d(\.\d+)? ?(µs|ms)\b", "a per-instance timing"),
    (r"\bthis session\b", "session history"),
]


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_session_history_or_per_instance_figures(path):
    text = path.read_text()
    for pattern, what in HISTORY:
        found = re.search(pattern, text)
        assert found is None, f"{path.name} holds {what}: {found.group(0)!r}"


# -- in a real browser --------------------------------------------------------------------------
def _browser_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_in_browser",
                                                  DOCS / "check_in_browser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pages_render_in_headless_chromium(site, tmp_path):
    browser = _browser_script()
    chromium = browser.chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    for page in browser.PAGES:
        png = tmp_path / (page.replace("/", "-") + ".png")
        browser.screenshot(chromium, site / f"{page}.html", png)
        # A blank or unstyled page compresses to a few kilobytes; a rendered one does not.
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 30_000, (page, png.stat().st_size)
