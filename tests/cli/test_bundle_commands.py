"""``daskgpu inspect`` refuses what is not a bundle file at once, in one line."""

import os
import subprocess
import sys
import threading
import tracemalloc

import pytest

from daskgpu._cli.main import main


def _inspect_within(path, capsys, seconds=10.0):
    """``main(["inspect", path])`` in a thread: ``(status, stderr)``; fails if it blocks."""
    result = []
    thread = threading.Thread(target=lambda: result.append(main(["inspect", str(path)])),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        with open(path, "wb"):  # a FIFO: give the blocked open its writer, then fail
            pass
        thread.join(seconds)
        pytest.fail(f"daskgpu inspect {path} blocked for over {seconds} s")
    return result[0], capsys.readouterr().err


def test_inspect_of_a_fifo_fails_at_once_in_one_line(tmp_path, capsys):
    fifo = tmp_path / "kernel.dgk"
    os.mkfifo(fifo)
    status, err = _inspect_within(fifo, capsys)
    assert status == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert str(fifo) in err and "FIFO" in err and "not a regular file" in err


def test_inspect_of_a_device_reads_nothing(tmp_path, capsys):
    link = tmp_path / "zero.dgk"
    os.symlink("/dev/zero", link)
    tracemalloc.start()
    try:
        status, err = _inspect_within(link, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 2 and "not a regular file" in err
    assert err.strip().count("\n") == 0
    assert peak < 16 << 20, f"{peak} bytes allocated to refuse /dev/zero"


@pytest.mark.slow
def test_inspect_of_a_fifo_from_the_shell(tmp_path):
    fifo = tmp_path / "kernel.dgk"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "daskgpu", "inspect", str(fifo)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "FIFO" in done.stderr
