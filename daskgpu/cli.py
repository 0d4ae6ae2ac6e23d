"""The ``daskgpu`` command line.

``daskgpu info`` (this machine's GPUs, driver and nvJitLink), ``daskgpu worker``
(one Dask worker per local GPU), ``daskgpu demo``, ``daskgpu compile`` (a
function to a kernel bundle), ``daskgpu inspect`` (what a bundle holds),
``daskgpu bench`` and ``daskgpu batch``. ``info``, ``worker`` and ``inspect``
never import numba, so they run on worker machines that only have the runtime.

This module holds the parser, ``compile`` and ``inspect``, and the dispatch to
the other commands, which live in :mod:`daskgpu._info`, :mod:`daskgpu._workers`,
:mod:`daskgpu._demo`, :mod:`daskgpu._bench` and :mod:`daskgpu._batch_cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys

from daskgpu._errors import DaskGPUError
# machine_facts, local_devices and worker_specs are also reachable here.
from daskgpu._info import machine_facts, print_info  # noqa: F401
from daskgpu._workers import local_devices, run_workers, worker_specs  # noqa: F401

# Subcommands whose arguments belong to another module's own parser.
_PASSTHROUGH = {"bench": "daskgpu._bench", "batch": "daskgpu._batch_cli"}


class UsageError(DaskGPUError, ValueError):
    """A command line this parser refuses; raised instead of exiting."""

    def __init__(self, message: str, parser: argparse.ArgumentParser | None = None):
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message, self)


class _RootParser(_Parser):
    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if args and args[0] in _PASSTHROUGH:  # their options are not ours to parse
            return argparse.Namespace(command=args[0], args=args[1:], _run=_cmd_passthrough), []
        ns, extra = super().parse_known_args(args, namespace)
        check = getattr(ns, "_check", None)
        if check is not None:
            check(self, ns)
        return ns, extra


def build_parser() -> argparse.ArgumentParser:
    """The ``daskgpu`` argument parser; usage errors raise :class:`UsageError`.

    Examples
    --------
    >>> ns = build_parser().parse_args(["worker", "tcp://scheduler:8786", "--devices", "0,1"])
    >>> ns.scheduler, ns.devices
    ('tcp://scheduler:8786', ['0', '1'])
    >>> build_parser().parse_args(["worker", "--nthreads", "zero"])
    Traceback (most recent call last):
    ...
    daskgpu.cli.UsageError: argument --nthreads: expected a positive integer, got 'zero'
    """
    parser = _RootParser(prog="daskgpu", description="Run Numba CUDA kernels on Dask GPU clusters.")
    from daskgpu import __version__

    parser.add_argument("--version", action="version", version=f"daskgpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("info", help="GPUs, driver and nvJitLink versions of this machine")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    p.set_defaults(_run=_cmd_info)

    p = sub.add_parser("worker", help="start one Dask worker per local GPU")
    p.add_argument("scheduler", nargs="?", metavar="SCHEDULER",
                   help="scheduler address, e.g. tcp://scheduler:8786 (default: the "
                        "dask config 'scheduler-address', i.e. DASK_SCHEDULER_ADDRESS)")
    p.add_argument("--scheduler-file", metavar="PATH", help="read the scheduler address from a file")
    p.add_argument("--devices", type=_device_list, metavar="LIST",
                   help="GPUs to serve, e.g. 0,1 or GPU-UUIDs (default: CUDA_VISIBLE_DEVICES, "
                        "else every GPU the driver sees)")
    p.add_argument("--nthreads", type=_positive_int, default=1, metavar="N",
                   help="threads per worker (default 1)")
    p.add_argument("--resources", type=_resources, default={}, metavar="SPEC",
                   help="extra worker resources, e.g. 'GPU=1 MEM=16e9' (GPU=1 is always set)")
    p.add_argument("--name", help="worker name; with several GPUs, NAME-<device>")
    p.add_argument("--memory-limit", default="auto", help="host memory per worker (default auto)")
    p.add_argument("--local-directory", metavar="PATH", help="scratch directory of the workers")
    p.add_argument("--death-timeout", type=float, metavar="SECONDS",
                   help="give up when the scheduler is unreachable this long")
    p.add_argument("--dashboard-address", metavar="ADDRESS",
                   help="worker dashboard address (default: a free port)")
    p.set_defaults(_run=_cmd_worker, _check=_check_worker)

    p = sub.add_parser("demo", help="run the demo job on the embedded local GPU cluster")
    p.add_argument("--size", type=_positive_int, metavar="N", help="problem size")
    p.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None,
                   help="run in Numba's CUDA simulator (default: only without a GPU)")
    p.set_defaults(_run=_cmd_demo)

    p = sub.add_parser("compile", help="compile MODULE:FUNCTION to a kernel bundle")
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="a dotted module or a .py path, and a function, daskgpu kernel or "
                        "numba.cuda.jit kernel in it")
    p.add_argument("--sig", action="append", default=[], metavar="SIG",
                   help="a Numba signature such as 'void(float32[::1], float32)'; repeatable")
    p.add_argument("--cc", action="append", default=[], metavar="CC",
                   help="a PTX target compute capability such as 7.5; repeatable "
                        "(default: daskgpu.target-cc)")
    p.add_argument("--fastmath", action="store_true", help="compile with fast math")
    p.add_argument("--lineinfo", action="store_true", help="keep line information")
    p.add_argument("--max-registers", type=_positive_int, metavar="N",
                   help="registers per thread at most")
    p.add_argument("-o", "--output", metavar="PATH", help="bundle file (default FUNCTION.dgk)")
    p.set_defaults(_run=_cmd_compile)

    p = sub.add_parser("inspect", help="show what a kernel bundle holds")
    p.add_argument("bundle", metavar="BUNDLE", help="a .dgk file")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    p.set_defaults(_run=_cmd_inspect)

    for name, what in (("bench", "the performance comparison (on a GPU)"),
                       ("batch", "run a kernel over stored arrays, with progress and resume")):
        p = sub.add_parser(name, help=what, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER, help=f"arguments of daskgpu {name}")
        p.set_defaults(_run=_cmd_passthrough)
    return parser


def main(argv=None) -> int:
    """Run the ``daskgpu`` command line; return the exit status.

    Examples
    --------
    >>> main(["inspect", "no-such-file.dgk"])
    1
    """
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except UsageError as exc:
        (exc.parser or parser).print_usage(sys.stderr)
        print(f"{(exc.parser or parser).prog}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return ns._run(ns) or 0
    except UsageError as exc:
        print(f"daskgpu {ns.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except (DaskGPUError, OSError) as exc:
        print(f"daskgpu {ns.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# -- argument types ------------------------------------------------------------
def _positive_int(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _device_list(text) -> list:
    devices = [d.strip() for d in str(text).split(",") if d.strip()]
    if not devices:
        raise argparse.ArgumentTypeError(f"no device in {text!r}; write it as 0,1")
    if len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"a device appears twice in {text!r}")
    return devices


def _resources(text) -> dict:
    out = {}
    for item in str(text).replace(",", " ").split():
        key, eq, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not eq or not key or number is None or number < 0:
            raise argparse.ArgumentTypeError(
                f"cannot read resource {item!r}; write resources as 'GPU=1 MEM=16e9'"
            )
        out[key] = int(number) if number.is_integer() else number
    return out


# -- info and worker -------------------------------------------------------------
def _cmd_info(ns) -> int:
    return print_info(as_json=ns.json)


def _check_worker(parser, ns):
    if ns.scheduler and ns.scheduler_file:
        raise UsageError("give either SCHEDULER or --scheduler-file, not both", parser)


def _cmd_worker(ns) -> int:
    specs = worker_specs(
        ns.scheduler, scheduler_file=ns.scheduler_file, devices=ns.devices,
        nthreads=ns.nthreads, resources=ns.resources, name=ns.name,
        memory_limit=ns.memory_limit, local_directory=ns.local_directory,
        death_timeout=ns.death_timeout, dashboard_address=ns.dashboard_address,
    )
    try:
        asyncio.run(run_workers(specs))
    except asyncio.TimeoutError:
        raise DaskGPUError("timed out starting the workers: is the scheduler reachable?") from None
    except (OSError, RuntimeError) as exc:  # the nannies have logged the details
        raise DaskGPUError(f"the workers failed to start: {exc}") from None
    return 0


# -- demo, bench, batch ----------------------------------------------------------
def _cmd_demo(ns) -> int:
    argv = [] if ns.size is None else ["--size", str(ns.size)]
    if ns.simulate is not None:
        argv.append("--simulate" if ns.simulate else "--no-simulate")
    return importlib.import_module("daskgpu._demo").main(argv) or 0


def _cmd_passthrough(ns) -> int:
    module = _PASSTHROUGH[ns.command]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        print(f"daskgpu {ns.command}: not yet implemented in this version of daskgpu",
              file=sys.stderr)
        return 2
    return mod.main(list(ns.args)) or 0


# -- compile and inspect --------------------------------------------------------
def _cmd_compile(ns) -> int:
    from daskgpu._bundle import save

    module_ref, sep, attr = ns.target.rpartition(":")
    if not sep or not module_ref or not attr:
        raise UsageError(f"write the kernel as MODULE:FUNCTION (or path/to/file.py:FUNCTION), "
                         f"got {ns.target!r}")
    obj = _resolve(_import_module(module_ref), attr, module_ref)
    overrides = {}
    if ns.cc:
        overrides["targets"] = tuple(ns.cc)
    if ns.fastmath:
        overrides["fastmath"] = True
    if ns.lineinfo:
        overrides["lineinfo"] = True
    if ns.max_registers is not None:
        overrides["max_registers"] = ns.max_registers
    kernel = _as_kernel(obj, ns.sig, overrides, ns.target)
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


def _import_module(ref: str):
    is_path = ref.endswith(".py") or os.sep in ref or (os.altsep or os.sep) in ref
    try:
        if is_path:
            path = os.path.abspath(ref)
            if not os.path.isfile(path):
                raise UsageError(f"no Python file {ref!r}")
            name = os.path.splitext(os.path.basename(path))[0]
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, os.path.dirname(path))  # so it can import its neighbours
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does
        return importlib.import_module(ref)
    except UsageError:
        raise
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import {ref!r}: {exc}") from None
    except Exception as exc:
        raise UsageError(f"importing {ref!r} failed: {type(exc).__name__}: {exc}") from None


def _resolve(module, attr: str, module_ref: str):
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = sorted(n for n, v in vars(module).items()
                           if not n.startswith("_") and callable(v) and not inspect.isclass(v))
            raise UsageError(f"{module_ref} has no {attr!r}; it defines {found}")
        obj = getattr(obj, part)
    return obj


def _as_kernel(obj, sigs, overrides, what):
    from daskgpu._kernel import Kernel, jit, kernel
    from daskgpu._launch import PTXKernel

    if isinstance(obj, PTXKernel):
        if sigs or overrides:
            raise UsageError(f"{what} is already compiled PTX (a loaded bundle); "
                             "it cannot compile new signatures or change options")
        return obj
    if isinstance(obj, Kernel):
        if not sigs and not overrides:
            return obj
        options = dataclasses.replace(obj.options, **overrides)
        return Kernel(obj.py_func, sigs or list(obj._images), options)
    if hasattr(obj, "py_func") and hasattr(obj, "targetoptions"):  # numba.cuda.jit
        try:
            return kernel(obj, sigs or None, **overrides)
        except TypeError as exc:
            raise UsageError(str(exc)) from None
    if inspect.isfunction(obj):
        if not sigs:
            raise UsageError(f"{what} is a plain function: give its signature(s) with "
                             "--sig 'void(float32[::1], ...)'")
        return jit(sigs, **overrides)(obj)
    raise UsageError(f"{what} is a {type(obj).__name__}, not a function or kernel")


def _cmd_inspect(ns) -> int:
    from daskgpu._bundle import read

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


_PTX_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+\.\d+)", re.MULTILINE)


def _ptx_isa(text: str):
    m = _PTX_VERSION_RE.search(text)
    return m.group(1) if m else None


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
