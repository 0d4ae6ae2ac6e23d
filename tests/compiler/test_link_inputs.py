"""What numba-cuda links behind the scenes travels in the image; cuda.jit options;
numba's exception types; overload selection. All without a GPU."""

import pickle

import numpy as np
import pytest
from numba import cuda
from numba.cuda.bf16 import hfma_relu
from numba.cuda.core.errors import TypingError

import daskgpu as dg
from daskgpu._image import bundle


def fp16_mul(out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = cuda.fp16.hmul(a[i], b[i]) + a[i] * b[i]


def test_fp16_shims_are_compiled_here_and_carried_as_ptx():
    image = dg.jit("void(float16[::1], float16[::1], float16[::1])")(fp16_mul).images[0]
    (shim,) = [x for x in image.links if x.kind == "ptx"]
    text = shim.data.decode()
    assert ".version" in text and "_ZmlRK6__halfS1_" in text  # the C++ operator* shim
    shipped = pickle.loads(pickle.dumps(image))
    assert shipped.links == image.links


def test_lto_turns_cuda_c_into_ltoir_and_links_with_lto():
    image = dg.jit("void(float16[::1], float16[::1], float16[::1])", lto=True)(fp16_mul).images[0]
    assert [x.kind for x in image.links] == ["ltoir"]
    assert image.option("lto") is True


def bf16_fma_relu(out, a, b, c):
    out[0] = hfma_relu(a[0], b[0], c[0])


@pytest.mark.parametrize("targets, want", [((), [(8, 0)]), (("7.5", "9.0"), [(8, 0), (9, 0)])])
def test_bfloat16_kernels_compile_for_the_gpus_numba_supports_bfloat16_on(targets, want):
    import ml_dtypes

    x = np.zeros(1, ml_dtypes.bfloat16)
    k = dg.kernel(cuda.jit(bf16_fma_relu), targets=targets).specialize(x, x, x, x)
    (image,) = k.images
    assert [cc for cc, _ in image.ptx] == want  # cuda_bf16.h has __hfma_relu from sm_80
    assert [x.kind for x in image.links] == ["ltoir"]  # the shims, compiled for that cc
    h = np.zeros(1, np.float16)
    assert [cc for cc, _ in dg.jit(fp16_mul).specialize(h, h, h).images[0].ptx] == [(7, 5)]


def copy_then_read(x, out):
    y = x.copy()  # an allocation on the device: NRT
    out[0] = y[1]


@pytest.fixture
def nrt(monkeypatch):
    from numba.cuda import config

    monkeypatch.setattr(config, "CUDA_ENABLE_NRT", True)


@pytest.mark.parametrize("lto", [False, True])
def test_nrt_is_linked_as_ptx_even_with_lto(nrt, lto):
    image = dg.jit("void(float32[::1], float32[::1])", lto=lto)(copy_then_read).images[0]
    (nrt_link,) = image.links
    assert (nrt_link.name, nrt_link.kind) == ("nrt.ptx", "ptx")
    assert b"NRT_MemInfo_alloc_aligned" in nrt_link.data


def grid_sync(a):
    g = cuda.cg.this_grid()
    a[cuda.grid(1)] = 1
    g.sync()


def test_cooperative_kernels_are_marked_for_cudadevrt_and_a_cooperative_launch():
    image = dg.jit("void(int32[::1])")(grid_sync).images[0]
    assert image.option("cooperative") is True
    plain = dg.jit("void(int32[::1])")(lambda a: None).images[0]
    assert plain.option("cooperative") is None  # defaults stay out of the image and its hash


def test_new_options_survive_a_bundle(tmp_path):
    k = dg.jit("void(int32[::1])", shared_memory_carveout="MaxShared")(grid_sync)
    dg.save(k, tmp_path / "k.dgk")
    (image,) = dg.load(tmp_path / "k.dgk").images
    assert image.option("cooperative") is True and image.option("shared_memory_carveout") == 100
    assert bundle  # the module that validates those options


def test_launch_bounds_reach_the_ptx():
    image = dg.jit("void(float32[::1])", launch_bounds=(128, 2))(lambda a: None).images[0]
    assert ".maxntid 128" in image.ptx[0][1]


@pytest.mark.parametrize("bad, match", [
    (dict(launch_bounds=(0,)), "launch_bounds"),
    (dict(shared_memory_carveout="most"), "shared_memory_carveout"),
    (dict(shared_memory_carveout=101), "shared_memory_carveout"),
])
def test_bad_options_are_refused_without_a_device(bad, match):
    with pytest.raises(dg.CompileError, match=match):
        dg.jit(**bad)


def test_extensions_that_run_python_are_refused():
    with pytest.raises(TypeError, match="argument extensions"):
        dg.jit(extensions=[object()])
    assert dg.jit(extensions=[], cache=True, inline="always", forceinline=True)


def test_compile_errors_keep_numbas_exception_type():
    def bad(a):
        a[0] = undefined_name  # noqa: F821

    with pytest.raises(TypingError) as info:
        dg.jit("void(int32[::1])")(bad)
    assert isinstance(info.value, dg.CompileError)
    assert "undefined_name" in str(info.value) and "bad" in str(info.value)


def store(out, v):
    out[0] = v


def test_a_python_float_selects_float64_as_numba_does():
    k = dg.jit(["void(float64[::1], float32)", "void(float64[::1], float64)"])(store)
    assert k.select_image([np.zeros(1), 1.5]).signature == "(float64[::1], float64)"
    assert k.select_image([np.zeros(1), np.float32(1.5)]).signature == "(float64[::1], float32)"
    shipped = pickle.loads(pickle.dumps(k))
    assert shipped.select_image([np.zeros(1), 1.5]).signature == "(float64[::1], float64)"


class MyError(Exception):
    pass


def test_a_bare_raise_in_a_debug_kernel_compiles():
    def raises(a):
        if a[0] > 0:
            raise MyError

    image = dg.jit("void(int32[::1])", debug=True, opt=False)(raises).images[0]
    assert [(cls, args) for _, cls, args, _ in image.exceptions] == [(f"{__name__}:MyError", ())]
