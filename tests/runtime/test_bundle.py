"""Kernel bundles: data-only files, integrity-checked, loadable without numba."""

import base64
import hashlib
import json
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap

import dask.config
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime.bundle import read

REPO = pathlib.Path(__file__).resolve().parents[1]


@dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
         "void(float64[:], float64, float64[:], float64[:])"],
        targets=["7.5", "9.0"], fastmath=True, max_registers=64)
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a * x[i] + y[i]


@pytest.fixture
def bundle(tmp_path):
    path = tmp_path / "saxpy.dgk"
    dg.save(saxpy, path)
    return path


def _rewrite(path, mutate, rehash=True):
    """Apply ``mutate`` to the bundle document; recompute the hash as a forger would."""
    doc = json.loads(path.read_text())
    mutate(doc)
    if rehash:
        content = {k: v for k, v in doc.items() if k != "sha256"}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False)
        doc["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(doc))


# -- round trips ----------------------------------------------------------------
def test_round_trip_keeps_every_field(bundle):
    k = dg.load(bundle)
    assert isinstance(k, dg.PTXKernel)
    assert k.images == saxpy.images
    assert [im.hash for im in k.images] == [im.hash for im in saxpy.images]
    assert k.signatures == saxpy.signatures
    im = k.images[0]
    assert im.targets == ((7, 5), (9, 0))
    assert im.writes == (0,)
    assert im.grid_ndim == 1
    assert im.option("fastmath") is True and im.option("max_registers") == 64
    assert im.py_func is None
    assert k.__name__ == "saxpy"


def test_link_inputs_travel_as_bytes(tmp_path):
    lib = tmp_path / "helpers.ptx"
    lib.write_bytes(b".version 8.0\n.target sm_75\n.address_size 64\n\x00\xff")
    k = dg.jit("void(float32[::1])", link=[str(lib)])(_store_one)
    path = tmp_path / "linked.dgk"
    dg.save(k, path)
    loaded = dg.load(path)
    assert loaded.images[0].links == k.images[0].links
    assert loaded.images[0].links[0].data.endswith(b"\x00\xff")


def _store_one(out):
    out[0] = 1


def test_output_is_deterministic_and_hash_returned(tmp_path):
    a, b = tmp_path / "a.dgk", tmp_path / "b.dgk"
    digest = dg.save(saxpy, a)
    dg.save(saxpy, b)
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["sha256"] == digest
    assert read(a)[1].sha256 == digest


def test_loaded_kernel_saves_again_identically(bundle, tmp_path):
    again = tmp_path / "again.dgk"
    dg.save(dg.load(bundle), again)
    assert again.read_bytes() == bundle.read_bytes()


def test_save_replaces_existing_file_and_leaves_no_temporaries(bundle):
    bundle.write_text("old")
    dg.save(saxpy, bundle)
    assert dg.load(bundle).signatures == saxpy.signatures
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["saxpy.dgk"]


def test_bundle_never_carries_the_python_function(tmp_path):
    path = tmp_path / "sim.dgk"
    with dask.config.set({"daskgpu.simulate": True}):
        assert saxpy.ptx_kernel().images[0].py_func is not None  # what pickling would ship
        dg.save(saxpy, path)
    text = path.read_text()
    assert "py_func" not in text
    assert all(im.py_func is None for im in dg.load(path).images)


def test_uncompiled_kernel_names_the_fix(tmp_path):
    lazy = dg.jit(_store_one)
    with pytest.raises(dg.PicklingError, match=r"specialize"):
        dg.save(lazy, tmp_path / "x.dgk")
    assert not (tmp_path / "x.dgk").exists()


def test_numba_dispatcher_and_other_objects_refused(tmp_path):
    with pytest.raises(dg.PicklingError, match=r"dg\.kernel\(dispatcher"):
        dg.save(cuda.jit(_store_one), tmp_path / "x.dgk")
    with pytest.raises(dg.PicklingError, match=r"got function"):
        dg.save(_store_one, tmp_path / "x.dgk")


# -- refusing what is not a valid bundle ----------------------------------------
def test_newer_version_asks_for_an_upgrade(bundle):
    _rewrite(bundle, lambda d: d.update(version=2, daskgpu="9.9.9", extra="new field"))
    with pytest.raises(dg.BundleError,
                       match=r"version 2 bundle .*daskgpu 9\.9\.9.*reads bundle version 1.*"
                             r"pip install -U daskgpu"):
        dg.load(bundle)


def test_changed_content_is_corrupt_or_tampered(bundle):
    doc = json.loads(bundle.read_text())
    doc["images"][0]["ptx"][0][1] = doc["images"][0]["ptx"][0][1].replace("mul", "add", 1)
    bundle.write_text(json.dumps(doc))
    with pytest.raises(dg.BundleError, match="is corrupt: its content does not match"):
        dg.load(bundle)


def test_truncated_file_is_refused(bundle):
    raw = bundle.read_bytes()
    bundle.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(dg.BundleError, match="not a JSON document"):
        dg.load(bundle)


def test_missing_hash_is_refused(bundle):
    _rewrite(bundle, lambda d: d.pop("sha256"), rehash=False)
    with pytest.raises(dg.BundleError, match="no valid 'sha256'"):
        dg.load(bundle)


def _image(d):
    return d["images"][0]


MUTATIONS = {
    "unknown top-level field": (lambda d: d.update(comment="hi"), r"unknown fields \['comment'\]"),
    "python function smuggled in": (
        lambda d: _image(d).update(py_func=base64.b64encode(b"\x80\x05.").decode()),
        r"unknown fields \['py_func'\]"),
    "field missing": (lambda d: _image(d).pop("writes"), r"lacks the fields \['writes'\]"),
    "wrong format": (lambda d: d.update(format="other"), "not a daskgpu bundle"),
    "version not int": (lambda d: d.update(version="1"), "invalid bundle version"),
    "no images": (lambda d: d.update(images=[]), "holds no compiled image"),
    "bool for int": (lambda d: _image(d).update(grid_ndim=True), r"grid_ndim must be int"),
    "grid rank": (lambda d: _image(d).update(grid_ndim=4), r"grid_ndim must be in 0\.\.3"),
    "name type": (lambda d: _image(d).update(name=7), r"name must be str"),
    "entry not a symbol": (lambda d: _image(d).update(entry="a b"), "is not a PTX symbol"),
    "entry not in ptx": (lambda d: _image(d).update(entry="other_symbol"),
                         "not PTX defining the entry"),
    "cc not a pair": (lambda d: _image(d)["ptx"][0].__setitem__(0, [7, 5, 0]), "must be a pair"),
    "cc not int": (lambda d: _image(d)["ptx"][0].__setitem__(0, [7.0, 5]),
                   "compute capability must be int"),
    "targets not ascending": (lambda d: _image(d)["ptx"].reverse(), "targets ascending"),
    "no ptx": (lambda d: _image(d).update(ptx=[]), "one PTX per target"),
    "arg shape": (lambda d: _image(d)["args"][0].pop(), r"\[kind, dtype, ndim, layout\]"),
    "arg dtype": (lambda d: _image(d)["args"][0].__setitem__(1, "object"),
                  "not a valid kernel image: daskgpu supports parameters of dtypes"),
    "scalar with rank": (lambda d: _image(d)["args"][1].__setitem__(2, 1),
                         r"ndim must be in 0\.\.0"),
    "write out of range": (lambda d: _image(d).update(writes=[9]), r"writes must be in 0\.\.3"),
    "write to a scalar": (lambda d: _image(d).update(writes=[1]), "is not an array"),
    "writes unsorted": (lambda d: _image(d).update(writes=[2, 0]), "ascending and unique"),
    "unknown option": (lambda d: _image(d)["options"].append(["evil", 1]), "unknown option 'evil'"),
    "duplicate option": (lambda d: _image(d)["options"].append(["debug", True]), "appears twice"),
    "option type": (lambda d: _image(d)["options"].__setitem__(0, ["debug", "yes"]),
                    r"\(debug\) must be bool"),
    "max registers": (lambda d: _image(d)["options"].__setitem__(3, ["max_registers", 999]),
                      r"must be in 1\.\.255"),
    "version value type": (lambda d: _image(d)["versions"].append(["x", 1]), "must be str"),
    "link not an object": (lambda d: _image(d).update(links=[["a", "ptx", ""]]),
                           r"links\[0\] must be dict"),
    "link kind": (lambda d: _image(d).update(links=[{"name": "a", "kind": "python", "data": ""}]),
                  "kind must be one of"),
    "link data": (lambda d: _image(d).update(links=[{"name": "a", "kind": "ptx", "data": "**"}]),
                  "is not base64"),
    "link extra key": (
        lambda d: _image(d).update(links=[{"name": "a", "kind": "ptx", "data": "", "x": 1}]),
        r"unknown fields \['x'\]"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_every_field_is_validated(bundle, mutation):
    mutate, message = MUTATIONS[mutation]
    _rewrite(bundle, mutate)
    with pytest.raises(dg.BundleError, match=message):
        dg.load(bundle)


def test_duplicate_json_keys_are_refused(bundle):
    text = bundle.read_text()
    bundle.write_text(text.replace('"format":', '"format": "x", "format":', 1))
    with pytest.raises(dg.BundleError, match="duplicate key 'format'"):
        dg.load(bundle)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(dg.BundleError, match="does not exist"):
        dg.load(tmp_path / "nope.dgk")
    with pytest.raises(dg.BundleError, match="is a directory"):
        dg.load(tmp_path)


def test_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.dgk"
    path.write_text("[1, 2]")
    with pytest.raises(dg.BundleError, match="a JSON list, not an object"):
        dg.load(path)


class _Payload:
    """Unpickling this would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_pickle_payload_is_refused_without_running(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.dgk"
    path.write_bytes(pickle.dumps(_Payload(str(marker)), protocol=protocol))
    # The payload is live: unpickling it would create the marker.
    pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.unlink()
    with pytest.raises(dg.BundleError, match="pickle|not a JSON document"):
        dg.load(path)
    assert not marker.exists()


def test_pickle_bytes_inside_a_field_stay_inert(bundle, tmp_path):
    marker = tmp_path / "pwned"
    blob = base64.b64encode(pickle.dumps(_Payload(str(marker)))).decode()
    # A correctly hashed bundle whose link data is a pickle: loaded as plain bytes.
    _rewrite(bundle, lambda d: _image(d).update(
        links=[{"name": "evil.o", "kind": "object", "data": blob}]))
    k = dg.load(bundle)
    assert k.images[0].links[0].data == base64.b64decode(blob)
    assert not marker.exists()


# -- the worker half: no numba ---------------------------------------------------
_NO_NUMBA = """
import sys
sys.modules["numba"] = None          # any import of numba now fails
import daskgpu as dg
k = dg.load(sys.argv[1])
print(k.signatures)
leaked = sorted(m for m in sys.modules if m.startswith("numba.") or m == "numba_cuda")
assert not leaked, leaked
"""


def _run_without_numba(script, *args):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )


def test_load_needs_no_numba(bundle):
    proc = _run_without_numba(_NO_NUMBA, bundle)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(saxpy.signatures)


@pytest.mark.gpu
def test_loaded_bundle_launches_without_numba(bundle):
    script = _NO_NUMBA + """
import numpy as np
x = np.arange(1000, dtype=np.float32)
y = np.ones(1000, dtype=np.float32)
out = k.forall(x.size)(np.zeros_like(x), np.float32(2), x, y)
assert np.allclose(out, 2 * x + y), out[:5]
print("launched")
"""
    proc = _run_without_numba(script, bundle)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("launched")


def test_file_is_readable_json_with_the_documented_layout(bundle):
    doc = json.loads(bundle.read_text())
    assert doc["format"] == "daskgpu-bundle" and doc["version"] == 1
    assert doc["daskgpu"] == dg.__version__
    assert set(doc["images"][0]) == {"name", "entry", "ptx", "args", "writes", "grid_ndim",
                                     "links", "options", "versions", "exceptions"}
    assert os.path.getsize(bundle) == read(bundle)[1].size


def test_numba_dispatcher_options_are_stored_as_booleans(tmp_path):
    # Numba spells debug/lineinfo as 0/1; the bundle stores strict booleans.
    k = dg.kernel(cuda.jit(_store_one), ["void(int32[::1])"])
    path = tmp_path / "from_numba.dgk"
    dg.save(k, path)
    options = dict(dg.load(path).images[0].options)
    assert all(type(options[key]) is bool for key in ("debug", "lineinfo", "fastmath"))
