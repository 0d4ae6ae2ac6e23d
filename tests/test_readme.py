"""Every Python block of the README runs (simulated here, on a GPU there)."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index):
    # `python -c`, so that spawned worker processes do not re-run the block.
    proc = subprocess.run([sys.executable, "-c", BLOCKS[index]], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_commands_are_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = re.search(r"^(pip install .*pytest -q)", README.read_text(), re.MULTILINE)
    assert test_command is not None
    assert test_command.group(1).split("#")[0].strip() in ci
