"""``daskgpu info``: this machine's CUDA driver, nvJitLink and GPUs.

:func:`machine_facts` gathers them as plain data straight from the CUDA
driver and nvJitLink bindings; :func:`print_info` prints them for people or as
JSON. The facts come from the GPU backend
(:meth:`~daskgpu._runtime.backends.gpu.GPUBackend.machine`), whatever
``daskgpu.simulate`` says: this command is about the machine. Nothing here
imports numba, so ``daskgpu info`` runs on worker machines that only have the
runtime.
"""

from __future__ import annotations

import json
import os

from daskgpu._image.ptx import max_ptx_isa
from daskgpu._runtime import backends


def print_info(as_json: bool = False) -> int:
    """Print :func:`machine_facts` for people, or as JSON; return the exit status (0)."""
    facts = machine_facts()
    if as_json:
        print(json.dumps(facts, indent=2))
        return 0
    drv, njl = facts["driver"], facts["nvjitlink"]
    print(f"daskgpu {facts['daskgpu']}")
    if drv["version"] is None:
        print(f"no CUDA driver found ({drv['error']})")
    else:
        print(f"CUDA driver   {_v(drv['version'])} (reads PTX ISA up to {_v(drv['max_ptx_isa'])})")
    if njl["version"] is None:
        print("nvJitLink     not installed "
              "(the driver links PTX; pip install nvidia-nvjitlink-cu12)")
    else:
        print(f"nvJitLink     {_v(njl['version'])} (reads PTX ISA up to {_v(njl['max_ptx_isa'])})")
    if facts["max_ptx_isa"] is not None:
        print(f"loads PTX     up to ISA {_v(facts['max_ptx_isa'])}")
    print(f"CUDA_VISIBLE_DEVICES={facts['cuda_visible_devices'] or '(unset)'}")
    if drv["version"] is not None:
        print(f"{len(facts['devices'])} device(s)")
        for d in facts["devices"]:
            print(f"  {d['index']}  {d['name']}  cc {_v(d['cc'])}  "
                  f"{d['total_memory'] / 2**30:.1f} GiB  {d['uuid']}")
    if not facts["devices"]:
        print(facts["hint"])
    return 0


def _v(version) -> str:
    if tuple(version) == (99, 0):  # max_ptx_isa's answer for releases newer than its table
        return "any (newer than this daskgpu knows)"
    return ".".join(map(str, version))


def machine_facts() -> dict:
    """This machine's CUDA driver, nvJitLink and GPUs, as plain data (no numba)."""
    from daskgpu import __version__

    drv = backends.GPU.machine()
    njl = backends.GPU.linker_version()
    drv["max_ptx_isa"] = list(max_ptx_isa(drv["version"])) if drv["version"] else None
    # nvJitLink compiles the PTX when present; without a driver nothing loads it at all.
    linker = (njl or drv["version"]) if drv["version"] else None
    devices = drv.pop("devices")
    return {
        "daskgpu": __version__,
        "driver": drv,
        "nvjitlink": {"version": list(njl) if njl else None,
                      "max_ptx_isa": list(max_ptx_isa(njl)) if njl else None},
        "max_ptx_isa": list(max_ptx_isa(linker)) if linker else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": devices,
        "hint": ("Kernels still compile here (daskgpu compile, dg.jit). To run them without "
                 "a GPU, use Numba's CUDA simulator: daskgpu demo --simulate, or "
                 "dg.LocalGPUCluster(simulate=True).") if not devices else None,
    }
