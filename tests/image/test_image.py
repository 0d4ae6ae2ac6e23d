"""KernelImage as plain data: pickling, identity, hashing and PTX selection."""

import dataclasses
import pickle
import subprocess
import sys
import textwrap

import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._image.argspec import ArgSpec
from daskgpu._image.image import KernelImage, LinkInput


@dg.jit("void(float32[::1], float32, int64[:, :])", targets=["7.5", "8.0"])
def axpy(out, a, idx):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * idx[i, 0]


IMAGE = axpy.images[0]

F32 = ArgSpec("array", "float32", 1, "C")


def synthetic(**kw):
    fields = dict(
        name="mod.k", entry="k_entry",
        ptx=(((7, 5), "ptx75"), ((8, 0), "ptx80"), ((9, 0), "ptx90")),
        args=(F32, ArgSpec("scalar", "float32")), writes=(0,),
    )
    fields.update(kw)
    return KernelImage(**fields)


def test_compiled_image_fields():
    assert IMAGE.name.endswith(".axpy")
    assert IMAGE.args == (
        ArgSpec("array", "float32", 1, "C"), ArgSpec("scalar", "float32"),
        ArgSpec("array", "int64", 2, "A"),
    )
    assert IMAGE.signature == "(float32[::1], float32, int64[:, :])"
    assert IMAGE.writes == (0,)
    assert IMAGE.grid_ndim == 1
    assert IMAGE.targets == ((7, 5), (8, 0))
    assert IMAGE.py_func is None
    for _, ptx in IMAGE.ptx:
        assert f".entry {IMAGE.entry}" in ptx


def test_pickle_round_trip_is_equal_with_a_stable_hash():
    back = pickle.loads(pickle.dumps(IMAGE))
    assert back == IMAGE
    assert back is not IMAGE
    assert back.hash == IMAGE.hash
    assert hash(back) == hash(IMAGE)
    assert back.ptx == IMAGE.ptx and back.args == IMAGE.args
    assert all(isinstance(a, ArgSpec) for a in back.args)
    assert back.versions == IMAGE.versions


@pytest.mark.slow
def test_hash_is_the_same_in_another_process():
    code = textwrap.dedent("""
        import pickle, sys
        sys.modules["numba"] = None
        print(pickle.loads(sys.stdin.buffer.read()).hash)
    """)
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(IMAGE),
                         capture_output=True, check=True).stdout.decode().strip()
    assert out == IMAGE.hash


def test_reduce_uses_plain_data_only():
    fn, (fields,) = IMAGE.__reduce__()
    assert fn.__module__ == "daskgpu._image.image"
    assert "py_func" not in fields

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, (tuple, list)):
            return all(plain(v) for v in x)
        return x is None or isinstance(x, (str, bytes, int, float, bool))

    assert plain(fields)
    assert fn(fields) == IMAGE


def test_hash_changes_with_ptx_links_options_and_writes():
    base = synthetic()
    assert synthetic().hash == base.hash
    variants = [
        synthetic(ptx=(((7, 5), "ptx75 changed"), ((8, 0), "ptx80"), ((9, 0), "ptx90"))),
        synthetic(ptx=(((7, 5), "ptx75"), ((8, 0), "ptx80"))),
        synthetic(links=(LinkInput("a.ptx", "ptx", b"x"),)),
        synthetic(options=(("max_registers", 32),)),
        synthetic(writes=()),
        synthetic(entry="other"),
        synthetic(grid_ndim=2),
        synthetic(args=(F32, ArgSpec("scalar", "float64"))),
    ]
    hashes = {v.hash for v in variants}
    assert base.hash not in hashes
    assert len(hashes) == len(variants)
    assert all(v != base for v in variants)
    link_a = synthetic(links=(LinkInput("a.ptx", "ptx", b"x"),))
    link_b = synthetic(links=(LinkInput("a.ptx", "ptx", b"y"),))
    assert link_a.hash != link_b.hash


def test_hash_is_hex_sha256_and_cached():
    h = IMAGE.hash
    assert len(h) == 64 and int(h, 16) >= 0
    assert IMAGE.hash is h


def test_images_compare_equal_regardless_of_py_func():
    with_fn = IMAGE.with_py_func(b"pickled function")
    assert with_fn == IMAGE
    assert hash(with_fn) == hash(IMAGE)
    assert with_fn.hash == IMAGE.hash
    assert with_fn.py_func == b"pickled function" and IMAGE.py_func is None
    back = pickle.loads(pickle.dumps(with_fn))
    assert back.py_func == b"pickled function"
    assert back.with_py_func(None).py_func is None
    assert b"pickled function" not in pickle.dumps(IMAGE)


def test_images_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        IMAGE.ptx = ()


@pytest.mark.parametrize("cc, expected", [
    ((7, 5), "ptx75"), ((7, 7), "ptx75"), ((8, 0), "ptx80"), ((8, 6), "ptx80"),
    ((8, 9), "ptx80"), ((9, 0), "ptx90"), ((10, 0), "ptx90"), ((12, 1), "ptx90"),
    ((7, 0), None), ((6, 1), None),
])
def test_ptx_for_picks_the_highest_target_at_or_below_cc(cc, expected):
    assert synthetic().ptx_for(cc) == expected
    assert synthetic().ptx_for(list(cc)) == expected


def test_ptx_for_compiled_targets():
    assert "\n.target sm_75" in IMAGE.ptx_for((7, 5))
    assert "\n.target sm_75" in IMAGE.ptx_for((7, 9))
    assert "\n.target sm_80" in IMAGE.ptx_for((9, 0))
    assert IMAGE.ptx_for((7, 0)) is None


def test_options_and_repr():
    im = synthetic(options=(("fastmath", True), ("max_registers", None)))
    assert im.option("fastmath") is True
    assert im.option("max_registers") is None
    assert im.option("missing", 3) == 3
    assert repr(im) == f"<KernelImage mod.k(float32[::1], float32) targets=[7.5, 8.0, 9.0] hash={im.hash[:12]}>"


def test_image_without_ptx_is_refused():
    with pytest.raises(ValueError, match="'mod.k' has no PTX"):
        synthetic(ptx=())


def test_write_set_must_name_arrays():
    with pytest.raises(ValueError, match="write set index 1 of 'mod.k' is not an array"):
        synthetic(writes=(1,))


def test_link_inputs_round_trip():
    im = synthetic(links=(LinkInput("a.ptx", "ptx", b"\x00abc"), LinkInput("b.a", "library", b"!")))
    back = pickle.loads(pickle.dumps(im))
    assert back.links == im.links
    assert all(isinstance(x, LinkInput) for x in back.links)
    assert back.hash == im.hash
