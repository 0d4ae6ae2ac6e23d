"""Compile one signature of a Python function into a :class:`KernelImage`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from numba.cuda import types
from numba.cuda.compiler import compile_cuda, kernel_fixup

from daskgpu import _config
from daskgpu._compiler.analysis import analyse
from daskgpu._compiler.link_inputs import (
    BFLOAT16_MIN_CC,
    implicit_links,
    link_inputs,
    uses_bfloat16_shims,
)
from daskgpu._compiler.positions import position_uses
from daskgpu._compiler.signatures import to_argspec
from daskgpu._compiler.target import compiling_for
from daskgpu._errors import CompileError
from daskgpu._image.image import KernelImage, LinkInput
from daskgpu._image.ptx import ptx_isa_version
from daskgpu._runtime.faults import exception_name


def parse_cc(cc) -> tuple:
    """A compute capability from ``"8.0"``, ``80``, ``(8, 0)`` or ``"sm_80"``; CompileError else."""
    try:
        return _config.parse_cc(cc)
    except ValueError:
        raise CompileError(
            f"cannot read compute capability {cc!r}; write it as '8.0', (8, 0) or 'sm_80'"
        ) from None


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
    lto: bool = False
    # As given to jit (int or tuple; a name or a percentage; a name or a cost
    # model), normalised by __post_init__.
    launch_bounds: int | tuple | None = None
    shared_memory_carveout: str | int | None = None
    inline: str | Callable[..., bool] = "never"
    forceinline: bool = False
    cache: bool = False

    def __post_init__(self):
        # Numba dispatchers carry their flags as 0/1: one spelling, one image hash.
        for flag in ("fastmath", "debug", "lineinfo", "opt", "lto", "forceinline", "cache"):
            object.__setattr__(self, flag, bool(getattr(self, flag)))
        bounds = self.launch_bounds
        if bounds is not None:
            bounds = (bounds,) if isinstance(bounds, int) else tuple(bounds)
            if not 1 <= len(bounds) <= 3 or not all(isinstance(b, int) and b > 0 for b in bounds):
                raise CompileError(
                    "launch_bounds must be max_threads_per_block, or a tuple of it, "
                    f"min_blocks_per_sm and max_blocks_per_cluster (positive ints), got {bounds!r}"
                )
            object.__setattr__(self, "launch_bounds", bounds)
        object.__setattr__(self, "shared_memory_carveout",
                           _carveout(self.shared_memory_carveout))
        if self.inline not in ("never", "always") and not callable(self.inline):
            raise CompileError(
                f"inline must be 'never', 'always' or a function, got {self.inline!r}")
        if not self.targets:
            object.__setattr__(self, "targets", (parse_cc(_config.get("target-cc")),))
        object.__setattr__(
            self, "targets", tuple(sorted({parse_cc(cc) for cc in self.targets}))
        )
        if self.max_registers is not None and not 1 <= int(self.max_registers) <= 255:
            raise CompileError(f"max_registers must be in 1..255, got {self.max_registers!r}")
        for path in self.link:
            if not os.path.isfile(path):
                raise CompileError(f"link file {path!r} does not exist")


def _carveout(value):
    """numba-cuda's shared memory carveout: a percentage, or -1 for the default."""
    if value is None:
        return None
    named = {"default": -1, "maxl1": 0, "maxshared": 100}
    if isinstance(value, str) and value.lower() in named:
        return named[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and -1 <= value <= 100:
        return value
    raise CompileError(
        "shared_memory_carveout must be 'default', 'MaxL1', 'MaxShared' or a percentage "
        f"-1..100, got {value!r}"
    )


# Numba mangles into every symbol an ABI tag "v<n>" with n from a per-process
# counter of compiled functions, so the same kernel compiled in another order
# (or process) would get other symbols and another image hash.
_COUNTER_TAG = re.compile(r"B(\d+)v(\d+)(?=B\d)")
# A record type mangles as Record<its type code>, a per-process counter of numba's.
_RECORD_CODE = re.compile(r"6RecordILi(\d+)EE")
_SYMBOL = re.compile(r"_Z\w+")


def stable_symbols(ptx_texts, entry):
    """Renumber Numba's counter tags and record type codes in order of first
    appearance; same code, same text, in any process."""
    numbers: dict = {}
    records: dict = {}

    def tag(m):
        if int(m.group(1)) != 1 + len(m.group(2)):
            return m.group(0)  # not a counter tag, only looks like one
        n = numbers.setdefault(m.group(2), str(len(numbers)))
        return f"B{1 + len(n)}v{n}"

    def record(m):
        return f"6RecordILi{records.setdefault(m.group(1), len(records))}EE"

    def symbol(m):
        return _RECORD_CODE.sub(record, _COUNTER_TAG.sub(tag, m.group(0)))

    texts = [_SYMBOL.sub(symbol, text) for text in ptx_texts]
    return texts, _SYMBOL.sub(symbol, entry)


def _exception_table(call_helper) -> tuple:
    """The user exceptions a debug kernel can raise, as plain data."""
    table = []
    for code, (cls, args, loc) in sorted(getattr(call_helper, "exceptions", {}).items()):
        # A bare `raise MyError` has no arguments (None), not an empty tuple.
        plain_args = tuple(a if isinstance(a, (str, int, float, bool)) else repr(a)
                           for a in (args or ()))
        where = (str(loc[0]), str(loc[1]), int(loc[2])) if loc else None
        table.append((int(code), exception_name(cls), plain_args, where))
    return tuple(table)


def _kernel_ptx(lib, entry: str, targets) -> tuple:
    """``(((cc, PTX), ...), extra modules, entry)``: the kernel's PTX per target.

    With debug info NVVM compiles each LLVM module of the library apart (each
    device function the kernel calls brings its own), and numba-cuda links the
    PTX modules together. The module that defines the kernel travels per target;
    the others, compiled for the lowest target, as PTX link inputs. Symbols are
    renumbered across all of them at once, as they call each other.
    """
    per_target = [lib.get_asm_strs(cc=cc) for cc in targets]
    main = next((i for i, text in enumerate(per_target[0]) if f".entry {entry}(" in text), 0)
    others = [text for i, text in enumerate(per_target[0]) if i != main]
    texts, entry = stable_symbols([m[main] for m in per_target] + others, entry)
    ptx = tuple(zip(targets, texts[:len(targets)]))
    modules = tuple(LinkInput(f"module{i}.ptx", "ptx", text.encode())
                    for i, text in enumerate(texts[len(targets):], 1))
    return ptx, modules, entry


def _versions(ptx: str) -> tuple:
    import numba_cuda

    isa = ptx_isa_version(ptx)
    build = re.search(r"Cuda compilation tools, release (\S+?),", ptx)
    return (
        ("numba-cuda", numba_cuda.__version__),
        ("nvvm", build.group(1) if build else "unknown"),
        ("ptx-isa", f"{isa[0]}.{isa[1]}" if isa else "unknown"),
    )


def compile_image(py_func, argtypes, options: CompileOptions) -> KernelImage:
    """Compile ``py_func`` for ``argtypes`` to PTX for each of ``options.targets``.

    Needs no GPU or driver: typing runs for the lowest target and NVVM lowers the
    same library once per target. A failure raises a :class:`CompileError` that
    is also an instance of numba's own exception class (``TypingError``, ...).
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
                forceinline=options.forceinline, inline=options.inline,
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
            if options.launch_bounds is not None:
                from numba.cuda.cudadrv import nvvm

                nvvm.set_launch_bounds(fn, options.launch_bounds)
            ptx, modules, entry = _kernel_ptx(lib, fn.name, options.targets)
            cooperative = bool(getattr(lib, "use_cooperative", False))
            # Every module's PTX, as numba-cuda joins it (cached by the library).
            extra = implicit_links(lib, lib.get_asm_str(cc=lowest))
    except Exception as exc:
        if isinstance(exc, CompileError):
            raise
        raise numba_compile_error(
            exc, f"compiling {name} for ({', '.join(map(str, argtypes))}) failed:\n{exc}"
        ) from exc
    if lowest < BFLOAT16_MIN_CC and uses_bfloat16_shims(extra):
        # Compiled again for the devices that can run it, as numba-cuda compiles
        # bfloat16 only for them; a worker with an older GPU is told the targets.
        targets = tuple(max(cc, BFLOAT16_MIN_CC) for cc in options.targets)
        return compile_image(py_func, argtypes, replace(options, targets=targets))
    analysis = analyse(cres.type_annotation, len(argtypes))
    positions = position_uses(cres.type_annotation, len(argtypes))
    links = modules + link_inputs(tuple(options.link) + tuple(extra), lowest, options,
                                  lto=options.lto)
    # Options at their defaults are left out, so that images (and their
    # hashes) of kernels that do not use them stay as they were.
    extra_options = tuple(
        (key, value) for key, value, default in (
            ("cooperative", cooperative, False),
            # numba-cuda turns lto on by default; nvJitLink's LTO needs LTO-IR
            # inputs, and the kernel itself travels as PTX.
            ("lto", any(x.kind == "ltoir" for x in links), False),
            ("shared_memory_carveout", options.shared_memory_carveout, None),
        ) if value != default
    )
    return KernelImage(
        name=name,
        entry=entry,
        ptx=ptx,
        args=specs,
        # A store through a pointer argument (cuda.carray(ptr, ...)) writes memory
        # that the caller owns by address: nothing to copy back, as in numba.
        writes=tuple(i for i in sorted(analysis.written) if specs[i].kind != "scalar"),
        grid_ndim=analysis.grid_ndim,
        links=links,
        options=(
            ("debug", options.debug),
            ("fastmath", options.fastmath),
            ("lineinfo", options.lineinfo),
            ("max_registers", options.max_registers),
        ) + extra_options,
        versions=_versions(ptx[0][1]),
        exceptions=_exception_table(cres.call_helper) if options.debug else (),
        positions=positions,
    )


_ERROR_CLASSES: dict = {}


def numba_compile_error(exc: Exception, message: str) -> CompileError:
    """A :class:`CompileError` that is also an instance of ``exc``'s class.

    Code written for numba-cuda catches ``TypingError`` and friends; daskgpu's
    catches ``CompileError``. Both catch this.
    """
    base = type(exc)
    cls = _ERROR_CLASSES.get(base)
    if cls is None:
        try:
            cls = type(base.__name__, (CompileError, base), {"__module__": base.__module__})
        except TypeError:  # an incompatible layout (a C exception type)
            cls = CompileError
        _ERROR_CLASSES[base] = cls
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    for attr, value in (("msg", message), ("loc", getattr(exc, "loc", None))):
        try:
            setattr(err, attr, value)
        except AttributeError:  # a read-only property of that class
            pass
    return err
