"""daskgpu batch launches sized for the GPU: neighbouring small chunks read, launched and
written by one task, each chunk still recorded on its own.

Every test runs simulated, on the module's threaded cluster. The Dask layer's tests map
one chunk a launch (``daskgpu.launch-bytes: 0``); here each run names its grouping.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from kit.batch import batch_without_a_cluster, data_mtimes, write_zarr
from kit.kernels import SAXPY_FILE, SAXPY_SIG, saxpy, sum_diff
from numba import cuda

import daskgpu as dg
from daskgpu._dask.batch import run_batch
from daskgpu._dask.batch.groups import PROGRESS_STEPS
from daskgpu._dask.batch.ledger import LEDGER, done_chunks, marker_name, read_marker

zarr = pytest.importorskip("zarr")
from distributed import get_task_stream  # noqa: E402

pytestmark = pytest.mark.slow

#: 40 chunks of 100 float32; a launch holds 12 bytes an element (x, y and z), so
#: groups of about 16 KiB hold 13 chunks: 4 tasks, the last of one chunk.
CHUNKS, CHUNK, GROUP, PER_TASK = 40, 100, "16KiB", 13


@dg.jit
def shifted(out, x, shift):
    """``out[i] = x[i + shift[i]]``: elementwise while ``shift`` is 0; a shift past the
    end fails its launch (the simulator checks bounds)."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i + shift[i]]


@dg.jit
def indexed(out, x):
    """``out[i] = x[i] + i``, ``i`` counted from where the launch begins: a chunk launched
    in a group gets other values than one launched alone."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + i


@pytest.fixture
def job(tmp_path):
    x = np.arange(CHUNKS * CHUNK, dtype=np.float32)
    y = np.linspace(-1, 1, CHUNKS * CHUNK, dtype=np.float32)
    return {"inputs": [write_zarr(tmp_path / "x.zarr", x, CHUNK),
                       write_zarr(tmp_path / "y.zarr", y, CHUNK)],
            "expected": np.float32(2) * x + y, "tmp": tmp_path}


def _run(job, client, out, **kw):
    return run_batch(saxpy, job["inputs"], [(str(job["tmp"] / out), np.float32)],
                     scalars=[np.float32(2)], client=client, progress=False, **kw)


def _tasks(task_stream, prefix):
    """How many launch tasks of the kernel ``prefix`` names (``"saxpy-"``) ran: keys named
    ``saxpy-<hash>``, not the tasks that pick one output of several (``-out0``)."""
    return sum(1 for rec in task_stream
               if re.fullmatch(f"{prefix}[0-9a-f]+", str(rec["key"][0])))


def _markers(path):
    """Each chunk's marker without the job instance and the launch it was computed in:
    what it was made from and stored as."""
    return {c: {k: v for k, v in read_marker(path, c).items() if k not in ("job", "launch")}
            for c in done_chunks(path)}


def _launches(path):
    """Each chunk's recorded launch, ``(start, shape)`` in elements."""
    return {c: tuple(tuple(read_marker(path, c)["launch"][k]) for k in ("start", "shape"))
            for c in done_chunks(path)}


def test_grouped_batch_writes_what_one_task_a_chunk_writes_in_far_fewer_tasks(client, job):
    with get_task_stream(client) as grouped_ts:
        grouped = _run(job, client, "grouped.zarr", group=GROUP)
    with get_task_stream(client) as apart_ts:
        apart = _run(job, client, "apart.zarr", group=False)
    assert grouped.complete and apart.complete
    assert grouped.computed == apart.computed == tuple((i,) for i in range(CHUNKS))
    assert _tasks(grouped_ts.data, "saxpy-") == -(-CHUNKS // PER_TASK)  # a launch a group
    assert _tasks(apart_ts.data, "saxpy-") == CHUNKS
    # Every task counted, the reads and the writes too (Dask's array expressions name
    # the write tasks their own way): a few a group, against a few a chunk.
    assert len(grouped_ts.data) < CHUNKS < len(apart_ts.data) / 3

    a, b = (zarr.open_array(str(job["tmp"] / n), mode="r") for n in ("grouped.zarr",
                                                                      "apart.zarr"))
    assert a.chunks == b.chunks == (CHUNK,)  # stored as the job's chunks, whatever the tasks
    np.testing.assert_array_equal(a[:], job["expected"])
    np.testing.assert_array_equal(a[:], b[:])
    # Every stored chunk recorded on its own, with the same fingerprints of its input
    # blocks and its stored file as a run of one task a chunk records.
    assert _markers(str(job["tmp"] / "grouped.zarr")) == _markers(str(job["tmp"] / "apart.zarr"))
    assert len(_markers(str(job["tmp"] / "grouped.zarr"))) == CHUNKS
    # Each records the launch that computed it: its group's region, or its own.
    group = PER_TASK * CHUNK
    assert _launches(str(job["tmp"] / "grouped.zarr")) == {
        (i,): ((i // PER_TASK * group,), (min(group, (CHUNKS * CHUNK) - i // PER_TASK * group),))
        for i in range(CHUNKS)}
    assert _launches(str(job["tmp"] / "apart.zarr")) == {
        (i,): ((i * CHUNK,), (CHUNK,)) for i in range(CHUNKS)}


@pytest.mark.grouped
def test_grouping_is_on_by_default_and_off_with_group_false(client, job):
    with get_task_stream(client) as ts:
        report = _run(job, client, "default.zarr")  # daskgpu.launch-bytes: 32 MiB
    assert report.complete
    # 48 KiB in all: one group would hold it, but a job moves in steps a user can see
    # (and an interrupt keeps): two chunks a task.
    assert _tasks(ts.data, "saxpy-") == PROGRESS_STEPS == CHUNKS // 2
    with get_task_stream(client) as ts:
        report = _run(job, client, "off.zarr", group=False)
    assert report.complete
    assert _tasks(ts.data, "saxpy-") == CHUNKS
    for name in ("default.zarr", "off.zarr"):
        np.testing.assert_array_equal(zarr.open_array(str(job["tmp"] / name), mode="r")[:],
                                      job["expected"])


def test_interrupted_grouped_run_resumes_with_only_the_missing_chunks(client, job):
    out = str(job["tmp"] / "z.zarr")
    # 20 chunks: the first group, and 7 of the second's 13.
    first = _run(job, client, "z.zarr", group=GROUP, max_chunks=20)
    assert first.computed == tuple((i,) for i in range(20)) and not first.complete
    assert done_chunks(out) == set(first.computed)  # none of the rest, though launched
    z = zarr.open_array(out, mode="r")
    np.testing.assert_array_equal(z[:20 * CHUNK], job["expected"][:20 * CHUNK])
    assert not z[20 * CHUNK:].any()
    before = data_mtimes(out)

    with get_task_stream(client) as ts:
        second = _run(job, client, "z.zarr", group=GROUP)
    assert second.skipped == first.computed
    assert second.computed == tuple((i,) for i in range(20, CHUNKS))  # only the rest
    assert _tasks(ts.data, "saxpy-") == 3  # the groups that held chunks left to write
    after = data_mtimes(out)
    assert all(after[f] == t for f, t in before.items())  # finished chunks untouched
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], job["expected"])
    assert done_chunks(out) == {(i,) for i in range(CHUNKS)}


def test_a_2d_job_stopped_inside_a_group_resumes_as_one_task_a_chunk_does(client, tmp_path):
    x = np.arange(42 * 33, dtype=np.float64).reshape(42, 33)
    y = np.full_like(x, 3)
    inputs = [write_zarr(tmp_path / "x.zarr", x, (4, 5)), write_zarr(tmp_path / "y.zarr", y, (4, 5))]
    markers = {}
    for group in ("24KiB", False):  # 28 bytes an element: groups of 6 x 7 chunks
        outs = [str(tmp_path / f"s{group}.zarr"), (str(tmp_path / f"d{group}.zarr"), "float32")]
        with get_task_stream(client) as ts:
            first = run_batch(sum_diff, inputs, outs, client=client, progress=False,
                              group=group, max_chunks=17)  # 2 rows of 7 chunks, and 3
            rest = run_batch(sum_diff, inputs, outs, client=client, progress=False, group=group)
        assert len(first.computed) == 17 and rest.skipped == first.computed
        assert len(rest.computed) == 11 * 7 - 17 and rest.complete
        # Grouped, the tasks are the rows 0-5 and 6-10: the first run launches one.
        assert _tasks(ts.data, "sum_diff-") == (1 + 2 if group else 11 * 7)
        np.testing.assert_array_equal(zarr.open_array(outs[0], mode="r")[:], x + y)
        np.testing.assert_array_equal(zarr.open_array(outs[1][0], mode="r")[:],
                                      (x - y).astype(np.float32))
        markers[group] = _markers(outs[0])
    assert markers["24KiB"] == markers[False] and len(markers[False]) == 11 * 7


def test_grouped_rerun_writes_only_its_stale_chunks_and_keeps_none(client, job):
    out = str(job["tmp"] / "z.zarr")
    assert _run(job, client, "z.zarr", group=GROUP).complete
    # An input chunk changes, and a stored chunk of another group is damaged.
    zarr.open_array(job["inputs"][1], mode="r+")[5 * CHUNK:6 * CHUNK] = 7
    z = zarr.open_array(out, mode="r")
    damaged = z.metadata.encode_chunk_key((30,)) if hasattr(z, "metadata") else "30"
    with open(os.path.join(out, *damaged.split("/")), "r+b") as f:
        f.write(b"\x00" * 8)
    before = data_mtimes(out)

    with get_task_stream(client) as ts:
        report = _run(job, client, "z.zarr", group=GROUP)
    assert report.stale == ((5,), (30,)) and report.computed == ((5,), (30,))
    assert report.complete and len(report.skipped) == CHUNKS - 2
    # The rerun's check read the inputs a group at a time, as the writes do: a check of
    # one task a chunk alone would run more tasks than there are chunks.
    assert _tasks(ts.data, "saxpy-") == 2 and len(ts.data) < CHUNKS
    expected = job["expected"].copy()
    expected[5 * CHUNK:6 * CHUNK] = np.float32(2) * np.arange(500, 600) + 7
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], expected)
    after = data_mtimes(out)
    rewritten = {f for f in after if after[f] != before.get(f)}
    assert len(rewritten) == 2  # the two chunks, not the rest of their groups


def test_a_failing_group_loses_only_its_failing_chunk(client, tmp_path):
    x = np.arange(CHUNKS * CHUNK, dtype=np.float32)
    shift = np.zeros(CHUNKS * CHUNK, np.int64)
    shift[17 * CHUNK + 3] = 10 ** 6  # chunk 17, in the second group
    inputs = [write_zarr(tmp_path / "x.zarr", x, CHUNK),
              write_zarr(tmp_path / "shift.zarr", shift, CHUNK)]
    out = str(tmp_path / "y.zarr")
    group = 1350 * 16  # 16 bytes an element (x, shift and y): 13 chunks a group, as saxpy's
    with get_task_stream(client) as ts:
        report = run_batch(shifted, inputs, [out], order="out,in,in", client=client,
                           retries=0, progress=False, group=group)
    assert list(report.failed) == [(17,)]
    assert report.failed[(17,)].startswith("IndexError")
    assert "chunk (17,) failed after 1 attempt" in report.summary()
    assert len(report.computed) == CHUNKS - 1
    assert done_chunks(out) == set(report.computed)
    # The failed group's 13 chunks ran again one task a chunk; the other groups did not.
    assert _tasks(ts.data, "shifted-") == -(-CHUNKS // PER_TASK) + PER_TASK
    y = zarr.open_array(out, mode="r")[:]
    np.testing.assert_array_equal(np.delete(y, np.s_[1700:1800]),
                                  np.delete(x, np.s_[1700:1800]))

    shift[17 * CHUNK + 3] = 0
    zarr.open_array(inputs[1], mode="r+")[...] = shift  # repair the input
    fixed = run_batch(shifted, inputs, [out], order="out,in,in", client=client,
                      progress=False, group=group)
    # The group's other chunks were launched alone: they are launched with 17, as a group.
    again = tuple((i,) for i in range(PER_TASK, 2 * PER_TASK))
    assert fixed.computed == again and fixed.complete
    assert fixed.stale == tuple(c for c in again if c != (17,))
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], x)


def test_cli_group_and_no_group(client, job, capsys):
    from daskgpu._cli.batch import main

    kernel = job["tmp"] / "groupkern.py"
    kernel.write_text(SAXPY_FILE)
    argv = [f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", "2.0", "--progress", "lines",
            "--scheduler", client.scheduler.address, "--simulate"]
    for p in job["inputs"]:
        argv += ["--input", p]
    for flags, out, tasks in ((["--group", GROUP], "g.zarr", -(-CHUNKS // PER_TASK)),
                              (["--no-group"], "n.zarr", CHUNKS)):
        with get_task_stream(client) as ts:
            assert main([*argv, "--output", str(job["tmp"] / out), *flags]) == 0
        assert _tasks(ts.data, "saxpy-") == tasks
        err = capsys.readouterr().err
        assert (f"up to {PER_TASK} chunks a task" in err) == (tasks < CHUNKS), err
        np.testing.assert_array_equal(zarr.open_array(str(job["tmp"] / out), mode="r")[:],
                                      job["expected"])


def test_group_takes_a_size_or_a_switch():
    from daskgpu._dask.batch import BatchError

    with pytest.raises(BatchError, match=r"group='lots': .*give True or None \(the "
                                         r"daskgpu.launch-bytes setting\), False"):
        run_batch(saxpy, ["x.zarr"], ["z.zarr"], group="lots", progress=False)


# -- resuming in another layout -----------------------------------------------------
def _indexed(job, client, out, **kw):
    """:func:`indexed` over x into ``out`` (in the job's folder); the report."""
    return run_batch(indexed, job["inputs"][:1], [(str(job["tmp"] / out), np.float32)],
                     client=client, **{"progress": False, **kw})


def _read(job, out):
    return zarr.open_array(str(job["tmp"] / out), mode="r")[:]


@pytest.mark.parametrize("first, then", [(GROUP, False), (False, GROUP), (GROUP, "8KiB")])
def test_a_job_resumed_in_another_layout_computes_every_chunk_again(client, job, capsys,
                                                                    first, then):
    assert _indexed(job, client, "z.zarr", group=first).complete
    assert _indexed(job, client, "fresh.zarr", group=then).complete
    assert not np.array_equal(_read(job, "z.zarr"), _read(job, "fresh.zarr"))  # it tells

    resumed = _indexed(job, client, "z.zarr", group=then, progress="lines")
    every = tuple((i,) for i in range(CHUNKS))
    assert resumed.computed == resumed.stale == every and not resumed.skipped
    assert f"0 already written, {CHUNKS} to compute ({CHUNKS} stale)" in capsys.readouterr().err
    assert "stale" in resumed.summary()
    np.testing.assert_array_equal(_read(job, "z.zarr"), _read(job, "fresh.zarr"))
    out, fresh = (str(job["tmp"] / n) for n in ("z.zarr", "fresh.zarr"))
    assert _launches(out) == _launches(fresh) and len(_launches(out)) == CHUNKS


@pytest.mark.parametrize("group", [GROUP, False])
def test_a_job_resumed_with_its_own_layout_computes_nothing_again(client, job, capsys, group):
    assert _indexed(job, client, "z.zarr", group=group).complete
    out = str(job["tmp"] / "z.zarr")
    before, result = data_mtimes(out), _read(job, "z.zarr")

    again = _indexed(job, client, "z.zarr", group=group, progress="lines")
    assert not again.computed and not again.stale
    assert again.skipped == tuple((i,) for i in range(CHUNKS)) and again.complete
    assert f"{CHUNKS} already written, 0 to compute" in capsys.readouterr().err
    assert data_mtimes(out) == before
    np.testing.assert_array_equal(_read(job, "z.zarr"), result)


def test_a_marker_without_its_launch_counts_as_its_chunk_launched_alone(client, job):
    # As a daskgpu that recorded no launch wrote it.
    assert _indexed(job, client, "z.zarr", group=False).complete
    out = str(job["tmp"] / "z.zarr")
    for chunk in done_chunks(out):
        marker = read_marker(out, chunk)
        del marker["launch"]
        with open(os.path.join(out, LEDGER, marker_name(chunk)), "w") as f:
            json.dump(marker, f)

    kept = _indexed(job, client, "z.zarr", group=False)
    assert not kept.computed and len(kept.skipped) == CHUNKS
    grouped = _indexed(job, client, "z.zarr", group=GROUP)
    assert grouped.computed == grouped.stale == tuple((i,) for i in range(CHUNKS))
    assert _indexed(job, client, "fresh.zarr", group=GROUP).complete
    np.testing.assert_array_equal(_read(job, "z.zarr"), _read(job, "fresh.zarr"))


INDEXED_FILE = '''
from numba import cuda

def indexed(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + i
'''


@pytest.mark.grouped
def test_by_default_a_chunk_dependent_kernel_runs_one_task_a_chunk_and_says_why(client, job):
    from dask.array.core import PerformanceWarning

    # 100 chunks: grouped in the default's 20 tasks at least, a fivefold cut.
    many = PROGRESS_STEPS * 5
    job = {**job, "inputs": [write_zarr(job["tmp"] / "many.zarr",
                                        np.arange(many * 10, dtype=np.float32), 10)]}
    with get_task_stream(client) as ts, pytest.warns(PerformanceWarning) as warned:
        report = _indexed(job, client, "z.zarr")
    assert report.complete and _tasks(ts.data, "indexed-") == many
    text = str(warned[0].message)
    assert "uses the thread's position as a value" in text and "--group SIZE" in text
    assert _indexed(job, client, "apart.zarr", group=False).complete
    np.testing.assert_array_equal(_read(job, "z.zarr"), _read(job, "apart.zarr"))


@pytest.mark.parametrize("first, then", [(GROUP, False), (False, GROUP), (GROUP, "8KiB")])
def test_a_layout_independent_job_resumed_in_another_layout_keeps_every_chunk(client, job,
                                                                              first, then):
    assert _run(job, client, "z.zarr", group=first).complete
    out = str(job["tmp"] / "z.zarr")
    before = data_mtimes(out)
    resumed = _run(job, client, "z.zarr", group=then)
    assert not resumed.computed and not resumed.stale and len(resumed.skipped) == CHUNKS
    assert data_mtimes(out) == before
    np.testing.assert_array_equal(_read(job, "z.zarr"), job["expected"])


def test_a_rerun_in_its_own_layout_starts_no_cluster_and_one_in_another_does(client, job):
    from daskgpu._cli.batch import main

    kernel = job["tmp"] / "layoutkern.py"
    kernel.write_text(INDEXED_FILE)  # a kernel that sees its launch as one chunk
    argv = [f"{kernel}:indexed", "--sig", "void(float32[::1], float32[::1])", "--no-progress",
            "--simulate", "--output", str(job["tmp"] / "z.zarr")]
    argv += ["--input", job["inputs"][0]]
    assert main([*argv, "--group", GROUP, "--scheduler", client.scheduler.address]) == 0

    proc = batch_without_a_cluster([*argv, "--group", GROUP])
    assert proc.returncode == 0, proc.stderr
    assert f"{CHUNKS}/{CHUNKS} chunks written (0 this run, {CHUNKS} before)" in proc.stdout
    # Every chunk is done, but in groups: one task a chunk computes them again.
    proc = batch_without_a_cluster([*argv, "--no-group"])
    assert proc.returncode == 1 and "a cluster was started" in proc.stderr
