"""Turn a :class:`KernelImage` into a cubin for one device with cuda.core's Linker."""

from __future__ import annotations

import re

from cuda.core import Linker, LinkerOptions, ObjectCode

from daskgpu._errors import LinkError, PTXVersionError
from daskgpu._runtime._cuda import driver_version, nvjitlink_version

# The newest PTX ISA each CUDA release reads (CUDA release -> PTX ISA). Releases
# missing here (12.7) read what the previous one did.
_PTX_ISA_OF_CUDA = {
    (11, 0): (7, 0), (11, 1): (7, 1), (11, 2): (7, 2), (11, 3): (7, 3),
    (11, 4): (7, 4), (11, 5): (7, 5), (11, 6): (7, 6), (11, 7): (7, 7),
    (11, 8): (7, 8), (12, 0): (8, 0), (12, 1): (8, 1), (12, 2): (8, 2),
    (12, 3): (8, 3), (12, 4): (8, 4), (12, 5): (8, 5), (12, 6): (8, 5),
    (12, 8): (8, 7), (12, 9): (8, 8), (13, 0): (9, 0), (13, 1): (9, 1),
    (13, 2): (9, 2),
}

_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)


def ptx_isa_version(ptx: str) -> tuple:
    """The ``.version`` directive of a PTX text as ``(major, minor)``."""
    m = _VERSION_RE.search(ptx)
    if m is None:
        raise LinkError("the kernel's PTX has no '.version' directive; it is not PTX text")
    return int(m.group(1)), int(m.group(2))


def max_ptx_isa(cuda_version: tuple) -> tuple:
    """The newest PTX ISA that a CUDA release (driver or nvJitLink) reads."""
    if tuple(cuda_version) > max(_PTX_ISA_OF_CUDA):
        # Newer than this table: refuse nothing rather than guess.
        return (99, 0)
    known = [v for v in _PTX_ISA_OF_CUDA if v <= tuple(cuda_version)]
    return _PTX_ISA_OF_CUDA[max(known)] if known else (0, 0)


def check_ptx_version(ptx: str, name: str) -> None:
    """Refuse PTX newer than the linker in use can read, naming both versions."""
    isa = ptx_isa_version(ptx)
    njl = nvjitlink_version()
    # nvJitLink compiles the PTX itself, so only its version matters (and no
    # driver is needed to ask it); without it the driver's own JIT does.
    if njl and isa <= max_ptx_isa(njl):
        return
    drv = driver_version()
    linker_version, linker = (njl, "nvJitLink") if njl else (drv, "the CUDA driver")
    if isa <= max_ptx_isa(linker_version):
        return
    raise PTXVersionError(
        f"kernel {name!r} was compiled to PTX ISA {isa[0]}.{isa[1]}, but {linker} "
        f"{linker_version[0]}.{linker_version[1]} on this worker reads PTX up to "
        f"{'.'.join(map(str, max_ptx_isa(linker_version)))} (driver "
        f"{drv[0]}.{drv[1]}, nvJitLink {'.'.join(map(str, njl)) if njl else 'not installed'}). "
        "Compile on a client with an older toolkit extra (pip install 'daskgpu[cu12]'), "
        "or install a newer driver / nvidia-nvjitlink on the workers."
    )


def link_cubin(image, cc: tuple) -> bytes:
    """Link ``image``'s PTX for compute capability ``cc``; return the cubin bytes."""
    ptx = image.ptx_for(cc)
    if ptx is None:
        targets = ", ".join(f"{a}.{b}" for a, b in image.targets)
        raise LinkError(
            f"kernel {image.name!r} carries PTX for compute capabilities [{targets}], "
            f"none of which runs on this device (cc {cc[0]}.{cc[1]}). Compile it with "
            f"a target at or below {cc[0]}.{cc[1]}, e.g. dg.jit(..., targets=['{cc[0]}.{cc[1]}'])."
        )
    check_ptx_version(ptx, image.name)
    inputs = [ObjectCode.from_ptx(ptx.encode(), name=image.name)]
    for link in image.links:
        inputs.append(_object_code(link))
    options = LinkerOptions(
        name=image.name,
        arch=f"sm_{cc[0]}{cc[1]}",
        max_register_count=image.option("max_registers"),
        debug=bool(image.option("debug")) or None,
        lineinfo=bool(image.option("lineinfo")) or None,
    )
    linker = None
    try:
        linker = Linker(*inputs, options=options)
        return bytes(linker.link("cubin").code)
    except Exception as exc:
        log = ""
        if linker is not None:
            try:
                log = linker.get_error_log()
            except Exception:
                pass
        message = str(exc).replace("\x00", "").rstrip()
        log = log.replace("\x00", "").strip()
        raise LinkError(
            f"linking kernel {image.name!r} for sm_{cc[0]}{cc[1]} failed: {message}"
            + (f"\nlinker log:\n{log}" if log and log not in message else "")
        ) from exc
    finally:
        if linker is not None:
            linker.close()


_FROM_KIND = {
    "ptx": ObjectCode.from_ptx,
    "cubin": ObjectCode.from_cubin,
    "fatbin": ObjectCode.from_fatbin,
    "ltoir": ObjectCode.from_ltoir,
    "object": ObjectCode.from_object,
    "library": ObjectCode.from_library,
}


def _object_code(link) -> ObjectCode:
    return _FROM_KIND[link.kind](link.data, name=link.name)
