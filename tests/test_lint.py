"""The code passes the project's ruff configuration (pyproject.toml, ``[tool.ruff]``)."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ruff_is_clean():
    # ruff comes with the test extra: pip install -e ".[test]".
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "daskgpu", "tests", "deploy"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
