"""Linking a KernelImage with nvJitLink, which needs no GPU, and the PTX version gate.

nvJitLink is a library, not part of the driver: these tests link real cubins on a
machine without a GPU. ``check_ptx_version`` is pure logic over two version
numbers; where a test sets those numbers it monkeypatches the two functions that
read them, and says so.
"""

import dataclasses
import itertools
import re
import struct

import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._image.ptx import max_ptx_isa, ptx_isa_version
from daskgpu._runtime.gpu import linker
from daskgpu._runtime.gpu.driver import nvjitlink_version
from daskgpu._runtime.gpu.linker import check_ptx_version, link_cubin

needs_nvjitlink = pytest.mark.skipif(nvjitlink_version() is None, reason="needs nvJitLink")


@dg.jit("void(float32[::1], float32)", targets=["7.5", "9.0"])
def scale(a, v):
    i = cuda.grid(1)
    if i < a.size:
        a[i] *= v


IMAGE = scale.images[0]

plus_one = cuda.declare_device("plus_one", "int32(int32)")


def bump(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = plus_one(a[i])


@pytest.fixture
def driver_12_9(monkeypatch):
    # No driver on CI machines: cuDriverGetVersion fails there. check_ptx_version
    # reads the driver's version only when nvJitLink refuses the PTX, and these
    # tests assert what then happens, so the driver's version is set here.
    monkeypatch.setattr(linker, "driver_version", lambda: (12, 9))


def elf_sm(cubin: bytes) -> int:
    """The SM a cubin is for, from its ELF header (EM_CUDA, e_flags).

    CUDA's ELF ABI version 7 keeps the SM in e_flags' low byte (sm_90: 0x5a055a);
    version 8, which CUDA 13's nvJitLink writes, in the byte above (sm_100: 0x6006402).
    """
    assert cubin[:4] == b"\x7fELF"
    assert struct.unpack_from("<H", cubin, 18)[0] == 190  # EM_CUDA
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


# -- PTX ISA versions ------------------------------------------------------------------------------


def test_ptx_isa_version_of_compiled_ptx():
    for _, ptx in IMAGE.ptx:
        m = re.search(r"^\.version (\d+)\.(\d+)$", ptx, re.M)
        assert ptx_isa_version(ptx) == (int(m.group(1)), int(m.group(2)))
    assert ptx_isa_version(IMAGE.ptx[0][1]) == tuple(
        int(x) for x in dict(IMAGE.versions)["ptx-isa"].split("."))


def test_a_text_without_a_version_directive_is_refused_as_not_ptx():
    with pytest.raises(dg.LinkError, match=r"no '\.version' directive; it is not PTX text"):
        check_ptx_version("\x7fELF binary", "k")


@needs_nvjitlink
def test_this_nvjitlink_reads_the_ptx_this_numba_emits():
    assert ptx_isa_version(IMAGE.ptx[0][1]) <= max_ptx_isa(nvjitlink_version())


# -- the version gate ----------------------------------------------------------------------------


def _versions(monkeypatch, driver, njl):
    # Pure logic over two numbers: set what the driver and nvJitLink would report.
    monkeypatch.setattr(linker, "driver_version", lambda: driver)
    monkeypatch.setattr(linker, "nvjitlink_version", lambda: njl)


PTX_88 = ".version 8.8\n.target sm_75\n"


def test_nvjitlink_decides_when_present(monkeypatch):
    _versions(monkeypatch, driver=(12, 0), njl=(12, 9))
    check_ptx_version(PTX_88, "k")  # an old driver does not matter


def test_old_nvjitlink_is_refused_naming_both_versions(monkeypatch):
    _versions(monkeypatch, driver=(12, 9), njl=(12, 4))
    with pytest.raises(dg.PTXVersionError) as info:
        check_ptx_version(PTX_88, "mod.k")
    msg = str(info.value)
    assert "kernel 'mod.k' was compiled to PTX ISA 8.8, but nvJitLink 12.4 on this worker " \
           "reads PTX up to 8.4 (driver 12.9, nvJitLink 12.4)" in msg
    assert "pip install 'daskgpu[cu12]'" in msg and "newer driver / nvidia-nvjitlink" in msg
    assert isinstance(info.value, dg.LinkError)


def test_driver_decides_without_nvjitlink(monkeypatch):
    _versions(monkeypatch, driver=(12, 4), njl=None)
    with pytest.raises(dg.PTXVersionError, match=r"but the CUDA driver 12\.4 on this worker reads "
                       r"PTX up to 8\.4 \(driver 12\.4, nvJitLink not installed\)"):
        check_ptx_version(PTX_88, "k")
    _versions(monkeypatch, driver=(12, 9), njl=None)
    check_ptx_version(PTX_88, "k")


@pytest.mark.nogpu
@needs_nvjitlink
def test_version_gate_needs_no_driver_when_nvjitlink_decides():
    check_ptx_version(IMAGE.ptx[0][1], IMAGE.name)


# -- linking -------------------------------------------------------------------------------------


@needs_nvjitlink
@pytest.mark.parametrize("cc, sm", [((9, 0), 90), ((7, 5), 75), ((8, 6), 86), ((8, 0), 80)])
def test_link_cubin_without_a_gpu(driver_12_9, cc, sm):
    cubin = link_cubin(IMAGE, cc)
    assert isinstance(cubin, bytes)
    assert cubin.startswith(b"\x7fELF")
    assert elf_sm(cubin) == sm
    assert IMAGE.entry.encode() in cubin


@needs_nvjitlink
def test_link_cubin_with_options(driver_12_9):
    k = dg.jit("void(float32[::1], float32)", lineinfo=True, max_registers=16)(scale.py_func)
    cubin = link_cubin(k.images[0], (8, 0))
    assert elf_sm(cubin) == 80


@needs_nvjitlink
def test_link_files_are_linked_in(driver_12_9, plus_one_ptx):
    linked = dg.jit("void(int32[::1])", link=[str(plus_one_ptx)])(bump).images[0]
    cubin = link_cubin(linked, (8, 0))
    assert elf_sm(cubin) == 80
    # Without the file, the extern function is unresolved: a LinkError with the log.
    unlinked = dataclasses.replace(linked, links=())
    with pytest.raises(dg.LinkError,
                       match=r"linking kernel '.*bump' for sm_80 failed.*(?s:.*)plus_one"):
        link_cubin(unlinked, (8, 0))


@needs_nvjitlink
def test_cu_link_files_link_without_a_gpu(driver_12_9, tmp_path):
    src = tmp_path / "plus_one.cu"
    src.write_text('extern "C" __device__ int plus_one(int* r, int x) { *r = x + 1; return 0; }\n')
    image = dg.jit("void(int32[::1])", link=[str(src)])(bump).images[0]
    assert elf_sm(link_cubin(image, (9, 0))) == 90


@needs_nvjitlink
def test_broken_ptx_gives_a_link_error_with_the_log(driver_12_9):
    cc, ptx = IMAGE.ptx[0]
    broken = dataclasses.replace(IMAGE, ptx=((cc, ptx.replace("ret;", "ret banana;")),))
    with pytest.raises(dg.LinkError) as info:
        link_cubin(broken, (8, 0))
    msg = str(info.value)
    assert f"linking kernel {IMAGE.name!r} for sm_80 failed" in msg
    # nvJitLink's log (ptxas's complaint) is in the message.
    assert "Unknown symbol 'banana'" in msg


def test_no_target_at_or_below_the_device(driver_12_9):
    # Raised before the linker is touched, so no nvJitLink is needed either.
    with pytest.raises(dg.LinkError) as info:
        link_cubin(IMAGE, (7, 0))
    assert str(info.value) == (
        f"kernel {IMAGE.name!r} carries PTX for compute capabilities [7.5, 9.0], none of "
        "which runs on this device (cc 7.0). Compile it with a target at or below 7.0, "
        "e.g. dg.jit(..., targets=['7.0'])."
    )
    assert not isinstance(info.value, dg.PTXVersionError)


def test_link_picks_the_highest_target_at_or_below(monkeypatch, driver_12_9):
    seen = []
    real = linker.check_ptx_version
    # Observe which PTX is chosen (the version check runs on it before linking).
    monkeypatch.setattr(linker, "check_ptx_version",
                        lambda ptx, name: seen.append(ptx) or real(ptx, name))
    if nvjitlink_version() is None:
        pytest.skip("needs nvJitLink")
    link_cubin(IMAGE, (8, 9))
    link_cubin(IMAGE, (9, 0))
    assert seen == [IMAGE.ptx_for((7, 5)), IMAGE.ptx_for((9, 0))]
    assert "\n.target sm_75" in seen[0] and "\n.target sm_90" in seen[1]


@needs_nvjitlink
@pytest.mark.parametrize("kernel_debug, f1_debug, f2_debug",
                         list(itertools.product([True, False], repeat=3)))
def test_device_functions_of_another_debug_setting_link_as_modules_of_their_own(
        driver_12_9, kernel_debug, f1_debug, f2_debug):
    # numba-cuda's test_debuginfo::test_chained_device_function: with debug info,
    # NVVM compiles each module apart, and the image carries one PTX text per module.
    @cuda.jit(device=True, debug=f2_debug, opt=False)
    def f2(x):
        return x + 1

    @cuda.jit(device=True, debug=f1_debug, opt=False)
    def f1(x, y):
        return x - f2(y)

    def kernel(out, x, y):
        out[0] = f1(x, y)

    image = dg.jit("void(int32[::1], int32, int32)", debug=kernel_debug, opt=False,
                   targets=["7.5", "9.0"])(kernel).images[0]
    assert all(text.count(".version") == 1 for _, text in image.ptx)
    modules = [x for x in image.links if x.name.startswith("module")]
    assert len(modules) == (2 if kernel_debug else 0)  # f1's and f2's, beside the kernel's
    assert elf_sm(link_cubin(image, (9, 0))) == 90


# -- the same cubin as cuda.core's Linker --------------------------------------------------------


def _cuda_core_cubin(image, cc) -> bytes:
    """``image`` linked by cuda.core's Linker, which drives nvJitLink when it is installed."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    make = {"ptx": ObjectCode.from_ptx, "ltoir": ObjectCode.from_ltoir}
    inputs = [ObjectCode.from_ptx(image.ptx_for(cc).encode(), name=image.name)]
    inputs += [make[link.kind](link.data, name=link.name) for link in image.links]
    options = LinkerOptions(
        arch=f"sm_{cc[0]}{cc[1]}", max_register_count=image.option("max_registers"),
        debug=bool(image.option("debug")) or None,
        lineinfo=bool(image.option("lineinfo")) or None,
        link_time_optimization=any(x.kind == "ltoir" for x in image.links) or None)
    linker = Linker(*inputs, options=options)
    try:
        return bytes(linker.link("cubin").code)
    finally:
        linker.close()


def _fp16_mul(r, x, y):
    i = cuda.grid(1)
    if i < r.size:
        r[i] = x[i] * y[i]


@needs_nvjitlink
@pytest.mark.parametrize("case", ["plain", "options", "debug", "linked file", "lto"])
def test_link_cubin_gives_the_cubin_cuda_core_links(driver_12_9, plus_one_ptx, case):
    # link_cubin calls nvJitLink itself, to keep cuda.core out of a worker's
    # start; each option must reach nvJitLink as cuda.core's Linker passes it.
    kernel = {
        "plain": lambda: scale,
        "options": lambda: dg.jit("void(float32[::1], float32)", lineinfo=True,
                                  max_registers=24)(scale.py_func),
        "debug": lambda: dg.jit("void(float32[::1], float32)", debug=True,
                                opt=False)(scale.py_func),
        "linked file": lambda: dg.jit("void(int32[::1])", link=[str(plus_one_ptx)])(bump),
        "lto": lambda: dg.jit("void(float16[::1], float16[::1], float16[::1])",
                              lto=True)(_fp16_mul),
    }[case]()
    image = kernel.images[0]
    assert link_cubin(image, (8, 0)) == _cuda_core_cubin(image, (8, 0))
