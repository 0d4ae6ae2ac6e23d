"""Kernel files: dg.save and dg.load round-trip kernels, loadable without numba.

What the file holds and what is refused is tests/image/test_bundle_format.py.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

import dask.config
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._image.bundle import integrity
from daskgpu._runtime.faults import device_exception
from daskgpu._runtime.kernel_files import read

REPO = pathlib.Path(__file__).resolve().parents[1]


def _forge(path, mutate):
    """Change a bundle as a forger would: content and its sha256 both rewritten."""
    doc = json.loads(path.read_text())
    content = {k: v for k, v in doc.items() if k not in ("sha256", "hmac-sha256")}
    mutate(content)
    doc.update(content, sha256=integrity.digest(content))
    path.write_text(json.dumps(doc))


# -- round trips ----------------------------------------------------------------
def test_round_trip_keeps_every_field(bundle, bundle_kernels):
    k = dg.load(bundle)
    assert isinstance(k, dg.PTXKernel)
    assert k.images == bundle_kernels.saxpy.images
    assert [im.hash for im in k.images] == [im.hash for im in bundle_kernels.saxpy.images]
    assert k.signatures == bundle_kernels.saxpy.signatures
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


def test_output_is_deterministic_and_hash_returned(tmp_path, bundle_kernels):
    a, b = tmp_path / "a.dgk", tmp_path / "b.dgk"
    digest = dg.save(bundle_kernels.saxpy, a)
    dg.save(bundle_kernels.saxpy, b)
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["sha256"] == digest
    assert read(a)[1].sha256 == digest


def test_read_describes_the_file(bundle, bundle_kernels):
    kernel, info = read(bundle)
    assert kernel.signatures == bundle_kernels.saxpy.signatures
    assert (info.path, info.version, info.producer) == (str(bundle), 1, dg.__version__)
    assert info.size == bundle.stat().st_size and not info.signed


def test_loaded_kernel_saves_again_identically(bundle, tmp_path):
    again = tmp_path / "again.dgk"
    dg.save(dg.load(bundle), again)
    assert again.read_bytes() == bundle.read_bytes()


def test_save_replaces_existing_file_and_leaves_no_temporaries(bundle, bundle_kernels):
    bundle.write_text("old")
    dg.save(bundle_kernels.saxpy, bundle)
    assert dg.load(bundle).signatures == bundle_kernels.saxpy.signatures
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["saxpy.dgk"]


def test_bundle_never_carries_the_python_function(tmp_path, bundle_kernels):
    path = tmp_path / "sim.dgk"
    with dask.config.set({"daskgpu.simulate": True}):
        assert bundle_kernels.saxpy.ptx_kernel().images[0].py_func is not None  # what pickling would ship
        dg.save(bundle_kernels.saxpy, path)
    text = path.read_text()
    assert "py_func" not in text
    assert all(im.py_func is None for im in dg.load(path).images)


def test_numba_dispatcher_options_are_stored_as_booleans(tmp_path):
    # Numba spells debug/lineinfo as 0/1; the bundle stores strict booleans.
    k = dg.kernel(cuda.jit(_store_one), ["void(int32[::1])"])
    path = tmp_path / "from_numba.dgk"
    dg.save(k, path)
    options = dict(dg.load(path).images[0].options)
    assert all(type(options[key]) is bool for key in ("debug", "lineinfo", "fastmath"))


# -- what save and load refuse ----------------------------------------------------
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


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(dg.BundleError, match="does not exist"):
        dg.load(tmp_path / "nope.dgk")
    with pytest.raises(dg.BundleError, match="is a directory"):
        dg.load(tmp_path)


# -- exception classes of a loaded kernel ---------------------------------------------
@pytest.mark.parametrize("name", ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "Warning",
                                  "BaseExceptionGroup", "MemoryError", "StopIteration"])
def test_exception_classes_outside_the_allow_list_are_refused(tmp_path, name, bundle_kernels):
    path = tmp_path / "fill.dgk"
    dg.save(bundle_kernels.fill, path)
    _forge(path, lambda c: c["images"][0]["exceptions"].append([1, name, ["boom"], None]))
    with pytest.raises(dg.BundleError, match=f"'{name}' is refused: a bare name must be one of"):
        dg.load(path)


def test_ordinary_exception_classes_still_resolve(tmp_path, bundle_kernels):
    path = tmp_path / "fill.dgk"
    dg.save(bundle_kernels.fill, path)
    _forge(path, lambda c: c["images"][0]["exceptions"].append([1, "IndexError", ["i"], None]))
    exc = device_exception(dg.load(path).images[0], 1, (0, 0, 0), (0, 0, 0))
    assert type(exc) is IndexError


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
        check=False, capture_output=True, text=True, cwd=REPO, timeout=120,
    )


@pytest.mark.slow
def test_load_needs_no_numba(bundle, bundle_kernels):
    proc = _run_without_numba(_NO_NUMBA, bundle)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(bundle_kernels.saxpy.signatures)


@pytest.mark.slow
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
