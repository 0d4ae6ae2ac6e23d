"""``daskgpu batch`` arguments refused in one line before anything runs, kernel modules
that exit at import reported, not taken for success, and an interrupt's line that says
where the run was."""

from __future__ import annotations

import os
import time

import pytest

from daskgpu._cli.batch import build_parser
from daskgpu._cli.batch import main as batch_main
from daskgpu._cli.main import main as daskgpu_main


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text("def f(out, x):\n    pass\n")
    return tmp_path


def _usage_error(argv, capsys):
    assert batch_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "OverflowError" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("scalar,message", [
    ("int8:300", "300 is out of range for int8 (-128 to 127)"),
    ("uint8:-1", "-1 is out of range for uint8 (0 to 255)"),
    ("float16:1e6", "1e6 is out of range for float16"),
    ("int8:2.5", "int8 takes a whole number"),
    ("bool:yes", "a bool is true or false"),
])
def test_scalars_out_of_their_types_range_exit_2_naming_it(folder, capsys, scalar, message):
    line = _usage_error(["k.py:f", "--input", "x.npy", "--output", "o.zarr",
                         "--scalar", scalar], capsys)
    assert message in line, line


def test_typed_scalars_keep_their_type_and_value():
    ns = build_parser().parse_args(["k.py:f", "--input", "x", "--output", "o", "--scalar",
                                    "uint8:255", "--scalar", "bool:false", "--scalar",
                                    "int64:-9223372036854775808"])
    assert [(type(s).__name__, int(s)) for s in ns.scalar] == [
        ("uint8", 255), ("bool", 0), ("int64", -2**63)]


def test_an_output_without_a_path_creates_nothing(folder, capsys):
    line = _usage_error(["k.py:f", "--input", "x.npy", "--output", ":float32"], capsys)
    assert "names no path before the colon" in line
    assert not os.path.exists(folder / ":float32")


def test_a_missing_scheduler_file_fails_fast(folder, capsys):
    start = time.monotonic()
    line = _usage_error(["k.py:f", "--input", "x.npy", "--output", "o.zarr",
                         "--scheduler-file", "nowhere.json"], capsys)
    assert "no scheduler file 'nowhere.json'" in line
    assert time.monotonic() - start < 10


def test_a_kernel_module_that_exits_at_import_is_a_failure(folder, capsys):
    (folder / "exits.py").write_text("import sys\nsys.exit('no GPU here, bye')\n")
    assert batch_main(["exits.py:f", "--input", "x.npy", "--output", "o.zarr"]) == 1
    err = capsys.readouterr().err
    assert "no GPU here, bye" in err and "sys.exit" in err and "Traceback" not in err
    assert daskgpu_main(["compile", "exits.py:f", "--sig", "void()", "-o", "k.dgk"]) == 1
    err = capsys.readouterr().err
    assert "no GPU here, bye" in err and "Traceback" not in err
    assert not os.path.exists(folder / "k.dgk")


# -- TLS ------------------------------------------------------------------------------
def test_a_tls_scheduler_without_credentials_is_one_line_naming_what_to_set(folder, capsys):
    import json

    start = time.monotonic()
    line = _usage_error(["k.py:f", "--input", "x.npy", "--output", "o.zarr",
                         "--scheduler", "tls://127.0.0.1:9"], capsys)
    assert "the scheduler tls://127.0.0.1:9 speaks TLS" in line
    for name in ("--tls-ca-file", "--tls-cert", "--tls-key", "distributed.comm.tls.ca-file",
                 "distributed.comm.tls.client.cert"):
        assert name in line, line
    assert time.monotonic() - start < 10  # refused before any connection is tried
    (folder / "scheduler.json").write_text(json.dumps({"address": "tls://127.0.0.1:9"}))
    line = _usage_error(["k.py:f", "--input", "x.npy", "--output", "o.zarr",
                         "--scheduler-file", "scheduler.json", "--tls-ca-file", "ca.pem"],
                        capsys)
    assert "speaks TLS, and --tls-cert is not set" in line


def test_tls_options_without_a_scheduler_are_refused(folder, capsys):
    line = _usage_error(["k.py:f", "--input", "x.npy", "--output", "o.zarr",
                         "--tls-cert", "cert.pem"], capsys)
    assert "are for --scheduler or --scheduler-file" in line


def test_progress_takes_a_display_and_no_progress_means_none():
    parse = build_parser().parse_args
    base = ["k.py:f", "--input", "x", "--output", "o"]
    assert parse(base).progress == "auto"
    assert parse([*base, "--progress", "lines"]).progress == "lines"
    assert parse([*base, "--no-progress"]).progress == "none"


def test_ctrl_c_after_the_job_ended_says_so_not_that_it_never_started(folder, capsys,
                                                                      monkeypatch):
    import numpy as np

    import daskgpu._cli.batch as batch_cli

    np.save(folder / "x.npy", np.arange(8, dtype=np.float32))

    def interrupted(caught):  # Ctrl-C as the run closes, once its report is printed
        raise KeyboardInterrupt

    monkeypatch.setattr(batch_cli, "_print_warnings", interrupted)
    # --max-chunks 0 plans the job and computes nothing: no cluster starts.
    code = batch_main(["k.py:f", "--input", "x.npy", "--output", "o.zarr", "--max-chunks",
                       "0", "--simulate"])
    out, err = capsys.readouterr()
    assert code == batch_cli.INTERRUPTED
    assert out.startswith("0/1 chunk written"), out  # the report's line came first
    assert "interrupted after the job ended" in err, err
    assert "before the job started" not in err, err
