"""What a kernel links besides its own PTX, as :class:`LinkInput` bytes.

numba-cuda links more than the files given to ``link=``: its code library
collects C++ shims (the float16 and bfloat16 operators, compiled with NVRTC),
``reshape_funcs.cu`` when the kernel reshapes, NRT when the kernel uses it,
and cudadevrt for cooperative groups. Everything but cudadevrt is compiled
here, on the client and without a driver, so the image carries it as PTX or
LTO-IR; cudadevrt is a static library of the CUDA toolkit that each worker
links from its own installation (see ``daskgpu._runtime.gpu.linker``).
"""

from __future__ import annotations

import os
import re

from daskgpu._errors import CompileError
from daskgpu._image.image import LinkInput

_LINK_KINDS = {
    ".ptx": "ptx", ".cubin": "cubin", ".fatbin": "fatbin", ".ltoir": "ltoir",
    ".o": "object", ".a": "library", ".lib": "library", ".cu": "cu",
}

# numba-cuda's LinkableCode classes, by name, and the input kind each is.
_LINKABLE_KINDS = {
    "PTXSource": "ptx", "CUSource": "cu", "Cubin": "cubin", "Fatbin": "fatbin",
    "LTOIR": "ltoir", "Object": "object", "Archive": "library",
}

def implicit_links(lib, ptx: str) -> list:
    """The link inputs numba-cuda adds for the kernel in code library ``lib``."""
    import numba.cuda

    found = list(getattr(lib, "_linking_files", ()))
    try:
        from numba.cuda.dispatcher import reshape_funcs
    except ImportError:
        reshape_funcs = ()
    if any(fn in ptx for fn in reshape_funcs):
        found.append(os.path.join(os.path.dirname(numba.cuda.__file__), "reshape_funcs.cu"))
    if _needs_nrt(ptx, found):
        from numba.cuda.memory_management.nrt import NRT_LIBRARY

        found.append(NRT_LIBRARY)
    # Sets have no order; the image hash should not depend on it.
    return sorted(found, key=lambda p: p if isinstance(p, str) else f"~{_name_of(p)}")


#: The compute capability numba-cuda's bfloat16 shims need: cuda_bf16.h declares
#: some of their overloads (``__hfma_relu``, ...) from sm_80 only, and numba-cuda
#: supports bfloat16 on those devices only (``cuda.is_bfloat16_supported``).
BFLOAT16_MIN_CC = (8, 0)


def uses_bfloat16_shims(found) -> bool:
    """Whether numba-cuda's bfloat16 shims are among the link inputs ``found``."""
    try:
        from numba.cuda._internal.cuda_bf16 import shim_obj
    except ImportError:  # a numba-cuda without them
        return False
    return any(f is shim_obj for f in found)


def _needs_nrt(ptx, found) -> bool:
    # numba-cuda's _Kernel.maybe_link_nrt, which a compile without a dispatcher skips.
    from numba.cuda.descriptor import cuda_target
    from numba.cuda.dispatcher import _Kernel

    if not cuda_target.target_context.enable_nrt:
        return False
    pattern = (r"\.extern\s+\.func\s+(?:\s*\(.+\)\s*)?(" + "|".join(_Kernel.NRT_functions)
               + r")\s*\([^)]*\)\s*;")
    return bool(re.search(pattern, ptx)) or any(getattr(f, "nrt", False) for f in found)


def _name_of(code) -> str:
    return str(getattr(code, "name", None) or type(code).__name__)


def link_inputs(items, cc, options, lto: bool = False) -> tuple:
    """Read and, for CUDA C, compile each path or numba-cuda ``LinkableCode``.

    With ``lto``, CUDA C becomes LTO-IR (as numba-cuda's ``lto=True`` does),
    otherwise relocatable PTX.
    """
    out, seen = [], set()
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            path = os.fspath(item)
            ext = os.path.splitext(path)[1].lower()
            kind = _LINK_KINDS.get(ext)
            if kind is None:
                raise CompileError(
                    f"cannot link {path!r}: daskgpu links {sorted(_LINK_KINDS)} files"
                )
            name = os.path.basename(path)
            with open(path, "rb") as f:
                data = f.read()
        else:
            kind = _LINKABLE_KINDS.get(type(item).__name__)
            if kind is None:
                raise CompileError(
                    f"cannot link {item!r}: daskgpu links files and numba-cuda's "
                    f"{sorted(_LINKABLE_KINDS)} objects"
                )
            name, data = _name_of(item), item.data
            callbacks = [c for c in (getattr(item, "setup_callback", None),
                                     getattr(item, "teardown_callback", None)) if c]
            # The fp16/bf16 shims carry a setup callback that only warns about LTO.
            if any(getattr(c, "__name__", "") != "lto_warning_callback" for c in callbacks):
                raise CompileError(
                    f"link input {name!r} has a setup or teardown callback: Python "
                    "code that would have to run on each worker. daskgpu ships data "
                    "only; link it without callbacks."
                )
            if isinstance(data, str):
                data = data.encode()
        if kind == "cu":
            # CUDA C is compiled here, once, so workers need no NVRTC. NRT stays
            # PTX: as LTO-IR, nvJitLink drops the NRT functions that only the
            # kernel's PTX calls and fails with undefined NRT_incref (CUDA 13, H200).
            as_ltoir = lto and not getattr(item, "nrt", False)
            data = compile_cu(data, name, cc, options, lto=as_ltoir)
            stem = name[:-3] if name.endswith(".cu") else name
            kind, name = ("ltoir", stem + ".ltoir") if as_ltoir else ("ptx", stem + ".ptx")
        key = (kind, bytes(data))
        if key not in seen:
            seen.add(key)
            out.append(LinkInput(name, kind, bytes(data)))
    return tuple(out)


def _include_dirs() -> list:
    """The include path of numba-cuda's own NVRTC compiles, found without a driver.

    In numba-cuda's order: its headers for this NVRTC, the CUDA toolkit's (where
    ``get_cuda_paths`` finds them: a system toolkit or the pip wheels), CCCL, NRT's,
    then ``NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS``.
    """
    import numba.cuda
    from numba.cuda import config

    dirs = []
    root = os.path.dirname(os.path.abspath(numba.cuda.__file__))
    try:
        from cuda.bindings import nvrtc

        _, major, _ = nvrtc.nvrtcVersion()
        dirs.append(os.path.join(root, "include", str(major)))
    except Exception:  # no NVRTC: compile_cu reports that
        pass
    try:
        from numba.cuda.cuda_paths import get_cuda_paths

        dirs.append(get_cuda_paths()["include_dir"].info)
    except Exception:  # no toolkit found: the wheels' headers below may do
        pass
    try:
        from cuda import pathfinder

        for lib in ("cudart", "cccl"):
            found = pathfinder.locate_nvidia_header_directory(lib)
            if found is not None:
                dirs.append(found.abs_path)
    except Exception:  # no CUDA headers: sources that include none still compile
        pass
    dirs.append(os.path.join(root, "memory_management"))
    dirs += (getattr(config, "CUDA_NVRTC_EXTRA_SEARCH_PATHS", "") or "").split(":")
    return list(dict.fromkeys(d for d in dirs if d and os.path.isdir(d)))


def compile_cu(source: bytes, name: str, cc: tuple, options, lto: bool = False) -> bytes:
    """CUDA C to relocatable PTX (or LTO-IR) with NVRTC itself.

    Not through numba-cuda's ``nvrtc.compile``: it goes through cuda.core's
    ``Program``, which asks the driver for its version and so fails with no GPU.
    """
    from cuda.bindings import nvrtc

    flags = [f"--gpu-architecture=compute_{cc[0]}{cc[1]}", "-rdc=true"]
    flags += ["-lineinfo"] * bool(options.lineinfo) + ["-G"] * bool(options.debug)
    flags += ["-dlto"] * bool(lto)
    flags += [f"-I{d}" for d in _include_dirs()]
    flags = [f.encode() for f in flags]
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source, name.encode(), 0, [], [])
    if err != ok:
        raise CompileError(f"NVRTC could not read {name!r}: {err.name}")
    try:
        err, = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        if err != ok:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CompileError(
                f"compiling link file {name!r} with NVRTC failed ({err.name}):\n"
                + log.rstrip(b"\0").decode(errors="replace")
            )
        if lto:
            _, size = nvrtc.nvrtcGetLTOIRSize(prog)
            out = b" " * size
            nvrtc.nvrtcGetLTOIR(prog, out)
            return out
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
