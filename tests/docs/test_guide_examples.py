"""Every example of the user guide runs, page by page, as a reader would run it.

A page's fenced blocks run in the order they appear, in one fresh directory:

- ``python`` blocks run in one namespace per page, as a session pasted into
  Python (``__name__ == "__main__"``, so guarded script code runs too);
- a ``python`` block whose first line is ``# file: NAME`` is saved as ``NAME``
  instead (a module that later blocks and commands import);
- ``bash`` blocks run line by line as commands; ``pip install`` lines name extras
  that pyproject.toml defines (CI has run the install), and the address
  ``tcp://scheduler:8786`` is replaced by a running simulated cluster's, where
  ``daskgpu batch`` commands also run (the batch's own local cluster, which costs
  seconds to start, is tested in tests/dask/batch);
- a block or command marked ``needs a GPU`` runs only on a GPU machine (the
  ``gpu`` test below); without one, such a command must fail in a line or two,
  without a traceback;
- ``shell`` blocks are shown, not run: only the deploying page has them, for
  docker, SLURM and Kubernetes, whose recipes tests/deploy checks.

``dg.LocalGPUCluster`` runs its workers as threads of this process and simulated
(``processes=False, simulate=True``): the same cluster class and code path, at a
start cost of milliseconds, so that the whole guide runs in seconds.

A reader also saves a page's examples into one file and runs it as a script, in
worker processes that re-import it: ``test_guide_page_runs_as_a_script`` does
that, in a fresh directory, simulated as without a GPU, and the fast check
beside it that every cluster the guide starts sits under an ``if __name__ ==
"__main__":`` guard.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import pathlib
import re
import shlex
import sys
import textwrap

import pytest
from shown_commands import (
    NEEDS_GPU,
    SCHEDULER,
    check_outcome,
    has_gpu,
    on_a_simulated_cluster,
    run,
    shell_lines,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
# A fence may be indented, inside a list item; its code is then dedented.
FENCE = re.compile(r"^( *)```(\w+)[^\n]*\n(.*?)^\1```", re.DOTALL | re.MULTILINE)


def blocks(page: pathlib.Path) -> list:
    """The page's fenced blocks, as ``(language, code)`` in document order."""
    return [(lang, textwrap.dedent(code)) for _, lang, code in FENCE.findall(page.read_text())]


def guide_pages() -> list:
    """The guide's pages and the site's front page, which shows an example too."""
    return [GUIDE.parent / "index.md", *sorted(GUIDE.glob("*.md"))]


def pages() -> list:
    return [p for p in guide_pages() if any(lang in ("python", "bash") for lang, _ in blocks(p))]


def _page_id(page: pathlib.Path) -> str:
    return page.relative_to(ROOT / "docs").with_suffix("").as_posix()


def _extras() -> set:
    """The extras pyproject.toml defines (read by hand: tomllib is Python 3.11+)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.partition("[project.optional-dependencies]")[2].partition("\n[")[0]
    return set(re.findall(r"^([\w-]+) = \[", section, re.MULTILINE))


class _Scheduler:
    """A simulated cluster for the commands that join one, started on first use."""

    def __init__(self, stack):
        self._stack, self.address = stack, None

    def get(self):
        if self.address is None:
            import daskgpu as dg

            cluster = self._stack.enter_context(dg.LocalGPUCluster(
                simulate=True, processes=False, protocol="tcp://", dashboard_address=None))
            self.address = cluster.scheduler_address
        return self.address


def _run_command(argv, comment, cwd, scheduler):
    if argv[:2] == ["pip", "install"]:
        named = {m for a in argv for m in re.findall(r"\[([\w,-]+)\]", a)}
        missing = {e for group in named for e in group.split(",")} - _extras()
        assert not missing, f"{shlex.join(argv)}: no such extra {sorted(missing)}"
        if "&&" not in argv:
            return
        argv = argv[argv.index("&&") + 1:]
        if argv[:3] == ["python", "-m", "pytest"] or argv == ["daskgpu", "demo"]:
            return  # the README's two commands, which CI and tests/test_readme.py run
    if NEEDS_GPU in comment and has_gpu():
        return  # on a GPU the command would run for real: the GPU suite's tests do
    if argv[:2] == ["daskgpu", "batch"] and "--scheduler" not in argv:
        # The job's own local cluster costs 15 s here; tests/dask/batch covers it.
        argv = [*argv, "--scheduler", SCHEDULER]
    if SCHEDULER in argv:
        argv = on_a_simulated_cluster(argv, scheduler.get())
    check_outcome(argv, run(argv, cwd), comment)


@pytest.fixture
def threaded_clusters(monkeypatch):
    """``dg.LocalGPUCluster`` with threaded, simulated workers (see the module docstring)."""
    import daskgpu as dg
    from daskgpu._dask.cluster import LocalGPUCluster

    def threaded(*args, **kwargs):
        kwargs.setdefault("processes", False)
        kwargs.setdefault("simulate", True)
        return LocalGPUCluster(*args, **kwargs)

    monkeypatch.setattr(dg, "LocalGPUCluster", threaded)


@pytest.fixture
def dask_config():
    """Dask's settings as they were: a page may set them for its session."""
    import dask.config

    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


@pytest.mark.parametrize("page", pages(), ids=_page_id)
def test_guide_page_examples_run(page, tmp_path, monkeypatch, threaded_clusters, dask_config):
    import distributed

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    namespace = {"__name__": "__main__"}
    with contextlib.ExitStack() as stack:
        scheduler = _Scheduler(stack)
        for lang, code in blocks(page):
            if code.startswith(f"# {NEEDS_GPU}"):
                continue
            if lang == "python" and (m := re.match(r"# file: ([\w./-]+)\n", code)):
                (tmp_path / m.group(1)).write_text(code)
            elif lang == "python":
                exec(compile(code, f"{page.name} example", "exec"), namespace)
            elif lang == "bash":
                for argv, comment in shell_lines(code):
                    _run_command(argv, comment, tmp_path, scheduler)
        for value in namespace.values():  # what a page left open, as a session's end would
            if isinstance(value, distributed.Client | distributed.deploy.Cluster):
                value.close()
    for name in set(sys.modules) - before:  # the page's own modules (kernels.py)
        if getattr(sys.modules[name], "__file__", "") and \
                str(tmp_path) in str(sys.modules[name].__file__):
            del sys.modules[name]


def gpu_examples() -> list:
    return [(page.stem, code) for page in guide_pages()
            for lang, code in blocks(page) if lang == "python"
            and code.startswith(f"# {NEEDS_GPU}")]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("page,code", gpu_examples(),
                         ids=[f"{p}-{i}" for i, (p, _) in enumerate(gpu_examples())])
def test_guide_gpu_example_runs_as_a_script(page, code, tmp_path):
    (tmp_path / "example.py").write_text(code)
    proc = run(["python", "example.py"], tmp_path, timeout=600)
    missing = re.search(r"No module named '(cupy|dask_cuda)'", proc.stderr)
    if proc.returncode != 0 and missing:
        pytest.skip(f"needs {missing.group(1)}")
    assert proc.returncode == 0, proc.stderr[-3000:]


# -- each page as a script ----------------------------------------------------------------------
FILE = re.compile(r"# file: ([\w./-]+)\n")
#: What starts a cluster: under a guard in a script, or each worker process starts one too.
CLUSTERS = ("LocalGPUCluster", "LocalCluster", "LocalCUDACluster")


def as_script(page: pathlib.Path) -> tuple:
    """``(script, files)``: the page's ``python`` blocks as a reader saves them.

    The blocks joined in page order make the script; a block whose first line is
    ``# file: NAME`` is the file ``NAME`` instead; a block that needs a GPU is a
    script of its own (``test_guide_gpu_example_runs_as_a_script``).
    """
    parts, files = [], {}
    for lang, code in blocks(page):
        if lang != "python" or code.startswith(f"# {NEEDS_GPU}"):
            continue
        if m := FILE.match(code):
            files[m.group(1)] = code
        else:
            parts.append(code)
    return "\n\n".join(parts), files


def script_pages() -> list:
    return [p for p in guide_pages() if as_script(p)[0]]


def _is_main_guard(node) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "__name__ == '__main__'", "'__main__' == __name__")


def _unguarded_clusters(tree) -> list:
    """The cluster calls of a module not inside an ``if __name__ == "__main__":``."""
    found = []

    def visit(node, guarded):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).rpartition(".")[2]
            if name in CLUSTERS and not guarded:
                found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            # A function's body runs only when called: what calls it is checked.
            inner = guarded or _is_main_guard(node) or isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner)

    visit(tree, False)
    return found


@pytest.mark.parametrize("page", script_pages(), ids=_page_id)
def test_every_cluster_a_page_starts_is_guarded(page):
    script, files = as_script(page)
    for name, code in [(f"{page.stem}.py", script), *files.items()]:
        assert not _unguarded_clusters(ast.parse(code)), (
            f"{page.name}, saved as {name}, starts a cluster outside an "
            f"`if __name__ == \"__main__\":` guard: {_unguarded_clusters(ast.parse(code))}")


@pytest.mark.slow
@pytest.mark.parametrize("page", script_pages(), ids=_page_id)
def test_guide_page_runs_as_a_script(page, tmp_path):
    """The page saved as one script and run with ``python``, simulated, in a fresh
    directory: its clusters' workers are processes that re-import the script."""
    script, files = as_script(page)
    for name, code in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    (tmp_path / f"{page.stem}.py").write_text(script)
    proc = run(["DASK_DASKGPU__SIMULATE=1", "python", f"{page.stem}.py"], tmp_path,
               timeout=600)
    # A page that shows a task's error leaves the worker's log of it on stderr: the
    # script's exit status (a failed assert, an uncaught error) is what counts.
    assert proc.returncode == 0, f"{page.name} as a script:\n{proc.stderr[-4000:]}"


def test_only_the_deploying_page_shows_commands_it_does_not_run():
    shown = {p.stem for p in guide_pages() for lang, _ in blocks(p) if lang == "shell"}
    assert shown <= {"deploying"}


def test_the_guide_has_examples_on_every_page_that_teaches_code():
    stems = {p.stem for p in pages()}
    for stem in ("kernels", "submit", "map-kernel", "reductions", "kernel-files", "clusters",
                 "batch", "seeing-the-gpu"):
        assert stem in stems
