"""Build the site and take screenshots of its pages in headless Chromium.

    python docs/check_in_browser.py [OUTDIR]

Builds the site (``sphinx-build -W -b html``) into ``OUTDIR/html`` (default: a new
temporary directory), opens the front page, two guide pages and the API reference
(its list and ``map_kernel``'s page) in headless Chromium (Debian's ``chromium``
package: ``apt-get install -y chromium``) and writes ``OUTDIR/<page>.png`` for
each, to be looked at as a reader would see them. Prints the screenshots' paths;
exits 2 when Chromium is missing. ``tests/docs/test_build.py`` runs it where
Chromium is installed.

:func:`chromium` and :data:`HEADLESS` also serve ``check_dashboard.py``, whose
pages draw only after they have loaded, so that it drives the browser itself.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

DOCS = pathlib.Path(__file__).resolve().parent
#: The pages to look at: the front page, guide pages (one with the picture), the API
#: reference's list and one name's page.
PAGES = ("index", "guide/how-it-works", "guide/map-kernel", "reference/api",
         "reference/api/daskgpu.map_kernel")
WINDOW = "1400,1000"
#: Chromium's options for a headless run that reaches out to nothing but the page.
HEADLESS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
            "--hide-scrollbars", f"--window-size={WINDOW}")


def chromium() -> str | None:
    """The Chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build(out: pathlib.Path) -> pathlib.Path:
    """The site built into ``out/html``; raises CalledProcessError on a warning."""
    html = out / "html"
    subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(DOCS),
                    str(html)], check=True)
    return html


def screenshot(browser: str, page: pathlib.Path, png: pathlib.Path) -> None:
    """Save what ``page`` shows in a ``WINDOW``-sized headless window to ``png``."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, *HEADLESS, f"--user-data-dir={profile}", f"--screenshot={png}",
             page.as_uri()],
            check=True, capture_output=True, timeout=120)
    if not png.is_file() or png.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot of {page}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    browser = chromium()
    if browser is None:
        print("check_in_browser: no chromium on PATH: apt-get install -y chromium",
              file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0]) if argv else pathlib.Path(tempfile.mkdtemp(prefix="docs-"))
    out.mkdir(parents=True, exist_ok=True)
    html = build(out)
    for page in PAGES:
        png = out / (page.replace("/", "-") + ".png")
        screenshot(browser, html / f"{page}.html", png)
        print(os.fspath(png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
