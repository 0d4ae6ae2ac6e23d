"""``daskgpu compile`` (a function to a kernel bundle) and ``daskgpu inspect``."""

from __future__ import annotations

import json

from daskgpu._cli.common import as_kernel, import_module, resolve
from daskgpu._errors import UsageError
from daskgpu._image.ptx import ptx_isa_version


def cmd_compile(ns) -> int:
    from daskgpu._runtime.kernel_files import save

    module_ref, sep, attr = ns.target.rpartition(":")
    if not sep or not module_ref or not attr:
        raise UsageError(f"write the kernel as MODULE:FUNCTION (or path/to/file.py:FUNCTION), "
                         f"got {ns.target!r}")
    obj = resolve(import_module(module_ref), attr, module_ref)
    overrides = {}
    if ns.cc:
        overrides["targets"] = tuple(ns.cc)
    if ns.fastmath:
        overrides["fastmath"] = True
    if ns.lineinfo:
        overrides["lineinfo"] = True
    if ns.max_registers is not None:
        overrides["max_registers"] = ns.max_registers
    kernel = as_kernel(obj, ns.sig, overrides, ns.target)
    if not kernel.images:
        raise UsageError(f"{ns.target} has no compiled signature: give one with "
                         "--sig 'void(float32[::1], ...)'")
    output = ns.output or f"{attr.rpartition('.')[2]}.dgk"
    digest = save(kernel, output)
    targets = sorted({cc for im in kernel.images for cc in im.targets})
    print(f"wrote {output}: kernel {kernel.__name__}, "
          f"{len(kernel.images)} signature(s) {', '.join(kernel.signatures)}, "
          f"targets {', '.join(f'sm_{a}{b}' for a, b in targets)}, sha256 {digest[:16]}")
    return 0


def cmd_inspect(ns) -> int:
    from daskgpu._runtime.kernel_files import read

    kernel, info = read(ns.bundle)
    doc = {
        "path": info.path,
        "size": info.size,
        "format_version": info.version,
        "daskgpu": info.producer,
        "sha256": info.sha256,
        "kernel": kernel.__name__,
        "images": [_describe_image(im) for im in kernel.images],
    }
    if ns.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"bundle     {info.path} ({_size(info.size)}, format version {info.version}, "
          f"written by daskgpu {info.producer})")
    print(f"sha256     {info.sha256}")
    print(f"kernel     {kernel.__name__}  ({len(kernel.images)} signature(s))")
    for im in doc["images"]:
        print(f"\n  signature  {im['signature']}")
        print(f"  name       {im['name']}")
        print(f"  entry      {im['entry']}")
        print("  targets    " + ", ".join(
            f"sm_{cc.replace('.', '')} (PTX ISA {t['ptx_isa']}, {_size(t['ptx_bytes'])})"
            for cc, t in im["targets"].items()))
        writes = ", ".join(f"#{i} {im['params'][i]}" for i in im["writes"]) or "nothing"
        print(f"  writes     {writes}")
        print(f"  grid ndim  {im['grid_ndim']}")
        print("  options    " + (", ".join(f"{k}={v}" for k, v in im["options"].items()) or "-"))
        if im["links"]:
            print("  links      " + ", ".join(
                f"{x['name']} ({x['kind']}, {_size(x['size'])})" for x in im["links"]))
        print("  built by   " + (", ".join(f"{k} {v}" for k, v in im["versions"].items()) or "-"))
        print(f"  hash       {im['hash']}")
    return 0


def _ptx_isa(text: str):
    isa = ptx_isa_version(text)
    return None if isa is None else f"{isa[0]}.{isa[1]}"


def _describe_image(im) -> dict:
    return {
        "signature": im.signature,
        "name": im.name,
        "entry": im.entry,
        "params": [str(a) for a in im.args],
        "targets": {f"{a}.{b}": {"ptx_bytes": len(text.encode()), "ptx_isa": _ptx_isa(text)}
                    for (a, b), text in im.ptx},
        "writes": list(im.writes),
        "grid_ndim": im.grid_ndim,
        "options": dict(im.options),
        "links": [{"name": x.name, "kind": x.kind, "size": len(x.data)} for x in im.links],
        "versions": dict(im.versions),
        "hash": im.hash,
    }


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"
