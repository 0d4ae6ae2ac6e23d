"""compile_image and CompileOptions: PTX per target with no driver, link inputs, options."""

import re

import dask
import pytest
from numba import cuda
from numba.cuda import types

import daskgpu as dg
from daskgpu._compiler.compile import CompileOptions, compile_image, parse_cc
from daskgpu._image.argspec import ArgSpec
from daskgpu._image.image import KernelImage

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


def double(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] * 2


ARGS = (types.float32[::1],)


@pytest.mark.parametrize("text, cc", [
    ("8.0", (8, 0)), ("7.5", (7, 5)), ("10.0", (10, 0)), ("12.1", (12, 1)),
    ("80", (8, 0)), ("120", (12, 0)), (86, (8, 6)), ((9, 0), (9, 0)), ([7, 5], (7, 5)),
    ("sm_90", (9, 0)), ("SM_75", (7, 5)), ("compute_80", (8, 0)), ("sm_100", (10, 0)),
])
def test_parse_cc(text, cc):
    assert parse_cc(text) == cc


@pytest.mark.parametrize("text", ["", "8", "8.x", "sm_", "banana", "8.0.1", None])
def test_parse_cc_refuses(text):
    with pytest.raises(dg.CompileError, match=r"cannot read compute capability .*'8\.0', \(8, 0\) or 'sm_80'"):
        parse_cc(text)


def test_options_targets_sorted_unique_and_defaulted():
    assert CompileOptions(targets=("9.0", "7.5", (9, 0))).targets == ((7, 5), (9, 0))
    assert CompileOptions().targets == (parse_cc(dg._config.get("target-cc")),)
    with dask.config.set({"daskgpu.target-cc": "sm_86"}):
        assert CompileOptions().targets == ((8, 6),)


def test_options_max_registers_bounds():
    assert CompileOptions(max_registers=1).max_registers == 1
    assert CompileOptions(max_registers=255).max_registers == 255
    for bad in (0, 256, -5):
        with pytest.raises(dg.CompileError, match=rf"max_registers must be in 1\.\.255, got {bad}"):
            CompileOptions(max_registers=bad)


def test_options_are_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        CompileOptions().fastmath = True


def test_compile_image_needs_no_driver():
    image = compile_image(double, ARGS, CompileOptions(targets=("7.5", "8.0", "9.0")))
    assert isinstance(image, KernelImage)
    assert image.name == f"{double.__module__}.double"
    assert image.args == (ArgSpec("array", "float32", 1, "C"),)
    assert image.writes == (0,) and image.grid_ndim == 1
    assert image.targets == ((7, 5), (8, 0), (9, 0))
    for cc, ptx in image.ptx:
        assert re.search(rf"^\.target sm_{cc[0]}{cc[1]}$", ptx, re.M)
        # Exactly one kernel entry, the image's entry symbol.
        assert re.findall(r"\.entry\s+(\S+)\s*\(", ptx) == [image.entry]
    assert image.py_func is None


def test_debug_and_opt_change_the_ptx():
    plain = compile_image(double, ARGS, CompileOptions())
    noopt = compile_image(double, ARGS, CompileOptions(opt=False))
    debug = compile_image(double, ARGS, CompileOptions(debug=True, opt=False))
    assert ".debug_info" in debug.ptx[0][1] and ".debug_info" not in plain.ptx[0][1]
    assert debug.option("debug") is True and plain.option("debug") is False
    assert noopt.ptx[0][1] != plain.ptx[0][1]


def test_compile_errors_are_compile_errors_naming_the_kernel():
    def untyped(a):
        a[0] = undefined_name  # noqa: F821

    with pytest.raises(dg.CompileError, match=r"compiling .*untyped for \(array\(float32, 1d, C\)\) failed"):
        compile_image(untyped, ARGS, CompileOptions())


# -- link inputs -------------------------------------------------------------------------------

PLUS_ONE_CU = 'extern "C" __device__ int plus_one(int* ret, int x) { *ret = x + 1; return 0; }\n'
HALF_CU = """#include <cuda_fp16.h>
extern "C" __device__ int plus_one(int* ret, int x) {
    *ret = __half2int_rn(__hadd(__int2half_rn(x), __int2half_rn(1)));
    return 0;
}
"""

plus_one = cuda.declare_device("plus_one", "int32(int32)")


def bump(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = plus_one(a[i])


@pytest.mark.parametrize("source", [PLUS_ONE_CU, HALF_CU], ids=["plain", "with-cuda-header"])
def test_cu_link_file_compiles_to_ptx_without_a_gpu(tmp_path, source):
    path = tmp_path / "plus_one.cu"
    path.write_text(source)
    image = compile_image(bump, (types.int32[::1],),
                          CompileOptions(targets=("7.5", "9.0"), link=(str(path),)))
    (link,) = image.links
    assert (link.name, link.kind) == ("plus_one.ptx", "ptx")
    text = link.data.decode()
    assert re.search(r"\.visible \.func .*plus_one\(", text)
    # Compiled once, for the lowest target: its PTX links for every higher one.
    assert re.search(r"^\.target sm_75$", text, re.M)
    assert not link.data.endswith(b"\0")


def test_cu_link_file_that_does_not_compile(tmp_path):
    path = tmp_path / "broken.cu"
    path.write_text('extern "C" __device__ int f(int* r, int x) { *r = x + ; return 0; }\n')
    with pytest.raises(dg.CompileError, match=r"compiling link file 'broken\.cu' with NVRTC failed.*\n.*expected an expression"):
        compile_image(bump, (types.int32[::1],), CompileOptions(link=(str(path),)))


@pytest.mark.parametrize("ext, kind", [
    (".ptx", "ptx"), (".cubin", "cubin"), (".fatbin", "fatbin"), (".ltoir", "ltoir"),
    (".o", "object"), (".a", "library"), (".PTX", "ptx"),
])
def test_link_kinds_from_extensions(tmp_path, ext, kind):
    path = tmp_path / f"blob{ext}"
    path.write_bytes(b"\x00\x01payload\xff")
    image = compile_image(double, ARGS, CompileOptions(link=(str(path),)))
    assert [(x.name, x.kind, x.data) for x in image.links] == [
        (f"blob{ext}", kind, b"\x00\x01payload\xff")]


def test_several_link_files_keep_their_order(tmp_path):
    paths = []
    for name in ("b.ptx", "a.o", "c.a"):
        (tmp_path / name).write_bytes(name.encode())
        paths.append(str(tmp_path / name))
    image = compile_image(double, ARGS, CompileOptions(link=tuple(paths)))
    assert [x.name for x in image.links] == ["b.ptx", "a.o", "c.a"]
    assert [x.data for x in image.links] == [b"b.ptx", b"a.o", b"c.a"]


STABLE_SRC = '''
import daskgpu as dg
from numba import cuda

@cuda.jit(device=True)
def put(a, i):
    a[i] = 1

def fill(x):
    put(x, 0)

def other(x):
    x[0] = 2
'''


@pytest.mark.slow
def test_image_hash_does_not_depend_on_compile_order(tmp_path):
    # Numba numbers functions per process; the symbols daskgpu ships must not.
    import subprocess
    import sys

    (tmp_path / "stable_mod.py").write_text(STABLE_SRC)
    script = (
        "import sys; sys.path.insert(0, {path!r}); import stable_mod as m, daskgpu as dg\n"
        "{warm}"
        "print(dg.jit('void(float32[::1])')(m.fill).images[0].hash)\n"
    )
    hashes = set()
    for warm in ("", "dg.jit('void(float32[::1])')(m.other); dg.jit('void(int64[::1])')(m.fill)\n"):
        out = subprocess.run([sys.executable, "-c", script.format(path=str(tmp_path), warm=warm)],
                             capture_output=True, text=True, check=True)
        hashes.add(out.stdout.strip())
    assert len(hashes) == 1


def test_a_store_through_a_pointer_argument_is_not_a_copy_back():
    from numba import types as nbtypes
    from numba.cuda.np.numpy_support import carray

    def add(a_ptr, out):
        a = carray(a_ptr, (1,), dtype=cuda.float32)
        a[0] += 1.2
        out[0] = 1

    image = dg.jit(nbtypes.void(nbtypes.CPointer(nbtypes.float32), nbtypes.int32[::1]))(add).images[0]
    assert str(image.args[0]) == "uint64" and image.writes == (1,)
