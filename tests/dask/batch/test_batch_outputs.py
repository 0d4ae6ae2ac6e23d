"""What a batch job reads and replaces: inputs by the path the client meant, only the
arrays it created, and an output whose metadata or ledger was edited refused in one line.

Every test runs simulated, on one threaded cluster.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from kit.batch import affine_cli, tree, write_zarr
from kit.kernels import affine

from daskgpu._dask.batch import BatchError, run_batch
from daskgpu._dask.batch.inputs import open_inputs
from daskgpu._dask.batch.ledger import JOB, LEDGER, done_chunks

zarr = pytest.importorskip("zarr")


def _run(client, inputs, out, **kw):
    return run_batch(affine, inputs, [out], scalars=[2.0], client=client, progress=False, **kw)


@pytest.fixture
def done(client, tmp_path):
    """A finished job: x (10 chunks of 10) to z.zarr."""
    x = np.arange(100.0)
    xz = write_zarr(tmp_path / "x.zarr", x, 10)
    out = str(tmp_path / "z.zarr")
    assert _run(client, [xz], out).complete
    return {"x": x, "inputs": [xz], "out": out}


# -- inputs: resolved once, on the client ---------------------------------------------
def test_relative_zarr_inputs_are_read_where_the_client_meant(tmp_path, monkeypatch):
    here, there = tmp_path / "client", tmp_path / "worker"
    here.mkdir()
    there.mkdir()
    write_zarr(here / "x.zarr", np.ones(20), 10)
    write_zarr(there / "x.zarr", np.full(20, 2.0), 10)  # what a worker in another folder sees
    np.save(here / "y.npy", np.ones(20))
    np.save(there / "y.npy", np.full(20, 2.0))
    monkeypatch.chdir(here)
    arrays = open_inputs(["x.zarr", "y.npy"], None)
    monkeypatch.chdir(there)
    for a in arrays:
        np.testing.assert_array_equal(a.compute(scheduler="sync"), np.ones(20))


# -- outputs: only what a batch job created is replaced ---------------------------------
def test_a_zarr_group_is_never_deleted(client, tmp_path, capsys):
    xz = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("kept", shape=(5,), dtype="f8")[...] = 7.0
    before = tree(tmp_path / "g.zarr")
    for resume in (True, False):
        with pytest.raises(BatchError, match="is a zarr group.*never deleted") as err:
            _run(client, [xz], str(tmp_path / "g.zarr"), resume=resume)
        assert "--no-resume" not in str(err.value)
    assert affine_cli(tmp_path, [xz], tmp_path / "g.zarr", "--no-resume") == 2
    assert "is a zarr group" in capsys.readouterr().err
    assert tree(tmp_path / "g.zarr") == before
    inside = str(tmp_path / "g.zarr" / "out")  # a new array inside the group is fine
    assert _run(client, [xz], inside).complete
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "g.zarr"))["kept"][:], 7.0)


def test_a_zarr_array_the_job_did_not_create_is_never_deleted(client, tmp_path):
    xz = write_zarr(tmp_path / "x.zarr", np.arange(100.0), 10)
    mine = write_zarr(tmp_path / "mine.zarr", np.full(100, 5.0), 10)
    before = tree(mine)
    for resume in (True, False):
        with pytest.raises(BatchError, match="zarr array that daskgpu batch did not create"
                           ) as err:
            _run(client, [xz], mine, resume=resume)
        assert "--no-resume" not in str(err.value)
    assert tree(mine) == before


@pytest.mark.parametrize("edit,what", [
    (lambda m: m.update(data_type="int32"), "data_type"),
    (lambda m: m.update(shape=[200]), "shape"),
    (lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[20]), "chunk_grid"),
])
def test_edited_output_metadata_is_refused_not_reported_complete(client, done, edit, what):
    meta_file = os.path.join(done["out"], "zarr.json")
    with open(meta_file) as f:
        meta = json.load(f)
    edit(meta)
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    with pytest.raises(BatchError, match=rf"zarr metadata of .* changed .*{what}.*--no-resume"):
        _run(client, done["inputs"], done["out"])
    report = _run(client, done["inputs"], done["out"], resume=False)  # the way out
    assert report.complete and len(report.computed) == 10
    np.testing.assert_array_equal(zarr.open_array(done["out"], mode="r")[:], 2 * done["x"] + 1)


# -- a damaged ledger or metadata: one line, and a rerun that recovers ----------------------
def test_a_stray_marker_outside_the_grid_is_ignored_and_removed(client, done):
    stray = os.path.join(done["out"], LEDGER, "999")
    with open(stray, "w") as f:
        f.write("{}")
    report = _run(client, done["inputs"], done["out"])
    assert report.complete and report.computed == () and not report.failed
    assert not os.path.exists(stray) and done_chunks(done["out"]) == {(i,) for i in range(10)}


def test_a_marker_that_is_a_directory_is_redone(client, done):
    marker = os.path.join(done["out"], LEDGER, "4")
    os.unlink(marker)
    os.mkdir(marker)
    report = _run(client, done["inputs"], done["out"])
    assert report.computed == ((4,),) and report.complete
    assert os.path.isfile(marker)
    assert _run(client, done["inputs"], done["out"]).computed == ()


def test_a_truncated_zarr_json_gets_one_line_and_no_resume_recovers(client, done, tmp_path,
                                                                     capsys):
    meta_file = os.path.join(done["out"], "zarr.json")
    with open(meta_file) as f:
        text = f.read()
    with open(meta_file, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(BatchError, match=r"zarr metadata .*zarr\.json' is damaged.*--no-resume"):
        _run(client, done["inputs"], done["out"])
    assert affine_cli(tmp_path, done["inputs"], done["out"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is damaged" in err and "Traceback" not in err
    assert _run(client, done["inputs"], done["out"], resume=False).complete
    np.testing.assert_array_equal(zarr.open_array(done["out"], mode="r")[:], 2 * done["x"] + 1)


def test_a_damaged_job_json_can_be_overwritten_with_no_resume(client, done):
    with open(os.path.join(done["out"], LEDGER, JOB), "w") as f:
        f.write('{"kernel": "aff')
    with pytest.raises(BatchError, match="damaged.*--no-resume"):
        _run(client, done["inputs"], done["out"])
    assert _run(client, done["inputs"], done["out"], resume=False).complete
