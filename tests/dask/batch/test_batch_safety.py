"""daskgpu batch never loses or mixes data: inputs kept, stale chunks recomputed, bad
arguments refused before anything is written, and a killed run resumed exactly.

Every test runs simulated, on one threaded cluster.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from kit.batch import affine_cli, tree, write_zarr
from kit.kernels import affine

from daskgpu._dask.batch import BatchError, run_batch
from daskgpu._dask.batch.ledger import LEDGER, done_chunks

zarr = pytest.importorskip("zarr")


def _run(client, inputs, outputs, **kw):
    return run_batch(affine, inputs, outputs, scalars=[2.0], client=client, progress=False, **kw)


# -- 1. inputs are never destroyed ------------------------------------------------------
@pytest.mark.parametrize("resume", [True, False])
def test_output_that_is_an_input_is_refused_and_the_input_kept(client, tmp_path, resume):
    x = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    np.save(tmp_path / "y.npy", np.arange(100.0))
    before = tree(x), (tmp_path / "y.npy").read_bytes()
    for out in (x, str(tmp_path / "y.npy"), str(tmp_path / "x.zarr" / "inner.zarr"),
                str(tmp_path)):
        with pytest.raises(BatchError, match="outside every input") as err:
            _run(client, [x, str(tmp_path / "y.npy")], [out], resume=resume)
        assert "--no-resume" not in str(err.value)
    assert (tree(x), (tmp_path / "y.npy").read_bytes()) == before
    np.testing.assert_array_equal(zarr.open_array(x, mode="r")[:], np.arange(100.0))


def test_cli_output_equal_to_input_exits_2_with_no_resume(client, tmp_path, capsys):
    x = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    before = tree(x)
    address = ["--scheduler", client.scheduler.address, "--simulate"]
    assert affine_cli(tmp_path, [x], x, "--no-resume", *address) == 2
    assert "outside every input" in capsys.readouterr().err
    assert tree(x) == before


# -- 2. resume knows what it resumes --------------------------------------------------
def test_changed_input_recomputes_only_the_affected_chunks(client, tmp_path):
    x = np.arange(200.0)
    xz = write_zarr(tmp_path / "x.zarr", x, 20)
    np.save(tmp_path / "w.npy", x)
    out = str(tmp_path / "z.zarr")
    assert _run(client, [xz], [out]).complete
    x[45] = -7.0  # chunk 2 of the zarr input, same shape and dtype
    zarr.open_array(xz, mode="r+")[45] = -7.0
    again = _run(client, [xz], [out])
    assert again.stale == ((2,),) and again.computed == ((2,),) and again.complete
    assert "stale" in again.summary()
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], 2 * x + 1)
    assert _run(client, [xz], [out]).computed == ()  # now it holds

    npy_out = str(tmp_path / "n.zarr")
    assert _run(client, [str(tmp_path / "w.npy")], [npy_out], chunks=50).complete
    w = np.load(tmp_path / "w.npy")
    w[120:130] = 3.0  # chunk 2 of the .npy input, rewritten in place
    np.save(tmp_path / "w.npy", w)
    again = _run(client, [str(tmp_path / "w.npy")], [npy_out], chunks=50)
    assert again.computed == ((2,),)
    np.testing.assert_array_equal(zarr.open_array(npy_out, mode="r")[:], 2 * w + 1)


def test_missing_or_damaged_output_chunks_are_recomputed(client, tmp_path):
    x = np.linspace(0, 1, 200)
    xz = write_zarr(tmp_path / "x.zarr", x, 20)
    out = str(tmp_path / "z.zarr")
    assert _run(client, [xz], [out]).complete
    os.unlink(os.path.join(out, "c", "3"))  # deleted, its marker kept
    with open(os.path.join(out, "c", "7"), "r+b") as f:  # one byte changed
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert done_chunks(out) == {(i,) for i in range(10)}
    again = _run(client, [xz], [out])
    assert again.stale == ((3,), (7,)) and again.computed == ((3,), (7,))
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], 2 * x + 1)


def test_all_fill_value_chunks_are_stored_and_checked(client, tmp_path):
    xz = write_zarr(tmp_path / "x.zarr", np.full(40, -0.5), 10)  # 2 * -0.5 + 1 == 0, the fill
    out = str(tmp_path / "z.zarr")
    assert _run(client, [xz], [out]).complete
    assert sorted(os.listdir(os.path.join(out, "c"))) == ["0", "1", "2", "3"]
    os.unlink(os.path.join(out, "c", "1"))
    assert _run(client, [xz], [out]).computed == ((1,),)


# -- 3 and 4. arguments refused before anything is written, in one line -----------------
def test_cli_output_specs_and_usage_errors_exit_2_creating_nothing(client, tmp_path, capsys):
    x = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    address = ["--scheduler", client.scheduler.address, "--simulate"]
    cases = [
        ([x], tmp_path / "z.zarr:floot32", [], "floot32"),
        ([x], tmp_path / "z.npy", [], ".npy"),
        ([x], tmp_path / "z.npy:float32", [], ".npy"),
        ([tmp_path / "missing.zarr"], tmp_path / "z.zarr", [], "no input at"),
        ([x], tmp_path / "z.zarr", ["--chunks", "5,5"], "dimension"),
        ([x], tmp_path / "z.zarr", ["--chunks", "0"], "cannot read chunks"),
    ]
    for inputs, output, extra, message in cases:
        before = set(os.listdir(tmp_path))
        assert affine_cli(tmp_path, inputs, output, *extra, *address) == 2, (output, extra)
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert set(os.listdir(tmp_path)) - before <= {"affine_kernel.py", "__pycache__"}
    assert affine_cli(tmp_path, [x], tmp_path / "z.zarr", "--devices", "abc") == 2
    err = capsys.readouterr().err
    assert "'abc' is not a device" in err and "Traceback" not in err


def test_cli_damaged_job_json_exits_2_naming_the_file(client, tmp_path, capsys):
    x = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    out = tmp_path / "z.zarr"
    address = ["--scheduler", client.scheduler.address, "--simulate"]
    assert affine_cli(tmp_path, [x], out, *address, "--max-chunks", "2") == 3
    (out / LEDGER / "job.json").write_text('{"kernel": "aff')
    assert affine_cli(tmp_path, [x], out, *address) == 2
    err = capsys.readouterr().err
    assert "job.json" in err and "damaged" in err and "Traceback" not in err


def test_api_mistakes_get_one_line_errors_naming_the_fix(client, tmp_path):
    x = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    z = str(tmp_path / "z.zarr")
    with pytest.raises(BatchError, match=r"outputs=\[.*z\.zarr'\]"):
        _run(client, [x], z)
    with pytest.raises(BatchError, match=r"inputs=\["):
        _run(client, x, [z])
    with pytest.raises(BatchError, match="at least 1"):
        _run(client, [x], [z], chunks=0)
    with pytest.raises(BatchError, match="2 dimension"):
        _run(client, [x], [z], chunks=(5, 5))
    with pytest.raises(BatchError, match="not a dtype"):
        _run(client, [x], [(z, "floot32")])
    with pytest.raises(BatchError, match="writes zarr arrays"):
        _run(client, [x], [str(tmp_path / "z.npy")])
    (tmp_path / "notes.txt").write_text("not an array")
    with pytest.raises(BatchError, match="numpy.save") as err:
        _run(client, [str(tmp_path / "notes.txt")], [z])
    assert "allow_pickle" not in str(err.value)
    (tmp_path / "fake.npy").write_bytes(b"hello")
    with pytest.raises(BatchError, match="lacks the .npy header") as err:
        _run(client, [str(tmp_path / "fake.npy")], [z])
    assert "allow_pickle" not in str(err.value)
    np.save(tmp_path / "objects.npy", np.array([None, 1], dtype=object))
    with pytest.raises(BatchError, match="Python objects") as err:
        _run(client, [str(tmp_path / "objects.npy")], [z])
    assert "allow_pickle" not in str(err.value)
    np.save(tmp_path / "big.npy", np.arange(100.0).astype(">f8"))
    with pytest.raises(BatchError, match=r"big-endian \(>f8\).*astype\('<f8'\)"):
        _run(client, [str(tmp_path / "big.npy")], [z])
    assert not os.path.exists(z)


# -- 9. crash consistency -------------------------------------------------------------
KERNEL_MODULE = textwrap.dedent('''
    from numba import cuda
    import daskgpu as dg

    @dg.jit("void(float64[::1], float32[::1], float64, float64[::1], float64[::1])")
    def affine(z, w, a, x, y):
        i = cuda.grid(1)
        if i < z.size:
            z[i] = a * x[i] + y[i]
            w[i] = x[i] - y[i]
''')

# Imports once, then forks one batch process per line read (a trial's folder and its
# group=), so that a trial costs a cluster start, not an interpreter start. Each child
# writes READY into its folder once its cluster is up; the parent prints the child's pid.
ZYGOTE = textwrap.dedent('''
    import os, signal, sys
    import numpy, zarr, dask.array, distributed
    import daskgpu as dg
    from daskgpu._dask.batch import run_batch
    from crashkern import affine

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
    for line in sys.stdin:
        d, group = line.split()
        group = False if group == "off" else int(group)
        pid = os.fork()
        if pid == 0:
            with dg.LocalGPUCluster(simulate=True, processes=False,
                                    dashboard_address=":0") as c, distributed.Client(c) as cl:
                open(os.path.join(d, "READY"), "w").close()
                run_batch(affine, [d + "/x.npy", d + "/y.zarr"],
                          [d + "/z.zarr", (d + "/w.zarr", "float32")], scalars=[2.0],
                          chunks=10, client=cl, progress=False, group=group)
            open(os.path.join(d, "DONE"), "w").close()
            os._exit(0)
        print(pid, flush=True)
''')


def _temporaries(root):
    found = []
    for folder, dirs, files in os.walk(root):
        found += [os.path.join(folder, n) for n in files + dirs
                  if n.endswith((".tmp", ".partial", ".daskgpu-lock")) or ".daskgpu-new-" in n
                  or ".daskgpu-old-" in n]
    return found


def _kill_when_due(pid, folder, delay, after_a_chunk=False):
    """SIGKILL ``pid`` ``delay`` seconds after its cluster is up (READY in ``folder``),
    or after its first chunk is written."""
    deadline = time.monotonic() + 60
    while not (folder / "READY").exists() or (after_a_chunk and not done_chunks(
            folder / "z.zarr") and not os.path.exists(folder / "DONE")):
        assert time.monotonic() < deadline, "the batch process did not start"
        time.sleep(0.005)
    time.sleep(delay)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it finished first
        return
    # Gone (the zygote ignores SIGCHLD, so it is reaped at once): its lock is released.
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline + 60, "the killed batch process is still there"
        time.sleep(0.005)


def test_sigkill_at_random_points_then_rerun_is_exact(client, tmp_path, monkeypatch):
    """20 batch processes, half of them 5 chunks a task, killed with SIGKILL at random moments;
    each rerun, grouped or not, is exact."""
    (tmp_path / "crashkern.py").write_text(KERNEL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from crashkern import affine as kernel  # the children's kernel: the same job

    x, y = np.arange(300.0), np.linspace(-1, 1, 300)
    rng = random.Random(14)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)
    killed_midway = 0
    try:
        for t in range(20):
            d = tmp_path / f"t{t}"
            d.mkdir()
            np.save(d / "x.npy", x)
            write_zarr(d / "y.zarr", y, 10)
            # One task a chunk, or (half the trials) 5 chunks a task: 28 bytes an element.
            zygote.stdin.write(f"{d} {1400 if t % 4 >= 2 else 'off'}\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            # Anywhere from creating the outputs to past the end of the job; every other
            # trial from its first chunk on, so that kills land mid-job on a loaded machine.
            _kill_when_due(pid, d, rng.uniform(0.0, 0.3 if t % 2 else 1.0), t % 2 == 1)
            written = len(done_chunks(d / "z.zarr") & done_chunks(d / "w.zarr"))
            killed_midway += 0 < written < 30
            report = run_batch(kernel, [str(d / "x.npy"), str(d / "y.zarr")],
                               [str(d / "z.zarr"), (str(d / "w.zarr"), "float32")],
                               scalars=[2.0], chunks=10, client=client, progress=False,
                               group=1400 if t % 2 else False)
            assert report.complete and not report.failed, report.summary()
            np.testing.assert_array_equal(zarr.open_array(str(d / "z.zarr"), mode="r")[:],
                                          2.0 * x + y)
            np.testing.assert_array_equal(zarr.open_array(str(d / "w.zarr"), mode="r")[:],
                                          (x - y).astype(np.float32))
            assert _temporaries(d) == []
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=30)
    assert killed_midway >= 3  # the kills did land mid-job, not only before or after
