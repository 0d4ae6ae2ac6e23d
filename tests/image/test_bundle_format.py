"""The bundle format: data-only JSON, bounded before parsing, every field validated,
integrity-checked, sealed with an HMAC when keyed."""

import base64
import hashlib
import json
import pathlib
import pickle

import dask.config
import pytest

import daskgpu as dg
from daskgpu import BundleError
from daskgpu._image.bundle import (
    decode_bundle,
    decode_image,
    document,
    encode_image,
    integrity,
    read_bundle_bytes,
)


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


def _forge(path, mutate):
    """Change a bundle as a forger would: content and its sha256 both rewritten."""
    doc = json.loads(path.read_text())
    content = {k: v for k, v in doc.items() if k not in ("sha256", "hmac-sha256")}
    mutate(content)
    doc.update(content, sha256=integrity.digest(content))
    path.write_text(json.dumps(doc))


# -- the layout ------------------------------------------------------------------
def test_file_is_readable_json_with_the_documented_layout(bundle):
    doc = json.loads(bundle.read_text())
    assert doc["format"] == "daskgpu-bundle" and doc["version"] == 1
    assert doc["daskgpu"] == dg.__version__
    assert set(doc["images"][0]) == {"name", "entry", "ptx", "args", "writes", "grid_ndim",
                                     "links", "options", "versions", "exceptions",
                                     "positions"}
    path = str(bundle)
    assert bundle.stat().st_size == decode_bundle(read_bundle_bytes(path), path)[1].size


def test_an_image_encodes_and_decodes_without_a_file(bundle_kernels):
    for image in bundle_kernels.saxpy.images:
        encoded = encode_image(image)
        assert json.loads(json.dumps(encoded)) == encoded  # JSON-able as it is
        assert decode_image(encoded, 0, "<memory>") == image


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


# -- bounds checked before parsing -------------------------------------------------
def test_deep_nesting_is_a_bundle_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.dgk"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(BundleError, match="nests JSON more than"):
        dg.load(path)
    path.write_text('{"format": "daskgpu-bundle", "x": "' + "[" * 1000 + '"}')
    with pytest.raises(BundleError) as err:  # brackets inside a string do not count
        dg.load(path)
    assert "nests" not in str(err.value)


def test_size_is_bounded_before_reading(tmp_path, monkeypatch, bundle_kernels):
    path = tmp_path / "fill.dgk"
    dg.save(bundle_kernels.fill, path)
    monkeypatch.setattr(document, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(BundleError, match="bytes, more than a kernel bundle may be"):
        dg.load(path)


# -- integrity: sha256, and the HMAC when keyed ---------------------------------------
def test_a_key_signs_and_detects_tampering(tmp_path, bundle_kernels):
    path = tmp_path / "fill.dgk"
    dg.save(bundle_kernels.fill, path, key="s3cret")
    assert dg.load(path, key="s3cret").signatures == ["(float32[::1])"]
    assert decode_bundle(read_bundle_bytes(str(path)), str(path))[1].signed
    dg.load(path)  # without a key, the hash alone is checked
    with pytest.raises(BundleError, match="fails its HMAC"):
        dg.load(path, key="other")
    _forge(path, lambda c: c.update(daskgpu="9.9.9"))  # hash recomputed: only the HMAC sees it
    dg.load(path)
    with pytest.raises(BundleError, match="fails its HMAC"):
        dg.load(path, key="s3cret")


def test_the_bundle_key_setting_signs_and_requires_signatures(tmp_path, bundle_kernels):
    unsigned, signed = tmp_path / "u.dgk", tmp_path / "s.dgk"
    dg.save(bundle_kernels.fill, unsigned)
    with dask.config.set({"daskgpu.bundle-key": "team-key"}):
        dg.save(bundle_kernels.fill, signed)
        dg.load(signed)
        with pytest.raises(BundleError, match="is not signed"):
            dg.load(unsigned)
    assert "hmac-sha256" in json.loads(signed.read_text())
    with pytest.raises(BundleError, match="fails its HMAC"):
        dg.load(signed, key="not-the-team-key")


def test_an_unkeyed_mismatch_says_corrupt_not_tampered(tmp_path, bundle_kernels):
    path = tmp_path / "fill.dgk"
    dg.save(bundle_kernels.fill, path)
    doc = json.loads(path.read_text())
    doc["daskgpu"] = "0.0.0"
    path.write_text(json.dumps(doc))
    with pytest.raises(BundleError, match="is corrupt") as err:
        dg.load(path)
    assert "tamper" not in str(err.value)
