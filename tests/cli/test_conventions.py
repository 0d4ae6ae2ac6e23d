"""The command line's conventions: every command described, units given, help
without reStructuredText, exit status 2 for every usage error, quiet output."""

import re
import subprocess
import sys

import pytest

from daskgpu._cli import main as cli
from daskgpu._cli.main import build_parser, main

COMMANDS = ["info", "worker", "demo", "compile", "inspect", "bench", "batch"]
RST = re.compile(r"``|:(func|class|mod|meth|attr|data):`")


def _help(capsys, *argv):
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_every_command_is_listed_with_a_description(capsys):
    root = _help(capsys)
    for name in COMMANDS:
        line = next(line for line in root.splitlines() if line.strip().startswith(name))
        assert len(line.split(None, 1)[1]) > 15, line
    assert "Exit status" in root and "2 for a usage error" in root


@pytest.mark.parametrize("name", COMMANDS)
def test_each_help_describes_the_command_without_markup(name, capsys):
    text = _help(capsys, name)
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith(f"usage: daskgpu {name}")
    description = rest.split("\n\n")[0]
    assert not description.startswith(("positional", "options")), text
    assert len(description.split()) >= 6, text
    assert not RST.search(text), text


@pytest.mark.parametrize("argv,unit", [
    (["demo"], "--size N elements (float32) per array"),
    (["bench"], "--size BYTES bytes of each"),
    (["worker"], "within this many seconds"),
    (["worker"], "--memory-limit BYTES host memory per worker, e.g. 16GB"),
])
def test_sizes_and_times_give_their_unit(argv, unit, capsys):
    assert unit in " ".join(_help(capsys, *argv).split())


@pytest.mark.parametrize("argv", [
    ["nosuchcommand"],
    ["info", "--bogus"],
    ["worker", "--nthreads", "0"],
    ["worker"],                                   # no scheduler
    ["demo", "--size", "0"],
    ["demo", "--bogus"],
    ["compile", "nosuchmodule_xyz:f"],
    ["compile", "os:path"],                       # not a kernel
    ["inspect", "no-such-file.dgk"],
    ["bench", "--bogus"],                         # no GPU here, or a bad option there
    ["batch"],
    ["batch", "k.dgk", "--input", "x.npy", "--output", "z.zarr", "--retries", "-1"],
])
def test_every_usage_error_exits_2_in_a_few_lines(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err or "needs" in err or "measures on a GPU" in err
    # The usage (wrapped over a few lines) and one message: no traceback, no log.
    message = [line for line in err.strip().splitlines()
               if not line.startswith(("usage:", " "))]
    assert "Traceback" not in err and len(message) == 1, err


@pytest.mark.slow
@pytest.mark.nogpu
def test_bench_without_a_gpu_says_so_in_one_line_and_exits_2():
    proc = subprocess.run([sys.executable, "-m", "daskgpu", "bench"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "needs" in proc.stderr or "has none" in proc.stderr
    assert "DynamicLibNotFoundError" not in proc.stderr


def test_bench_without_cupy_says_so_in_one_line(monkeypatch, capsys):
    import daskgpu._runtime.gpu.driver as _cuda

    monkeypatch.setattr(_cuda, "device_count", lambda: (1, ""))
    monkeypatch.setitem(sys.modules, "cupy", None)  # find_spec then raises, as if absent
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else object())
    assert main(["bench"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert 'pip install "daskgpu[bench]"' in err


def test_bench_help_works_without_a_gpu(capsys):
    assert "comparisons to run" in _help(capsys, "bench")


@pytest.mark.slow
def test_demo_simulated_is_quiet(capsys, caplog):
    import logging

    from daskgpu._cli import demo

    with caplog.at_level(logging.INFO):
        assert demo.main(["--size", "2000", "--simulate"]) == 0
    out = capsys.readouterr()
    assert "GB/s" not in out.out                    # no bandwidth figure from a simulator
    assert "dashboard" not in out.out
    assert "8787" not in out.err + caplog.text      # no dashboard, so no port warning
    assert "OK" in out.out


def test_root_parser_documents_exit_statuses():
    epilog = build_parser().epilog
    assert "0 on success" in epilog and "1 when the work failed" in epilog


def test_the_bench_extras_bring_cupy():
    import pathlib

    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("cupy-cuda12x") for r in extras["bench"])
    assert any(r.startswith("cupy-cuda13x") for r in extras["bench-cu13"])
