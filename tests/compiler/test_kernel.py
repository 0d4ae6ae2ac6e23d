"""The client kernel: compiling without a GPU, targets, options, links, and its errors."""

import pickle
import re
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
from numba import cuda
from numba.cuda import dispatcher as numba_dispatcher
from numba.cuda import types

import daskgpu as dg
from daskgpu._compiler.target import compiling_for

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


@cuda.jit(device=True)
def store(a, i, v):
    a[i] = v


@dg.jit("void(float32[::1], float32)", targets=["7.5", "9.0"])
def fill(out, v):
    i = cuda.grid(1)
    if i < out.size:
        store(out, i, v)


def _div(a, b):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] / b[i]


def _entry_params(image, cc=None):
    """The PTX ``.param`` types of the image's entry, in order."""
    ptx = image.ptx[0][1] if cc is None else image.ptx_for(cc)
    m = re.search(r"\.entry\s+" + re.escape(image.entry) + r"\s*\((.*?)\)", ptx, re.S)
    assert m is not None, "entry not found in PTX"
    return re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)", m.group(1))


# -- compiling with no GPU ---------------------------------------------------------


@pytest.mark.nogpu
def test_numba_device_lookup_fails_without_a_driver():
    # What compiling_for works around: numba-cuda asks the current device for
    # its cc when a kernel calls a device function, which fails with no driver.
    with pytest.raises(Exception, match="(?i)driver"):
        numba_dispatcher.get_current_device()


def test_kernel_calling_a_device_function_compiles_without_a_gpu():
    image = fill.images[0]
    assert image.writes == (0,)  # the store happens in the device function
    assert image.grid_ndim == 1
    # The device function was compiled into the kernel's PTX for each target.
    for _, ptx in image.ptx:
        assert f".visible .entry {image.entry}" in ptx
        assert "st.global.f32" in ptx


def test_compiling_for_restores_numba_device_lookup():
    original = numba_dispatcher.get_current_device
    with compiling_for((8, 6)):
        assert numba_dispatcher.get_current_device().compute_capability == (8, 6)
    assert numba_dispatcher.get_current_device is original
    with pytest.raises(RuntimeError, match="boom"):
        with compiling_for((8, 0)):
            raise RuntimeError("boom")
    assert numba_dispatcher.get_current_device is original


def test_failed_compile_restores_numba_device_lookup():
    original = numba_dispatcher.get_current_device

    def bad(a):
        store(a, 0)  # wrong number of arguments

    with pytest.raises(dg.CompileError, match="bad"):
        dg.jit("void(float32[::1])")(bad)
    assert numba_dispatcher.get_current_device is original


def test_targets_give_one_ptx_per_cc():
    image = fill.images[0]
    assert image.targets == ((7, 5), (9, 0))
    assert re.findall(r"^\.target\s+(\S+)", image.ptx[0][1], re.M) == ["sm_75"]
    assert re.findall(r"^\.target\s+(\S+)", image.ptx[1][1], re.M) == ["sm_90"]
    # Same entry and parameters in every target.
    assert _entry_params(image, (7, 5)) == _entry_params(image, (9, 0))


def test_targets_are_sorted_and_deduplicated():
    k = dg.jit("void(float32[::1], float32[::1])", targets=["9.0", (7, 5), "sm_90"])(_div)
    assert k.images[0].targets == ((7, 5), (9, 0))


def test_default_target_is_the_configured_cc():
    with dask.config.set({"daskgpu.target-cc": "8.0"}):
        k = dg.jit("void(float32[::1], float32[::1])")(_div)
    assert k.images[0].targets == ((8, 0),)
    assert "\n.target sm_80" in k.images[0].ptx[0][1]


def test_options_are_recorded_and_change_the_ptx():
    plain = dg.jit("void(float32[::1], float32[::1])")(_div).images[0]
    fast = dg.jit("void(float32[::1], float32[::1])", fastmath=True, lineinfo=True,
                  max_registers=32)(_div).images[0]
    assert plain.option("fastmath") is False and fast.option("fastmath") is True
    assert plain.option("lineinfo") is False and fast.option("lineinfo") is True
    assert plain.option("max_registers") is None and fast.option("max_registers") == 32
    # fastmath turns IEEE division into the approximate one, lineinfo adds .loc.
    assert "div.rn.f32" in plain.ptx[0][1] and "div.approx" not in plain.ptx[0][1]
    assert "div.approx" in fast.ptx[0][1]
    assert ".loc" not in plain.ptx[0][1] and ".loc" in fast.ptx[0][1]
    assert plain.hash != fast.hash


@pytest.mark.parametrize("value", [0, -1, 256, 1000])
def test_max_registers_out_of_range(value):
    with pytest.raises(dg.CompileError, match=rf"max_registers must be in 1\.\.255, got {value}"):
        dg.jit("void(float32[::1], float32[::1])", max_registers=value)(_div)


def test_unreadable_target_cc():
    with pytest.raises(dg.CompileError, match=r"cannot read compute capability 'banana'.*'8\.0'"):
        dg.jit("void(float32[::1], float32[::1])", targets=["banana"])(_div)


def test_versions_name_the_toolchain():
    import numba_cuda

    versions = dict(fill.images[0].versions)
    assert versions["numba-cuda"] == numba_cuda.__version__
    isa = re.search(r"^\.version\s+(\S+)", fill.images[0].ptx[0][1], re.M).group(1)
    assert versions["ptx-isa"] == isa


# -- link files ----------------------------------------------------------------------


plus_one_decl = cuda.declare_device("plus_one", "int32(int32)")


def _bump(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = plus_one_decl(a[i])


def test_link_file_bytes_travel_with_the_kernel(plus_one_ptx, tmp_path):
    k = dg.jit("void(int32[::1])", link=[str(plus_one_ptx)])(_bump)
    image = k.images[0]
    data = plus_one_ptx.read_bytes()
    assert [(x.name, x.kind, x.data) for x in image.links] == [("plus_one.ptx", "ptx", data)]
    assert ".extern .func" in image.ptx[0][1] and "plus_one" in image.ptx[0][1]
    # The kernel pickles; what arrives carries the file's bytes, not its path.
    blob = pickle.dumps(k)
    assert str(plus_one_ptx).encode() not in blob
    back = pickle.loads(blob)
    assert back.images[0].links == image.links
    assert back.images[0] == image


def test_link_to_a_missing_file(tmp_path):
    missing = tmp_path / "nope.ptx"
    with pytest.raises(dg.CompileError, match=f"link file '{re.escape(str(missing))}' does not exist"):
        dg.jit("void(int32[::1])", link=[str(missing)])(_bump)


def test_link_with_an_unknown_extension(tmp_path):
    path = tmp_path / "helper.txt"
    path.write_text("not code")
    with pytest.raises(dg.CompileError, match=r"cannot link .*helper\.txt.*'\.ptx'"):
        dg.jit("void(int32[::1])", link=[str(path)])(_bump)


# -- signatures and their errors -----------------------------------------------------


def _store(a, v):
    a[0] = v


@pytest.mark.parametrize("sig, match", [
    ("void(float32[:, float32)", r"cannot read the signature 'void\(float32\[:, float32\)'"),
    ("void(nosuchtype[::1], float32)", r"cannot read the signature .*nosuchtype"),
    ("int32(float32[::1], float32)", r"returns int32; write it as 'void\(\.\.\.\)'"),
])
def test_bad_signatures(sig, match):
    with pytest.raises(dg.CompileError, match=match):
        dg.jit(sig)(_store)


def test_kernel_returning_a_value():
    def ret(a, v):
        return a[0] + v

    with pytest.raises(dg.CompileError, match=r"kernel .*ret returns float32; a kernel must not return"):
        dg.jit(ret).compile("(float32[::1], float32)")


@pytest.mark.parametrize("argtype, shown", [
    (types.unicode_type, "unicode_type"),
])
def test_unsupported_parameter_types(argtype, shown):
    with pytest.raises(dg.CompileError, match=rf"parameter 1 of '.*_store' has type {shown}.*arrays, numbers"):
        dg.jit([(types.float32[::1], argtype)])(_store)


def test_signature_forms_agree():
    by_str = dg.jit("void(float64[:, ::1], int16)")(_store).images[0]
    by_types = dg.jit([(types.float64[:, ::1], types.int16)])(_store).images[0]
    by_sig = dg.jit(types.void(types.float64[:, ::1], types.int16))(_store).images[0]
    assert by_str.args == by_types.args == by_sig.args
    assert by_str.signature == by_types.signature == by_sig.signature == "(float64[:, ::1], int16)"
    assert _entry_params(by_str) == _entry_params(by_types) == _entry_params(by_sig)


def test_compile_is_idempotent_and_kernels_keep_signature_order():
    k = dg.jit(["void(float32[::1], float32)", "void(int64[::1], int64)"])(_store)
    first = k.images[0]
    assert k.compile("void(float32[::1], float32)") is first
    assert k.signatures == ["(float32[::1], float32)", "(int64[::1], int64)"]


def test_specialize_types_from_arguments():
    k = dg.jit(_store)
    assert k.signatures == []
    f = np.zeros((3, 4), dtype=np.float32, order="F")
    s = k.specialize(f, np.int8(3))
    assert s.signatures == ["(float32[::1, :], int8)"]
    s = k.specialize(np.zeros(5, np.complex128)[::2], 1.5)
    assert s.signatures == ["(complex128[:], float64)"]
    assert k.signatures == []  # specialize makes a new kernel


def test_lazy_kernel_compiles_a_new_signature_on_selection():
    k = dg.jit(_store)
    image = k.select_image((np.zeros(3, np.int32), 7))
    assert image.signature == "(int32[::1], int64)"
    assert k.signatures == ["(int32[::1], int64)"]


def test_eager_kernel_refuses_unknown_signature():
    k = dg.jit("void(float32[::1], float32)")(_store)
    with pytest.raises(TypeError, match=r"no compiled signature of kernel '_store'.*\(float64\[::1\] \(host\), float\)"):
        k.select_image((np.zeros(3), 1.0))
    assert k.signatures == ["(float32[::1], float32)"]


# -- misuse ------------------------------------------------------------------------------


def test_a_lazy_kernel_ships_a_placeholder_that_names_specialize():
    # A task's own function that launches a lazy kernel (da.map_blocks(f)) pickles it inside
    # Dask's serialization, where an error is buried under "Could not serialize object";
    # it travels as a placeholder whose every use raises the fix instead.
    shipped = pickle.loads(pickle.dumps(dg.jit(_store)))
    fix = r"no compiled signature.*_store\.specialize\(\*example_args\).*dg\.map_kernel\(_store"
    for use in (lambda k: k.forall(3), lambda k: k[1, 3], lambda k: k.configure(1, 3),
                lambda k: k(np.zeros(3, np.float32), np.float32(1))):
        with pytest.raises(dg.PicklingError, match=fix):
            use(shipped)
    assert not hasattr(shipped, "__cuda_array_interface__")  # probes still answer
    # Saving one still refuses at once: a bundle is the compiled kernel itself.
    with pytest.raises(dg.PicklingError, match=r"_store\.specialize\(\*args\)"):
        dg.jit(_store).ptx_kernel()


def test_a_lazy_kernels_launch_ships_a_placeholder_that_names_specialize():
    # Pickling fails inside Dask's serialization, which buries the message; the launch
    # pickles instead to a task whose one error says what to do.
    k = dg.jit(_store)
    for launch in (k.configure(1, 1), k.forall(10)):
        shipped = pickle.loads(pickle.dumps(launch))
        assert shipped.__name__ == "_store"
        with pytest.raises(dg.PicklingError, match=r"no compiled signature.*_store\.specialize\(\*args\)"):
            shipped(np.zeros(3, np.float32), np.float32(1))


def test_calling_without_a_configuration():
    with pytest.raises(TypeError, match=r"must be launched with a configuration: fill\[griddim, blockdim\]"):
        fill(np.zeros(3, np.float32), 1.0)


def test_calling_a_shipped_kernel_without_a_configuration_names_the_launch():
    # What a worker runs for client.submit(kernel, ...): before, "'PTXKernel' object is
    # not callable".
    shipped = pickle.loads(pickle.dumps(fill))
    with pytest.raises(TypeError, match=r"must be launched with a configuration: fill\[griddim, "
                       r"blockdim\].*client\.submit\(fill\.forall\(n\), \*args\)"):
        shipped(np.zeros(3, np.float32), 1.0)


def test_a_big_endian_array_into_a_lazy_kernel_names_astype():
    # Before, numba's bare "NumbaNotImplementedError: >f4".
    k = dg.jit(_div)
    with pytest.raises(TypeError, match=r"dtype >f4 .*not in this machine's byte order; "
                       r"convert with \.astype\('float32'\)"):
        k.select_image((np.zeros(3, ">f4"), np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match=r"convert with \.astype\(\[\('a', '<f4'\)\]\)"):
        k.specialize(np.zeros(3, [("a", ">f4")]), np.zeros(3, np.float32))


def test_jit_device_true_is_refused():
    with pytest.raises(TypeError, match=r"numba\.cuda\.jit\(device=True\)"):
        dg.jit(device=True)


def test_kernel_of_a_plain_function_is_refused():
    with pytest.raises(TypeError, match=r"dg\.kernel takes a numba\.cuda\.jit dispatcher, got function; .*dg\.jit"):
        dg.kernel(_store)


def test_kernel_of_a_device_function_is_refused():
    with pytest.raises(TypeError, match=r"not a device function"):
        dg.kernel(store)


def test_kernel_wraps_a_numba_dispatcher_with_its_options():
    numba_kernel = cuda.jit(fastmath=True)(_div)
    k = dg.kernel(numba_kernel, ["void(float32[::1], float32[::1])"])
    assert isinstance(k, dg.Kernel)
    assert k.py_func is _div
    assert k.images[0].option("fastmath") is True
    assert "div.approx" in k.images[0].ptx[0][1]
    # Options given to dg.kernel override the dispatcher's.
    k2 = dg.kernel(numba_kernel, "void(float32[::1], float32[::1])", fastmath=False)
    assert k2.images[0].option("fastmath") is False
    # No signatures: a lazy kernel.
    assert dg.kernel(cuda.jit(_div)).signatures == []


def test_kernel_repr_and_wrapping():
    assert repr(fill) == "<daskgpu.Kernel fill signatures=['(float32[::1], float32)']>"
    assert fill.__name__ == "fill" and fill.__wrapped__ is fill.py_func


def test_kernel_pickles_to_ptx_kernel_without_numba_objects():
    back = pickle.loads(pickle.dumps(fill))
    assert isinstance(back, dg.PTXKernel)
    assert back.images == fill.images
    assert back.signatures == fill.signatures
    assert all(im.py_func is None for im in back.images)


@pytest.mark.slow
def test_numba_is_not_needed_to_unpickle_a_kernel():
    code = textwrap.dedent("""
        import pickle, sys
        sys.modules["numba"] = None
        k = pickle.loads(sys.stdin.buffer.read())
        print(type(k).__name__, k.signatures, [im.hash for im in k.images])
    """)
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(fill),
                         capture_output=True, check=True).stdout.decode().strip()
    assert out == f"PTXKernel {fill.signatures} {[im.hash for im in fill.images]}"
