"""Compile one signature of a Python function into a :class:`KernelImage`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from numba.cuda import types
from numba.cuda.compiler import compile_cuda, kernel_fixup

from daskgpu._compiler.analysis import analyse
from daskgpu._compiler.signatures import to_argspec
from daskgpu._compiler.target import compiling_for
from daskgpu._errors import CompileError
from daskgpu._image.image import KernelImage, LinkInput
from daskgpu._image.ptx import ptx_isa_version


def parse_cc(cc) -> tuple:
    """A compute capability from ``"8.0"``, ``80``, ``(8, 0)`` or ``"sm_80"``."""
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return (int(cc[0]), int(cc[1]))
    text = str(cc).lower().removeprefix("sm_").removeprefix("compute_")
    m = re.fullmatch(r"(\d+)\.(\d+)", text) or re.fullmatch(r"(\d+)(\d)", text)
    if m is None:
        raise CompileError(
            f"cannot read compute capability {cc!r}; write it as '8.0', (8, 0) or 'sm_80'"
        )
    return (int(m.group(1)), int(m.group(2)))


@dataclass(frozen=True)
class CompileOptions:
    """Options of :func:`daskgpu.jit`, validated without a device."""

    targets: tuple = ()
    fastmath: bool = False
    debug: bool = False
    lineinfo: bool = False
    max_registers: int | None = None
    opt: bool = True
    link: tuple = ()

    def __post_init__(self):
        # Numba dispatchers carry their flags as 0/1: one spelling, one image hash.
        for flag in ("fastmath", "debug", "lineinfo", "opt"):
            object.__setattr__(self, flag, bool(getattr(self, flag)))
        if not self.targets:
            from daskgpu import _config

            object.__setattr__(self, "targets", (parse_cc(_config.get("target-cc")),))
        object.__setattr__(
            self, "targets", tuple(sorted({parse_cc(cc) for cc in self.targets}))
        )
        if self.max_registers is not None and not 1 <= int(self.max_registers) <= 255:
            raise CompileError(f"max_registers must be in 1..255, got {self.max_registers!r}")
        for path in self.link:
            if not os.path.isfile(path):
                raise CompileError(f"link file {path!r} does not exist")


_LINK_KINDS = {
    ".ptx": "ptx", ".cubin": "cubin", ".fatbin": "fatbin", ".ltoir": "ltoir",
    ".o": "object", ".a": "library", ".cu": "cu",
}


def _link_inputs(paths, cc, options) -> tuple:
    out = []
    for path in paths:
        ext = os.path.splitext(str(path))[1].lower()
        kind = _LINK_KINDS.get(ext)
        if kind is None:
            raise CompileError(
                f"cannot link {path!r}: daskgpu links {sorted(_LINK_KINDS)} files"
            )
        name = os.path.basename(str(path))
        with open(path, "rb") as f:
            data = f.read()
        if kind == "cu":
            # CUDA C is compiled here, once, so workers need no NVRTC.
            data = _compile_cu(data, name, cc, options)
            kind, name = "ptx", name[:-3] + ".ptx"
        out.append(LinkInput(name, kind, data))
    return tuple(out)


def _compile_cu(source: bytes, name: str, cc: tuple, options) -> bytes:
    """CUDA C to relocatable PTX with NVRTC itself.

    Not through numba-cuda's ``nvrtc.compile``: it goes through cuda.core's
    ``Program``, which asks the driver for its version and so fails with no GPU.
    """
    from cuda.bindings import nvrtc

    flags = [f"--gpu-architecture=compute_{cc[0]}{cc[1]}", "-rdc=true"]
    flags += ["-lineinfo"] * bool(options.lineinfo) + ["-G"] * bool(options.debug)
    try:
        from cuda import pathfinder

        headers = pathfinder.locate_nvidia_header_directory("cudart")
        if headers is not None:
            flags.append(f"-I{headers.abs_path}")
    except Exception:  # no CUDA headers: sources that include none still compile
        pass
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
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# Numba mangles into every symbol an ABI tag "v<n>" with n from a per-process
# counter of compiled functions, so the same kernel compiled in another order
# (or process) would get other symbols and another image hash.
_COUNTER_TAG = re.compile(r"B(\d+)v(\d+)(?=B\d)")
_SYMBOL = re.compile(r"_Z\w+")


def stable_symbols(ptx_texts, entry):
    """Renumber Numba's counter tags in order of first appearance; same code, same text."""
    numbers: dict = {}

    def tag(m):
        if int(m.group(1)) != 1 + len(m.group(2)):
            return m.group(0)  # not a counter tag, only looks like one
        n = numbers.setdefault(m.group(2), str(len(numbers)))
        return f"B{1 + len(n)}v{n}"

    def symbol(m):
        return _COUNTER_TAG.sub(tag, m.group(0))

    texts = [_SYMBOL.sub(symbol, text) for text in ptx_texts]
    return texts, _SYMBOL.sub(symbol, entry)


def _exception_table(call_helper) -> tuple:
    """The user exceptions a debug kernel can raise, as plain data."""
    table = []
    for code, (cls, args, loc) in sorted(getattr(call_helper, "exceptions", {}).items()):
        plain_args = tuple(a if isinstance(a, (str, int, float, bool)) else repr(a) for a in args)
        where = (str(loc[0]), str(loc[1]), int(loc[2])) if loc else None
        table.append((int(code), cls.__name__, plain_args, where))
    return tuple(table)


def _versions(ptx: str) -> tuple:
    import numba_cuda

    isa = ptx_isa_version(ptx)
    build = re.search(r"Cuda compilation tools, release (\S+?),", ptx)
    return (
        ("numba-cuda", numba_cuda.__version__),
        ("nvvm", build.group(1) if build else "unknown"),
        ("ptx-isa", "%d.%d" % isa if isa else "unknown"),
    )


def compile_image(py_func, argtypes, options: CompileOptions) -> KernelImage:
    """Compile ``py_func`` for ``argtypes`` to PTX for each of ``options.targets``.

    Needs no GPU or driver: typing runs for the lowest target and NVVM lowers the
    same library once per target.
    """
    name = f"{py_func.__module__}.{py_func.__qualname__}"
    specs = tuple(to_argspec(t, i, name) for i, t in enumerate(argtypes))
    lowest = options.targets[0]
    nvvm_options = {"fastmath": options.fastmath, "opt": 3 if options.opt else 0}
    if options.debug:
        nvvm_options["g"] = None
    try:
        with compiling_for(lowest):
            # Typing infers the return type (None), so a kernel that returns a
            # value gets the message below rather than a failed cast to void.
            cres = compile_cuda(
                py_func, None, argtypes,
                debug=options.debug, lineinfo=options.lineinfo,
                fastmath=options.fastmath, nvvm_options=nvvm_options,
                cc=lowest, max_registers=options.max_registers,
            )
            if cres.signature.return_type not in (types.void, types.none):
                raise CompileError(
                    f"kernel {name} returns {cres.signature.return_type}; a kernel must "
                    "not return a value: write results into an output array argument"
                )
            lib = cres.library
            fn = lib.get_function(cres.fndesc.llvm_func_name)
            lib._entry_name = cres.fndesc.llvm_func_name
            kernel_fixup(fn, options.debug)
            texts, entry = stable_symbols(
                [lib.get_asm_str(cc=cc) for cc in options.targets], fn.name
            )
            ptx = tuple(zip(options.targets, texts))
            implicit_links = tuple(
                p for p in getattr(lib, "_linking_files", ()) if isinstance(p, str)
            )
    except Exception as exc:
        if isinstance(exc, CompileError):
            raise
        raise CompileError(
            f"compiling {name} for ({', '.join(map(str, argtypes))}) failed:\n{exc}"
        ) from exc
    analysis = analyse(cres.type_annotation, len(argtypes))
    return KernelImage(
        name=name,
        entry=entry,
        ptx=ptx,
        args=specs,
        writes=tuple(sorted(analysis.written)),
        grid_ndim=analysis.grid_ndim,
        links=_link_inputs(tuple(options.link) + implicit_links, lowest, options),
        options=(
            ("debug", options.debug),
            ("fastmath", options.fastmath),
            ("lineinfo", options.lineinfo),
            ("max_registers", options.max_registers),
        ),
        versions=_versions(ptx[0][1]),
        exceptions=_exception_table(cres.call_helper) if options.debug else (),
    )
