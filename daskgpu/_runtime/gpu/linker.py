"""Turn a :class:`KernelImage` into a cubin for one device: with nvJitLink, else the driver.

nvJitLink is called through ``cuda.bindings``; only a worker without it
imports cuda.core, whose ``Linker`` drives the driver's own.
"""

from __future__ import annotations

from daskgpu._errors import LinkError, PTXVersionError
from daskgpu._image.ptx import max_ptx_isa, ptx_isa_version
from daskgpu._runtime.gpu.driver import driver_version, nvjitlink_version


def check_ptx_version(ptx: str, name: str) -> None:
    """Refuse PTX newer than the linker in use can read, naming both versions."""
    isa = ptx_isa_version(ptx)
    if isa is None:
        raise LinkError("the kernel's PTX has no '.version' directive; it is not PTX text")
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
    inputs = [("ptx", ptx.encode(), image.name)]
    inputs += [(link.kind, link.data, link.name) for link in image.links]
    if image.option("cooperative"):
        # Grid synchronisation lives in the CUDA toolkit's device runtime.
        inputs.append(("library", cudadevrt(), "cudadevrt"))
    # Link-time optimisation needs LTO-IR among the inputs (nvJitLink fails
    # on PTX alone with it on).
    lto = any(x.kind == "ltoir" for x in image.links)
    arch = f"sm_{cc[0]}{cc[1]}"
    try:
        if nvjitlink_version():
            return _nvjitlink(inputs, arch, image, lto)
        return _driver_link(inputs, arch, image, lto)
    except _Failed as failed:
        message = str(failed.__cause__).replace("\x00", "").rstrip()
        log = failed.log.replace("\x00", "").strip()
        raise LinkError(
            f"linking kernel {image.name!r} for {arch} failed: {message}"
            + (f"\nlinker log:\n{log}" if log and log not in message else "")
        ) from failed.__cause__


class _Failed(Exception):
    """A link that failed, with the linker's log; raised from the linker's own error."""

    def __init__(self, log: str):
        self.log = log


#: nvJitLink's input types by :attr:`~daskgpu._image.image.LinkInput.kind`.
_NVJITLINK_INPUTS = {"ptx": "PTX", "cubin": "CUBIN", "fatbin": "FATBIN", "ltoir": "LTOIR",
                     "object": "OBJECT", "library": "LIBRARY"}


def _nvjitlink(inputs, arch: str, image, lto: bool) -> bytes:
    # Called directly, not through cuda.core's Linker (which makes the same
    # calls, byte for byte the same cubin): importing cuda.core took 0.24 s
    # of a fresh worker's 0.75 s to its first result on the H200 (cProfile).
    from cuda.bindings import nvjitlink

    options = [f"-arch={arch}"]
    if image.option("max_registers"):
        options.append(f"-maxrregcount={image.option('max_registers')}")
    if image.option("debug"):
        options.append("-g")
    if image.option("lineinfo"):
        options.append("-lineinfo")
    if lto:
        options.append("-lto")
    handle = nvjitlink.create(len(options), options)
    try:
        for kind, data, name in inputs:
            kind = getattr(nvjitlink.InputType, _NVJITLINK_INPUTS[kind])
            nvjitlink.add_data(handle, kind, data, len(data), name)
        nvjitlink.complete(handle)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    except nvjitlink.nvJitLinkError as exc:
        log = bytearray(nvjitlink.get_error_log_size(handle))
        nvjitlink.get_error_log(handle, log)
        raise _Failed(log.decode(errors="replace")) from exc
    finally:
        nvjitlink.destroy(handle)


def _driver_link(inputs, arch: str, image, lto: bool) -> bytes:
    """Link with the driver's linker, through cuda.core, where nvJitLink is not installed."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    make = {"ptx": ObjectCode.from_ptx, "cubin": ObjectCode.from_cubin,
            "fatbin": ObjectCode.from_fatbin, "ltoir": ObjectCode.from_ltoir,
            "object": ObjectCode.from_object, "library": ObjectCode.from_library}
    options = LinkerOptions(
        name=image.name,
        arch=arch,
        max_register_count=image.option("max_registers"),
        debug=bool(image.option("debug")) or None,
        lineinfo=bool(image.option("lineinfo")) or None,
        link_time_optimization=lto or None,
    )
    linker = None
    try:
        linker = Linker(*(make[kind](data, name=name) for kind, data, name in inputs),
                        options=options)
        return bytes(linker.link("cubin").code)
    except Exception as exc:
        log = ""
        if linker is not None:
            try:
                log = linker.get_error_log()
            except Exception:
                pass
        raise _Failed(log) from exc
    finally:
        if linker is not None:
            linker.close()


_cudadevrt = []


def cudadevrt() -> bytes:
    """The bytes of this worker's ``libcudadevrt.a``, read once per process.

    Looked up as numba-cuda does, without numba: the CUDA wheels' or toolkit's
    static library directory, found by ``cuda.pathfinder``, then
    ``$CUDA_HOME``/``$CUDA_PATH`` and the usual toolkit locations.
    """
    if _cudadevrt:
        return _cudadevrt[0]
    import glob
    import os

    candidates = []
    try:
        from cuda import pathfinder

        candidates.append(pathfinder.find_static_lib("cudadevrt"))
    except Exception:  # an older pathfinder, or a wheel-less install: search below
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates += [os.path.join(root, d, "libcudadevrt.a")
                           for d in ("lib64", "lib", "targets/x86_64-linux/lib",
                                     "targets/sbsa-linux/lib")]
    candidates += sorted(glob.glob("/usr/local/cuda-*/lib64/libcudadevrt.a"), reverse=True)
    for path in candidates:
        if path and os.path.isfile(path):
            with open(path, "rb") as f:
                _cudadevrt.append(f.read())
            return _cudadevrt[0]
    raise LinkError(
        "this kernel uses cooperative groups (grid.sync()), which links the CUDA "
        "device runtime libcudadevrt.a, and none was found on this worker. Install "
        "it (pip install nvidia-cuda-runtime-cu12, or the CUDA toolkit) or set "
        "CUDA_HOME to a toolkit that has lib64/libcudadevrt.a."
    )
