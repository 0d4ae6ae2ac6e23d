"""Bundles bounded before parsing, exception classes from an allow-list, HMAC when keyed."""

import json

import dask.config
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu import BundleError, DeviceError
from daskgpu._runtime import bundle as bundle_mod
from daskgpu._runtime.faults import device_exception

dg._config.register()


@dg.jit("void(float32[::1])")
def fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


def _forge(path, mutate):
    """Change a bundle as a forger would: content and its sha256 both rewritten."""
    doc = json.loads(path.read_text())
    content = {k: v for k, v in doc.items() if k not in ("sha256", "hmac-sha256")}
    mutate(content)
    doc.update(content, sha256=bundle_mod._digest(content))
    path.write_text(json.dumps(doc))


def test_deep_nesting_is_a_bundle_error_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.dgk"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(BundleError, match="nests JSON more than"):
        dg.load(path)
    path.write_text('{"format": "daskgpu-bundle", "x": "' + "[" * 1000 + '"}')
    with pytest.raises(BundleError) as err:  # brackets inside a string do not count
        dg.load(path)
    assert "nests" not in str(err.value)


def test_size_is_bounded_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "fill.dgk"
    dg.save(fill, path)
    monkeypatch.setattr(bundle_mod, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(BundleError, match="bytes, more than a kernel bundle may be"):
        dg.load(path)


@pytest.mark.parametrize("name", ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "Warning",
                                  "BaseExceptionGroup", "MemoryError", "StopIteration"])
def test_exception_classes_resolve_only_from_the_allow_list(tmp_path, name):
    path = tmp_path / "fill.dgk"
    dg.save(fill, path)
    _forge(path, lambda c: c["images"][0]["exceptions"].append([1, name, ["boom"], None]))
    image = dg.load(path).images[0]
    exc = device_exception(image, 1, (0, 0, 0), (0, 0, 0))
    assert type(exc) is DeviceError and f"{name}: " in str(exc)


def test_ordinary_exception_classes_still_resolve(tmp_path):
    path = tmp_path / "fill.dgk"
    dg.save(fill, path)
    _forge(path, lambda c: c["images"][0]["exceptions"].append([1, "IndexError", ["i"], None]))
    exc = device_exception(dg.load(path).images[0], 1, (0, 0, 0), (0, 0, 0))
    assert type(exc) is IndexError


def test_a_key_signs_and_detects_tampering(tmp_path):
    path = tmp_path / "fill.dgk"
    dg.save(fill, path, key="s3cret")
    assert dg.load(path, key="s3cret").signatures == ["(float32[::1])"]
    assert bundle_mod.read(path)[1].signed
    dg.load(path)  # without a key, the hash alone is checked
    with pytest.raises(BundleError, match="fails its HMAC"):
        dg.load(path, key="other")
    _forge(path, lambda c: c.update(daskgpu="9.9.9"))  # hash recomputed: only the HMAC sees it
    dg.load(path)
    with pytest.raises(BundleError, match="fails its HMAC"):
        dg.load(path, key="s3cret")


def test_the_bundle_key_setting_signs_and_requires_signatures(tmp_path):
    unsigned, signed = tmp_path / "u.dgk", tmp_path / "s.dgk"
    dg.save(fill, unsigned)
    with dask.config.set({"daskgpu.bundle-key": "team-key"}):
        dg.save(fill, signed)
        dg.load(signed)
        with pytest.raises(BundleError, match="is not signed"):
            dg.load(unsigned)
    assert "hmac-sha256" in json.loads(signed.read_text())
    with pytest.raises(BundleError, match="fails its HMAC"):
        dg.load(signed, key="not-the-team-key")


def test_an_unkeyed_mismatch_says_corrupt_not_tampered(tmp_path):
    path = tmp_path / "fill.dgk"
    dg.save(fill, path)
    doc = json.loads(path.read_text())
    doc["daskgpu"] = "0.0.0"
    path.write_text(json.dumps(doc))
    with pytest.raises(BundleError, match="is corrupt") as err:
        dg.load(path)
    assert "tamper" not in str(err.value)
