"""The README as a visitor follows it: the tour saved as a script, the two commands.

Python blocks are saved as files and run with ``python FILE`` (not ``python -c``),
so a script that starts a cluster without an ``if __name__ == "__main__":`` guard
fails here as it would for a user. A block whose first line is ``# NAME.py`` is
saved under that name; one whose first line says ``# needs a GPU`` runs only where
there is one. The shell blocks then run line by line in the same directory, on the
no-GPU default; a line whose comment says ``needs a GPU`` must fail there in a line
or two, without a traceback. The rest of what the README once taught lives in the
user guide (docs/guide), whose examples and commands tests/docs runs.
"""

from __future__ import annotations

import contextlib
import pathlib
import re

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

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```(python|bash)\n(.*?)```", TEXT, re.DOTALL)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SCRIPTS = [
    (m.group(1) if (m := re.match(r"# (\w+\.py)\n", code)) else f"snippet{i}.py", code)
    for i, code in enumerate(PYTHON)
]
# A running scheduler the README's commands name; the test substitutes its own.


def _commands() -> list:
    """The README's shell lines, continuations joined, as ``(argv, comment)``."""
    lines = []
    for lang, code in BLOCKS:
        if lang == "bash":
            lines += code.replace("\\\n", " ").splitlines()
    out = []
    for argv, comment in shell_lines("\n".join(lines)):
        if "&&" in argv:  # pip install ... && COMMAND: the install is what CI does
            argv = argv[argv.index("&&") + 1:]
        if argv[:3] == ["python", "-m", "pytest"]:  # the suite this test is part of
            continue
        out.append((argv, comment))
    return out


def test_readme_has_the_tour_and_the_two_commands():
    assert len(PYTHON) >= 1 and any("dg.map_kernel(" in code for code in PYTHON)
    installs = re.findall(r"^pip install (.*?) && (.*?)  #", TEXT, re.MULTILINE)
    assert [cmd.strip() for _, cmd in installs] == ["daskgpu demo", "python -m pytest -q"]


def test_readme_fits_on_a_few_screens():
    assert len(TEXT.splitlines()) <= 160


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", TEXT)
    local = [link for link in links if "://" not in link and ("/" in link or link.endswith(".md"))]
    assert any(link.startswith("docs/guide/") for link in local)
    for link in local:
        assert (README.parent / link).exists(), link


@pytest.mark.slow
@pytest.mark.parametrize("name,code", SCRIPTS, ids=[n for n, _ in SCRIPTS])
def test_readme_snippet_runs_as_a_script(name, code, tmp_path):
    if code.startswith(f"# {NEEDS_GPU}") and not has_gpu():
        pytest.skip(code.splitlines()[0][2:])
    (tmp_path / name).write_text(code)
    proc = run(["python", name], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_cluster_script_needs_the_guard_the_readme_shows():
    tour = next(code for _, code in SCRIPTS if "LocalGPUCluster(" in code)
    assert 'if __name__ == "__main__":' in tour
    assert "__main__" in TEXT.partition(tour)[2][:1500]  # and the text says why


@pytest.mark.slow
@pytest.mark.nogpu
def test_readme_commands_run_without_a_gpu(tmp_path):
    import distributed

    import daskgpu as dg

    for name, code in SCRIPTS:
        (tmp_path / name).write_text(code)
    commands = _commands()
    assert commands  # the demo, at least
    with contextlib.ExitStack() as stack:
        if any(SCHEDULER in argv for argv, _ in commands):
            cluster = stack.enter_context(dg.LocalGPUCluster(simulate=True,
                                                             dashboard_address=None))
            stack.enter_context(distributed.Client(cluster))
        for argv, comment in commands:
            if SCHEDULER in argv and NEEDS_GPU not in comment:
                argv = on_a_simulated_cluster(argv, cluster.scheduler_address)
            check_outcome(argv, run(argv, tmp_path), comment)


def test_readme_commands_are_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = re.search(r"^(pip install .*pytest -q)", TEXT, re.MULTILINE)
    assert test_command is not None
    assert test_command.group(1).split("#")[0].strip() in ci
