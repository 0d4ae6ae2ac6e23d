"""Screenshots of Dask's dashboard for a simulated LocalGPUCluster, in headless Chromium.

    python docs/check_dashboard.py [OUTDIR]

Starts a simulated :class:`daskgpu.LocalGPUCluster` with its dashboard on a free
loopback port, maps two kernels over a dask array (``saxpy`` computed as it is,
``square`` fused into a ``.sum()``), waits for their GPU time to reach the
scheduler, and writes into ``OUTDIR`` (default: a new temporary directory):

- ``<page>.png`` for each of :data:`PAGES`, as a 1400x1000 window shows it;
- ``metrics-<worker>.txt``: each worker's Prometheus endpoint, ``/metrics``;
- ``report.json``: what each page's Bokeh document holds (figure titles, legend
  labels, categories, the unit selected), daskgpu's launches and GPU seconds by
  kernel from the workers' ``/metrics``, the scheduler's GPU time by label, the
  cluster's repr and dashboard link, and the problems found.

Prints what it found; exits 1 naming what a page or endpoint misses (a drawn
figure, ``daskgpu kernel`` in the legend, each kernel in the ``kernel-seconds``
view, one launch a chunk at ``/metrics``, the scheduler's kernel-seconds equal
to the workers' own count, the dashboard link in the cluster's HTML repr), 2 when
Chromium, bokeh or prometheus_client is missing.
``tests/docs/test_dashboard_in_browser.py`` runs it.

Why not ``chromium --screenshot``, as ``check_in_browser.py`` does: every
dashboard page is a Bokeh server app. Its HTML loads bokeh's JavaScript from
the dashboard itself (``/static/js``, no CDN) and holds an empty root; the
figures arrive over a websocket after the page's load event, which is when
``--screenshot`` captures, so the capture is blank, and
``--virtual-time-budget`` does not wait for a websocket either. This script
drives Chromium through its DevTools protocol (``--remote-debugging-pipe``)
and captures once the document has arrived and been drawn.
"""

from __future__ import annotations

import base64
import fcntl
import json
import math
import os
import pathlib
import select
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import dask.array as da
import numpy as np
from check_in_browser import HEADLESS, WINDOW, chromium
from distributed import Client
from numba import cuda

import daskgpu as dg

#: Screenshot name -> (dashboard path, fine performance metrics unit to select).
PAGES = {
    "status": ("status", None),
    "fine-performance-metrics": ("individual-fine-performance-metrics", None),
    "fine-performance-metrics-by-kernel": ("individual-fine-performance-metrics",
                                           "kernel-seconds"),
    "gpu-memory": ("individual-gpu-memory", None),
    "gpu-utilization": ("individual-gpu-utilization", None),
}
KERNELS = ("saxpy", "square")
CHUNKS = 4
#: Seconds to wait for a page's figures, and for the metrics to reach the scheduler.
PATIENCE = 20.0
#: Seconds a drawn page is given for its first periodic update before the capture.
SETTLE = 1.0


@dg.jit
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@dg.jit
def square(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * x[i]


# -- the browser --------------------------------------------------------------------------------
#: True once the page's Bokeh document has come over the websocket and been drawn.
DRAWN = ("typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0"
         " && Bokeh.documents[0].roots().length > 0 && Bokeh.documents[0].is_idle")
#: What the page's document holds: what a person reads off its figures and widgets.
CONTENTS = """(() => {
  const models = Array.from(Bokeh.documents[0].all_models);
  const of = type => models.filter(m => m.type === type);
  return {
    titles: of("Title").map(m => m.text).filter(t => t),
    legend: of("Legend").flatMap(m => m.items).map(i => i.label && i.label.value)
      .filter(l => l),
    factors: of("FactorRange").flatMap(m => m.factors.map(String)),
    unit: of("Select").filter(m => m.title === "Unit selection").map(m => m.value)[0] || null,
  };
})()"""
#: Picks a unit in the fine performance metrics page's selector, as a click would.
SELECT_UNIT = """(unit => {
  const select = Array.from(Bokeh.documents[0].all_models)
    .find(m => m.type === "Select" && m.title === "Unit selection");
  select.value = unit;
  return select.value;
})(%s)"""


class DevTools:
    """One headless Chromium tab, driven through the DevTools protocol over a pipe.

    With ``--remote-debugging-pipe`` Chromium reads commands, JSON ending in a
    NUL byte, on its file descriptor 3 and answers on 4.
    """

    def __init__(self, browser: str):
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        commands, self._commands = os.pipe()
        self._answers, answers = os.pipe()
        # bash puts Chromium's ends at 3 and 4; above 9 here, they cannot be 3 or 4 yet.
        commands, answers = _above_9(commands), _above_9(answers)
        redirect = f'exec "$@" 3<&{commands} 4>&{answers} {commands}<&- {answers}>&-'
        self._process = subprocess.Popen(
            ["bash", "-c", redirect, "bash", browser, *HEADLESS, "--remote-debugging-pipe",
             f"--user-data-dir={self._profile.name}", "about:blank"],
            pass_fds=(commands, answers), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(commands)
        os.close(answers)
        self._buffer, self._id, self._session = b"", 0, None

    def send(self, method: str, timeout: float = 30.0, **params) -> dict:
        """The result of one command; to the tab once one is open."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:  # events and other answers go by
            answer = self._message(method, deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"chromium: {method} failed: {answer['error']}")
                return answer["result"]

    def _message(self, method: str, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._answers], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer {method} in time")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited (status {self._process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def open(self, url: str) -> None:
        """Go to ``url`` in the tab, which is opened first, ``WINDOW`` in size."""
        if self._session is None:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.send("Target.attachToTarget", targetId=target,
                                      flatten=True)["sessionId"]
            width, height = (int(n) for n in WINDOW.split(","))
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (None while it throws)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return None if "exceptionDetails" in result else result["result"].get("value")

    def wait(self, expression: str, timeout: float = PATIENCE):
        """The expression's first truthy value within ``timeout`` seconds, else None."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def screenshot(self, png: pathlib.Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        png.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
            self._process.wait(timeout=10)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        finally:
            os.close(self._commands)
            os.close(self._answers)
            self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _above_9(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


# -- the cluster --------------------------------------------------------------------------------
def run_kernels(client) -> None:
    """``saxpy`` computed as it is, ``square`` fused into a sum, each one launch a chunk."""
    x = da.arange(4_000, dtype=np.float32, chunks=4_000 // CHUNKS)
    # One launch a chunk (group=False), so that /metrics counts one per chunk.
    y = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x, group=False)
    assert np.array_equal(y.compute(), 3 * np.arange(4_000, dtype=np.float32))
    total = dg.map_kernel(square, dg.Out(np.float32, like=x), x, group=False).sum()
    assert np.isclose(total.compute(), (np.arange(4_000, dtype=np.float64) ** 2).sum())


def _gpu_time(dask_scheduler) -> dict:
    """The scheduler's GPU time, ``{"<label> (<unit>)": seconds}``, over every task."""
    totals = {}
    for key, value in dask_scheduler.cumulative_worker_metrics.items():
        if key[0] == "execute" and (key[-1] == "kernel-seconds" or (
                key[-1] == "seconds" and str(key[2]).startswith("daskgpu "))):
            name = f"{key[2]} ({key[-1]})"
            totals[name] = totals.get(name, 0.0) + value
    return totals


def worker_metrics(client) -> dict:
    """Each worker's ``/metrics`` text, by worker name."""
    texts = {}
    for address, info in client.scheduler_info()["workers"].items():
        host = urllib.parse.urlsplit(address).hostname
        url = f"http://{host}:{info['services']['dashboard']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            texts[str(info["name"])] = answer.read().decode()
    return texts


def counters(texts) -> dict:
    """daskgpu's counters summed over the workers' ``/metrics``: launches and GPU
    seconds by kernel."""
    from prometheus_client.parser import text_string_to_metric_families

    launches, seconds = {}, {}
    for text in texts.values():
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                kernel = sample.labels.get("kernel")
                if sample.name == "daskgpu_launches_total":
                    launches[kernel] = launches.get(kernel, 0) + sample.value
                elif sample.name == "daskgpu_gpu_seconds_total":
                    seconds[kernel] = seconds.get(kernel, 0.0) + sample.value
    return {"launches": launches, "seconds": seconds}


def wait_for_gpu_time(client, seconds: dict) -> dict:
    """The scheduler's GPU time, once its ``kernel-seconds`` agree with ``seconds`` by
    kernel (the workers' own count), or after :data:`PATIENCE`; it comes with heartbeats."""
    deadline = time.monotonic() + PATIENCE
    while True:
        totals = client.run_on_scheduler(_gpu_time)
        if all(math.isclose(totals.get(f"{kernel} kernel (kernel-seconds)", 0.0), value,
                            rel_tol=1e-6) for kernel, value in seconds.items()) \
                or time.monotonic() > deadline:
            return totals
        time.sleep(0.25)


# -- the check ----------------------------------------------------------------------------------
def check(out: pathlib.Path, browser: str) -> dict:
    """Run the kernels, write the screenshots and ``report.json`` into ``out``; the report."""
    report = {"problems": []}
    with dg.LocalGPUCluster(simulate=True, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client, DevTools(browser) as tab:
        link = cluster.dashboard_link
        report["cluster"] = {"repr": repr(cluster), "dashboard_link": link,
                             "html_repr_links_dashboard": link in cluster._repr_html_()}
        # The status page's task stream shows only tasks that run while it is open.
        tab.open(link)
        tab.wait(DRAWN)
        run_kernels(client)
        texts = worker_metrics(client)
        for name, text in texts.items():
            (out / f"metrics-{name}.txt").write_text(text)
        report["metrics"] = counters(texts)
        report["gpu_time"] = wait_for_gpu_time(client, report["metrics"]["seconds"])
        report["pages"] = {}
        for name, (path, unit) in PAGES.items():
            if path != "status":  # open already
                tab.open(f"{link.rpartition('/status')[0]}/{path}")
            report["pages"][name] = _look(tab, unit, out / f"{name}.png")
    report["problems"] = problems(report)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return report


def problems(report: dict) -> list:
    """What the dashboard, the figures or the cluster miss, one line each."""
    found = [f"{name}: {p}" for name, page in report["pages"].items()
             for p in page.pop("problems", ())]
    if not report["cluster"]["html_repr_links_dashboard"]:
        found.append("the cluster's HTML repr has no link to its dashboard")
    launches = report["metrics"]["launches"]
    if {k: launches.get(k) for k in KERNELS} != dict.fromkeys(KERNELS, CHUNKS):
        found.append(f"/metrics counts launches {launches}, not {CHUNKS} of each of "
                     f"{list(KERNELS)} (one a chunk)")
    seconds, gpu_time = report["metrics"]["seconds"], report["gpu_time"]
    for kernel in KERNELS:
        shown = gpu_time.get(f"{kernel} kernel (kernel-seconds)", 0.0)
        if not math.isclose(shown, seconds.get(kernel, 0.0), rel_tol=1e-6):
            found.append(f"the scheduler has {shown} kernel-seconds of {kernel}, its "
                         f"workers' /metrics {seconds.get(kernel)}")
    legends = {"fine-performance-metrics": ["daskgpu kernel"],
               "fine-performance-metrics-by-kernel": [f"{k} kernel" for k in KERNELS]}
    for name, labels in legends.items():
        missing = sorted(set(labels) - set(report["pages"][name].get("legend", ())))
        if missing:
            found.append(f"{name}: its legend misses {missing}")
    return found


def _look(tab: DevTools, unit, png: pathlib.Path) -> dict:
    """Screenshot the tab's page once drawn, after picking ``unit``; what it holds."""
    page = {"png": os.fspath(png), "problems": []}
    if not tab.wait(DRAWN):
        page["problems"].append(f"no Bokeh document drawn in {PATIENCE:g} s")
    elif unit is not None:
        tab.evaluate(SELECT_UNIT % json.dumps(unit))
        if not tab.wait(f"{CONTENTS}.unit === {json.dumps(unit)} && {DRAWN}"):
            page["problems"].append(f"the unit selector did not take {unit!r}")
    time.sleep(SETTLE)
    page.update(tab.evaluate(f"({DRAWN}) && {CONTENTS}") or {})
    page["url"] = tab.evaluate("location.href")
    tab.screenshot(png)
    return page


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    browser = chromium()
    missing = [name for name in ("bokeh", "prometheus_client") if not _importable(name)]
    if browser is None or missing:
        print("check_dashboard: " + ("no chromium on PATH: apt-get install -y chromium"
                                     if browser is None else
                                     f"{' and '.join(missing)} missing: "
                                     'pip install "daskgpu[dashboard]"'), file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0]) if argv else pathlib.Path(tempfile.mkdtemp(prefix="dashboard-"))
    out.mkdir(parents=True, exist_ok=True)
    report = check(out, browser)
    print(report["cluster"]["repr"], report["cluster"]["dashboard_link"])
    print(f"/metrics: {report['metrics']}")
    print(f"scheduler: {report['gpu_time']}")
    for page in report["pages"].values():
        print(f"{page['png']}: titles {page.get('titles')}; legend {page.get('legend')}"
              + (f"; unit {page['unit']}" if page.get("unit") else ""))
    for problem in report["problems"]:
        print(f"check_dashboard: {problem}", file=sys.stderr)
    return 1 if report["problems"] else 0


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
