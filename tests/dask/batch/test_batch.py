"""daskgpu batch: stored arrays in, zarr out, chunk by chunk, with retries and resume.

Every test runs simulated, on one threaded cluster that a subprocess can also reach.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from kit.batch import data_mtimes, write_zarr
from kit.kernels import SAXPY_FILE, SAXPY_SIG, saxpy, sum_diff
from numba import cuda

import daskgpu as dg
from daskgpu._cli.batch import load_kernel, main
from daskgpu._dask.batch import BatchError, run_batch
from daskgpu._dask.batch.ledger import done_chunks

zarr = pytest.importorskip("zarr")
from distributed import get_task_stream  # noqa: E402


@dg.jit("void(float64[::1], int64[::1], float64[::1])")
def permute(out, perm, x):
    """``out[i] = x[perm[i]]`` within a chunk: a bad index in ``perm`` fails the chunk."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[perm[i]]


@pytest.fixture
def saxpy_job(tmp_path):
    """x in zarr (10 chunks of 40), y in .npy; z = 2x + y."""
    x = np.arange(400, dtype=np.float32)
    y = np.linspace(-1, 1, 400, dtype=np.float32)
    np.save(tmp_path / "y.npy", y)
    return {
        "inputs": [write_zarr(tmp_path / "x.zarr", x, 40), str(tmp_path / "y.npy")],
        "outputs": [(str(tmp_path / "z.zarr"), np.float32)],
        "scalars": [np.float32(2)],
        "expected": np.float32(2) * x + y,
    }


def _run(job, client, **kw):
    return run_batch(saxpy, job["inputs"], job["outputs"], scalars=job["scalars"],
                     client=client, progress=False, **kw)


@contextlib.contextmanager
def _failed_tasks():
    """``(name, chunk)`` of each task failure that the (threaded) workers log."""
    failures = []

    class Handler(logging.Handler):
        def emit(self, record):
            match = re.search(r"Key:\s+\('(\w+)-[0-9a-f]+', (\d+)\)", record.getMessage())
            if match:
                failures.append((match.group(1), int(match.group(2))))

    logger, handler = logging.getLogger("distributed.worker"), Handler(logging.ERROR)
    logger.addHandler(handler)
    try:
        yield failures
    finally:
        logger.removeHandler(handler)


def _launches(task_stream, kernel_name):
    """How many map_kernel launch tasks of ``kernel_name`` ran."""
    return sum(1 for rec in task_stream if str(rec["key"][0]).startswith(f"{kernel_name}-"))


def _wait_idle(client, timeout=30):
    deadline = time.monotonic() + timeout
    while any(client.run(lambda dask_worker: len(dask_worker.state.executing)).values()):
        assert time.monotonic() < deadline, "the workers are still busy"
        time.sleep(0.05)


# -- a whole job ------------------------------------------------------------------
def test_zarr_and_npy_inputs_to_zarr_output(client, saxpy_job):
    report = _run(saxpy_job, client)
    assert report.complete and not report.failed and not report.remaining
    assert report.chunks == 10 and report.computed == tuple((i,) for i in range(10))
    z = zarr.open_array(saxpy_job["outputs"][0][0], mode="r")
    assert z.dtype == np.float32 and z.chunks == (40,)
    np.testing.assert_array_equal(z[:], saxpy_job["expected"])
    assert done_chunks(saxpy_job["outputs"][0][0]) == {(i,) for i in range(10)}

    again = _run(saxpy_job, client)  # nothing left to do
    assert again.complete and again.computed == () and len(again.skipped) == 10


def test_interrupted_job_resumes_with_only_the_missing_chunks(client, saxpy_job):
    out = saxpy_job["outputs"][0][0]
    first = _run(saxpy_job, client, max_chunks=4)  # stops as an interruption would
    assert first.computed == ((0,), (1,), (2,), (3,)) and len(first.remaining) == 6
    assert not first.complete and done_chunks(out) == set(first.computed)
    z = zarr.open_array(out, mode="r")
    np.testing.assert_array_equal(z[:160], saxpy_job["expected"][:160])
    assert not z[160:].any()  # not written yet
    before = data_mtimes(out)

    with get_task_stream(client) as ts:
        second = _run(saxpy_job, client)
    assert second.skipped == first.computed
    assert second.computed == first.remaining  # the rest, and only the rest
    assert _launches(ts.data, "saxpy") == 6
    after = data_mtimes(out)
    assert all(after[f] == t for f, t in before.items())  # finished chunks untouched
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], saxpy_job["expected"])


def test_failed_chunk_is_retried_reported_and_recomputed_alone(client, tmp_path):
    x = np.random.default_rng(0).random(240)
    perm = np.tile(np.arange(30)[::-1], 8)  # reverses each chunk of 30
    bad = perm.copy()
    bad[95] = 10_000  # a corrupt index in chunk 3
    perm_path = write_zarr(tmp_path / "perm.zarr", bad, 30)
    inputs = [perm_path, write_zarr(tmp_path / "x.zarr", x, 30)]
    out = str(tmp_path / "y.zarr")
    expected = x.reshape(8, 30)[:, ::-1].ravel()

    outputs = [(out, np.float64)]
    with _failed_tasks() as failures:
        report = run_batch(permute, inputs, outputs, client=client, retries=1,
                           progress=False)
    assert list(report.failed) == [(3,)]
    assert report.failed[(3,)].startswith("IndexError")
    assert failures == [("permute", 3)] * 2  # the launch of chunk 3, tried twice
    assert len(report.computed) == 7 and not report.complete
    assert "chunk (3,) failed after 2 attempts: IndexError" in report.summary()
    assert done_chunks(out) == set(report.computed)  # every other chunk is written
    y = zarr.open_array(out, mode="r")[:]
    np.testing.assert_array_equal(np.delete(y, np.s_[90:120]),
                                  np.delete(expected, np.s_[90:120]))

    zarr.open_array(perm_path, mode="r+")[90:120] = perm[90:120]  # repair the input
    fixed = run_batch(permute, inputs, outputs, client=client, progress=False)
    assert fixed.computed == ((3,),) and fixed.complete
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], expected)


def test_two_outputs_2d_from_npy_files(client, tmp_path):
    x = np.arange(20 * 12, dtype=np.float64).reshape(20, 12)
    y = np.ones((20, 12))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    outs = [str(tmp_path / "s.zarr"), (str(tmp_path / "d.zarr"), "float32")]
    report = run_batch(sum_diff, [str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], outs,
                       chunks=(8, 8), client=client, progress=False)
    assert report.complete and report.chunks == 6
    s, d = (zarr.open_array(p, mode="r") for p in (outs[0], outs[1][0]))
    assert s.chunks == (8, 8) and d.dtype == np.float32
    np.testing.assert_array_equal(s[:], x + y)
    np.testing.assert_array_equal(d[:], (x - y).astype(np.float32))
    assert done_chunks(outs[0]) == done_chunks(outs[1][0]) == set(np.ndindex(3, 2))


# -- refusals --------------------------------------------------------------------
def test_another_jobs_output_is_not_resumed_but_can_be_overwritten(client, saxpy_job):
    _run(saxpy_job, client, max_chunks=2)
    saxpy_job["scalars"] = [np.float32(3)]
    with pytest.raises(BatchError, match=r"holds chunks of another job \(different scalars\)"):
        _run(saxpy_job, client)
    report = _run(saxpy_job, client, resume=False)
    assert len(report.computed) == 10
    z = zarr.open_array(saxpy_job["outputs"][0][0], mode="r")
    x, y = np.arange(400, dtype=np.float32), np.load(saxpy_job["inputs"][1])
    np.testing.assert_array_equal(z[:], np.float32(3) * x + y)


def test_foreign_output_directory_is_never_overwritten(client, saxpy_job, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    saxpy_job["outputs"] = [(str(foreign), np.float32)]
    for resume in (True, False):
        with pytest.raises(BatchError, match="is not a zarr array") as err:
            _run(saxpy_job, client, resume=resume)
        assert "--no-resume" not in str(err.value)
    assert (foreign / "notes.txt").read_text() == "keep"


def test_bad_jobs_are_refused_before_anything_runs(client, saxpy_job, tmp_path):
    np.save(tmp_path / "short.npy", np.zeros(10, np.float32))
    with pytest.raises(BatchError, match=r"has shape \(10,\), but .* has \(400,\)"):
        run_batch(saxpy, [saxpy_job["inputs"][0], str(tmp_path / "short.npy")],
                  saxpy_job["outputs"], scalars=[2.0], client=client, progress=False)
    with pytest.raises(BatchError, match=r"takes 4 parameters, .* calls it as \(out, in, in\) "
                                         r"= .*0 scalar\(s\)"):
        run_batch(saxpy, saxpy_job["inputs"], saxpy_job["outputs"], client=client,
                  progress=False)
    with pytest.raises(BatchError, match="no input at"):
        run_batch(saxpy, [str(tmp_path / "nope.zarr")], ["o.zarr"], client=client)
    bundle = tmp_path / "saxpy.dgk"
    dg.save(saxpy, bundle)
    with pytest.raises(BatchError, match="PTX only .* MODULE:FUNCTION to simulate"):
        run_batch(dg.load(bundle), saxpy_job["inputs"], saxpy_job["outputs"],
                  scalars=[2.0], client=client, progress=False)
    assert not os.path.exists(saxpy_job["outputs"][0][0])


# -- command line ----------------------------------------------------------------
def _argv(tmp_path, job, *extra):
    kernel = tmp_path / "batchkern.py"
    kernel.write_text(SAXPY_FILE)
    argv = [f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", "2.0", "--no-progress"]
    for p in job["inputs"]:
        argv += ["--input", p]
    return argv + ["--output", f"{job['outputs'][0][0]}:float32", *extra]


def test_cli_stops_at_max_chunks_then_resumes(client, saxpy_job, tmp_path, capsys):
    from daskgpu._cli.main import main as daskgpu_main

    address = ["--scheduler", client.scheduler.address, "--simulate"]
    assert main(_argv(tmp_path, saxpy_job, *address, "--max-chunks", "3")) == 3
    out = capsys.readouterr().out
    assert "3/10 chunks written (3 this run, 0 before)" in out
    assert "7 chunks to go: run the same job again" in out
    assert daskgpu_main(["batch", *_argv(tmp_path, saxpy_job, *address)]) == 0
    assert "10/10 chunks written (7 this run, 3 before)" in capsys.readouterr().out
    z = zarr.open_array(saxpy_job["outputs"][0][0], mode="r")
    np.testing.assert_array_equal(z[:], saxpy_job["expected"])


@pytest.mark.parametrize("argv,message", [
    (["k.py:f", "--output", "o.zarr"], "--input"),
    (["k.py:f", "--input", "x.zarr", "--output", "o.zarr", "--scalar", "two"],
     "cannot read scalar 'two'"),
    (["k.py:f", "--input", "x", "--output", "o", "--chunks", "0"], "cannot read chunks"),
    (["k.py:f", "--input", "x", "--output", "o", "--scheduler", "a", "--scheduler-file", "f"],
     "not allowed with argument"),
    (["k.dgk", "--sig", "void()", "--input", "x", "--output", "o"], "--sig is for"),
])
def test_cli_usage_errors_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.dgk").write_text("{}")
    (tmp_path / "f").write_text("{}")  # a scheduler file, so that only the conflict is wrong
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_interrupted_by_ctrl_c_loses_and_repeats_nothing(client, tmp_path):
    x = np.arange(4000, dtype=np.float32)
    y = np.ones(4000, np.float32)
    job = {"inputs": [write_zarr(tmp_path / "x.zarr", x, 200), write_zarr(tmp_path / "y.zarr", y, 200)],
           "outputs": [(str(tmp_path / "z.zarr"), np.float32)]}
    out = job["outputs"][0][0]
    # One task a chunk, as the tests here run: grouped, the 20 chunks are one task.
    argv = _argv(tmp_path, job, "--scheduler", client.scheduler.address, "--simulate",
                 "--no-group")
    proc = subprocess.Popen([sys.executable, "-m", "daskgpu", "batch", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(done_chunks(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "daskgpu batch interrupted:" in err and "run the same job again" in err
    _wait_idle(client)  # a launch running at Ctrl-C still finishes and records its chunk
    before = done_chunks(out)
    assert 3 <= len(before) < 20

    kernel = load_kernel(argv[0], [SAXPY_SIG])  # the same kernel, compiled here
    report = run_batch(kernel, job["inputs"], job["outputs"], scalars=[2.0], client=client,
                       progress=False)
    assert set(report.skipped) == before
    assert set(report.computed) == set(np.ndindex(20)) - before
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], 2 * x + y)


# -- what daskgpu batch takes, run_batch takes -----------------------------------
def plain_saxpy(out, a, x, y):
    """A plain function in Numba's CUDA dialect, as a kernels.py for daskgpu batch has it."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def test_run_batch_takes_a_plain_function_and_a_numba_kernel(client, saxpy_job, tmp_path):
    # A plain function failed with "'function' object has no attribute 'select_image'".
    for i, kernel in enumerate([plain_saxpy, cuda.jit(plain_saxpy)]):
        output = str(tmp_path / f"z{i}.zarr")
        report = run_batch(kernel, saxpy_job["inputs"], [(output, np.float32)],
                           scalars=saxpy_job["scalars"], client=client, progress=False)
        assert report.complete, kernel
        np.testing.assert_allclose(zarr.open_array(output, mode="r")[:],
                                   saxpy_job["expected"], rtol=1e-6)


def test_run_batch_takes_a_bundle_path_and_says_a_simulator_cannot_run_it(client, saxpy_job,
                                                                         tmp_path):
    bundle = str(tmp_path / "saxpy.dgk")
    dg.save(saxpy, bundle)
    # Simulated here: a bundle is PTX only, and the refusal names the kernel it loaded.
    with pytest.raises(BatchError, match="kernel 'saxpy' is PTX only"):
        run_batch(bundle, saxpy_job["inputs"], [(str(tmp_path / "z.zarr"), np.float32)],
                  scalars=saxpy_job["scalars"], client=client, progress=False)


@pytest.mark.parametrize("not_a_kernel", [42, None, len, int], ids=["int", "None", "len", "class"])
def test_what_is_no_kernel_is_refused_naming_what_run_batch_takes(not_a_kernel, tmp_path):
    message = (r"run_batch takes a kernel: one made by dg.jit or dg.kernel or loaded by "
               r"dg.load, .* or the path of a .dgk bundle; got " + re.escape(repr(not_a_kernel))
               + rf" \(of type {type(not_a_kernel).__name__}\)$")
    with pytest.raises(BatchError, match=message):
        run_batch(not_a_kernel, [str(tmp_path / "x.zarr")], [str(tmp_path / "z.zarr")],
                  progress=False)
    assert not os.path.exists(tmp_path / "z.zarr")


def does_not_compile(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + not_defined_anywhere  # noqa: F821


def adds_a_string(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i] + "s"


def adds_a_string_to_arrays(out, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i] + "s"


def test_a_kernel_that_does_not_compile_is_refused_with_the_compilers_reason(saxpy_job):
    with pytest.raises(BatchError) as err:
        run_batch(does_not_compile, saxpy_job["inputs"], saxpy_job["outputs"],
                  scalars=saxpy_job["scalars"],
                  simulate=True, progress=False)
    message = str(err.value)
    assert message.startswith(
        "kernel 'does_not_compile' does not compile, whatever its arguments: NameError: name "
        "'not_defined_anywhere' is not defined; fix the kernel (this batch calls it as "
        "(out, scalar, in, in)"), message
    assert "--order" not in message  # no order of the arguments helps


def test_a_kernel_that_fails_typing_gets_the_reason_and_order_advice_where_it_helps(saxpy_job):
    with pytest.raises(BatchError) as err:
        run_batch(adds_a_string, saxpy_job["inputs"], saxpy_job["outputs"],
                  scalars=saxpy_job["scalars"], simulate=True, progress=False)
    message = str(err.value)
    assert "compiling it for them failed: No implementation of function" in message, message
    assert "give it with --order" in message  # a scalar and arrays: another order may fit
    with pytest.raises(BatchError) as err:
        run_batch(adds_a_string_to_arrays, saxpy_job["inputs"], saxpy_job["outputs"],
                  simulate=True, progress=False)
    message = str(err.value)
    assert "compiling it for them failed: No implementation of function" in message, message
    assert "--order" not in message  # three float32 arrays: every order is the same call


def test_a_few_tasks_of_a_large_job_take_only_their_own_graph_to_the_scheduler():
    import dask.array as da

    from daskgpu._dask.batch.job import _needed

    x = da.from_array(np.arange(4000.0), chunks=1)
    status = da.map_blocks(np.negative, x + 1)
    keys = [(status.name, 3), (status.name, 3999)]
    whole, needed = dict(status.__dask_graph__()), dict(_needed(status, keys))
    assert len(whole) > 8000  # a read, an add and the map for every chunk
    assert set(keys) <= set(needed) and len(needed) <= 8, sorted(map(str, needed))
