"""The ``daskgpu`` command line.

``daskgpu info`` (this machine's GPUs, driver and nvJitLink), ``daskgpu worker``
(one Dask worker per local GPU), ``daskgpu demo``, ``daskgpu compile`` (a
function to a kernel bundle), ``daskgpu inspect`` (what a bundle holds),
``daskgpu bench`` and ``daskgpu batch``. ``info``, ``worker`` and ``inspect``
never import numba, so they run on worker machines that only have the runtime.

This module holds the parser and the dispatch to the commands, which live in
:mod:`daskgpu._cli.info`, :mod:`daskgpu._cli.workers`, :mod:`daskgpu._cli.demo`,
:mod:`daskgpu._cli.bundle_commands` (``compile`` and ``inspect``),
:mod:`daskgpu._cli.bench` and :mod:`daskgpu._cli.batch`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import os
import sys

from daskgpu._cli import bundle_commands
from daskgpu._cli.common import USAGE_ERRORS, Parser, device_list, positive_int, resources
from daskgpu._cli.info import print_info
from daskgpu._cli.workers import nanny_options, run_workers, worker_security
from daskgpu._errors import CUDAError, DaskGPUError, DeviceError, UsageError
from daskgpu._runtime import backends

# Subcommands whose arguments belong to another module's own parser.
_PASSTHROUGH = {"bench": "daskgpu._cli.bench", "batch": "daskgpu._cli.batch"}


class _RootParser(Parser):
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
    ('tcp://scheduler:8786', [0, 1])
    >>> build_parser().parse_args(["worker", "--nthreads", "zero"])
    Traceback (most recent call last):
    ...
    daskgpu._errors.UsageError: argument --nthreads: expected a positive integer, got 'zero'
    """
    parser = _RootParser(
        prog="daskgpu", description="Run Numba CUDA kernels on Dask GPU clusters.",
        epilog="Without a GPU, kernels run in Numba's CUDA simulator. Exit status: 0 on "
               "success, 1 when the work failed, 2 for a usage error (a bad option, a "
               "kernel or file that cannot be used as given, a command this machine "
               "cannot run). 'daskgpu COMMAND --help' describes each command.")
    from daskgpu import __version__

    parser.add_argument("--version", action="version", version=f"daskgpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, help, description=None, **kw):
        return sub.add_parser(name, help=help, description=description or help[0].upper()
                              + help[1:] + ".", **kw)

    p = command("info", "show this machine's GPUs, CUDA driver and nvJitLink versions, and "
                        "the newest PTX ISA they load")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    p.set_defaults(_run=_cmd_info)

    p = command("worker", "start one Dask worker per local GPU",
                "Start one Dask worker (a Nanny) per local GPU and join a scheduler. Each "
                "worker sees only its GPU (CUDA_VISIBLE_DEVICES), offers the resource "
                "GPU=1 and runs daskgpu's GPUWorkerPlugin. Needs a GPU, except with the "
                "dask config daskgpu.simulate on (DASK_DASKGPU__SIMULATE=1): then one "
                "simulated worker per --devices entry, or one, runs kernels in Numba's "
                "CUDA simulator. Runs until SIGINT or SIGTERM.")
    p.add_argument("scheduler", nargs="?", metavar="SCHEDULER",
                   help="scheduler address, e.g. tcp://scheduler:8786 (default: the "
                        "dask config 'scheduler-address', i.e. DASK_SCHEDULER_ADDRESS)")
    p.add_argument("--scheduler-file", metavar="PATH",
                   help="read the scheduler address from a file")
    p.add_argument("--devices", type=device_list, metavar="LIST",
                   help="GPUs to serve, e.g. 0,1 or GPU-UUIDs (default: CUDA_VISIBLE_DEVICES, "
                        "else every GPU the driver sees; simulated: one)")
    p.add_argument("--nthreads", type=positive_int, default=1, metavar="N",
                   help="threads per worker (default 1)")
    p.add_argument("--resources", type=resources, default={}, metavar="SPEC",
                   help="extra worker resources, e.g. 'GPU=1 MEM=16e9' (GPU=1 is always set)")
    p.add_argument("--name", help="worker name; with several GPUs, NAME-<device>")
    p.add_argument("--memory-limit", default="auto", metavar="BYTES",
                   help="host memory per worker, e.g. 16GB (default auto: the host's "
                        "memory split between the GPUs)")
    p.add_argument("--local-directory", metavar="PATH", help="scratch directory of the workers")
    p.add_argument("--death-timeout", type=float, metavar="SECONDS",
                   help="give up on a worker that has not started (or restarted) and joined "
                        "the scheduler within this many seconds (default 120)")
    p.add_argument("--dashboard-address", metavar="ADDRESS",
                   help="worker dashboard address (default: a free port)")
    for flag, what in (("--tls-ca-file", "CA certificate file"),
                       ("--tls-cert", "the workers' certificate file"),
                       ("--tls-key", "the workers' private key file")):
        p.add_argument(flag, metavar="PATH",
                       help=f"{what}, for a tls:// scheduler, as dask worker takes it "
                            "(default: Dask's distributed.comm.tls settings)")
    p.set_defaults(_run=_cmd_worker, _check=_check_worker)

    p = command("demo", "run the demo job on the embedded local GPU cluster",
                "Start LocalGPUCluster (one worker per GPU; two simulated workers "
                "without one), map a saxpy kernel over the chunks of a dask array, check "
                "the result against NumPy and report the time and where each chunk ran.")
    p.add_argument("--size", type=positive_int, metavar="N",
                   help="elements (float32) per array (default 67,108,864 on a GPU, "
                        "10,000 simulated)")
    p.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None,
                   help="run in Numba's CUDA simulator (default: only without a GPU)")
    p.set_defaults(_run=_cmd_demo)

    p = command("compile", "compile MODULE:FUNCTION to a kernel bundle",
                "Compile a function or kernel to PTX, for each signature given, and write "
                "a kernel bundle (.dgk): a data-only file that launches on GPU machines "
                "without numba. Needs no GPU.")
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
    p.add_argument("--max-registers", type=positive_int, metavar="N",
                   help="registers per thread at most")
    p.add_argument("-o", "--output", metavar="PATH", help="bundle file (default FUNCTION.dgk)")
    p.set_defaults(_run=bundle_commands.cmd_compile)

    p = command("inspect", "show what a kernel bundle holds",
                "Show what a kernel bundle (.dgk) holds: signatures, PTX targets, write "
                "set, options and hashes. Checks the bundle's integrity; runs no code.")
    p.add_argument("bundle", metavar="BUNDLE", help="a .dgk file")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    p.set_defaults(_run=bundle_commands.cmd_inspect)

    for name, what in (("bench", "compare daskgpu with hand-written Numba + Dask "
                                 "(needs a GPU and CuPy)"),
                       ("batch", "run a kernel over stored arrays, with progress and resume")):
        p = command(name, what, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER, help=f"arguments of daskgpu {name}")
        p.set_defaults(_run=_cmd_passthrough)
    return parser


def main(argv=None) -> int:
    """Run the ``daskgpu`` command line; return the exit status.

    Examples
    --------
    >>> main(["inspect", "no-such-file.dgk"])
    2
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
        with _numba_simulator_switch(ns.command):
            return ns._run(ns) or 0
    except (*USAGE_ERRORS, DeviceError) as exc:
        if isinstance(exc, CUDAError):  # the work failed on a GPU this machine has
            print(f"daskgpu {ns.command}: error: {exc}", file=sys.stderr)
            return 1
        # Else a usage error, or a command this machine cannot run (no GPU).
        if getattr(exc, "parser", None) is not None:
            exc.parser.print_usage(sys.stderr)
        print(f"daskgpu {ns.command}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # a command's own parser: --help, or argparse's exit
        return exc.code if isinstance(exc.code, int) else 0
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


@contextlib.contextmanager
def _numba_simulator_switch(command):
    """Read Numba's ``NUMBA_ENABLE_CUDASIM=1`` as what a Numba user means by it: simulate,
    unless ``daskgpu.simulate`` is set, whose value wins.

    The switch turns ``numba.cuda`` into a simulator that cannot compile PTX, so for
    this command it is taken out of the environment (before numba.cuda loads), with
    one notice line, and ``daskgpu.simulate`` is on instead where it is unset; both
    come back after.
    """
    value = os.environ.get("NUMBA_ENABLE_CUDASIM", "")
    if value.strip() in ("", "0") or "numba.cuda" in sys.modules:
        yield  # off, or too late to change: compiling will say what to do
        return
    import dask.config

    from daskgpu import _config

    if _config.is_set("simulate"):
        state = "on" if _config.flag("simulate") else "off"
        print(f"daskgpu {command}: NUMBA_ENABLE_CUDASIM={value} is Numba's switch to its CUDA "
              f"simulator, and is ignored: daskgpu.simulate is set {state}, which wins",
              file=sys.stderr)
        simulate = {}
    else:
        print(f"daskgpu {command}: NUMBA_ENABLE_CUDASIM={value} is Numba's switch to its CUDA "
              "simulator; daskgpu simulates through daskgpu.simulate, which is on for this "
              "command", file=sys.stderr)
        simulate = {"daskgpu.simulate": True}
    del os.environ["NUMBA_ENABLE_CUDASIM"]
    try:
        with dask.config.set(simulate):
            yield
    finally:
        os.environ["NUMBA_ENABLE_CUDASIM"] = value


# -- info and worker -------------------------------------------------------------
def _cmd_info(ns) -> int:
    return print_info(as_json=ns.json)


def _check_worker(parser, ns):
    if ns.scheduler and ns.scheduler_file:
        raise UsageError("give either SCHEDULER or --scheduler-file, not both", parser)


def _cmd_worker(ns) -> int:
    simulate = backends.current().simulated
    specs = nanny_options(
        ns.scheduler, scheduler_file=ns.scheduler_file, devices=ns.devices,
        nthreads=ns.nthreads, resources=ns.resources, name=ns.name,
        memory_limit=ns.memory_limit, local_directory=ns.local_directory,
        death_timeout=ns.death_timeout, dashboard_address=ns.dashboard_address,
        simulate=simulate,
        security=worker_security(ns.scheduler, ns.tls_ca_file, ns.tls_cert, ns.tls_key),
    )
    if simulate:  # the one notice line of a simulated entry point
        print(f"daskgpu worker: daskgpu.simulate is on; {len(specs)} simulated worker(s) "
              "run kernels in Numba's CUDA simulator", file=sys.stderr)
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
    return importlib.import_module("daskgpu._cli.demo").main(argv) or 0


def bench_unavailable():
    """Why ``daskgpu bench`` cannot run on this machine, in one line; None when it can.

    It needs a CUDA GPU and CuPy: its baselines are what users write with them.
    """
    found = backends.GPU.devices()
    if not found.names:
        return (f"daskgpu bench measures on a GPU and this machine has none "
                f"({found.reason}); run it on a GPU machine")
    if importlib.util.find_spec("cupy") is None:
        return ("daskgpu bench needs CuPy, which is not installed: "
                "pip install \"daskgpu[bench]\" (CUDA 12; daskgpu[bench-cu13] for CUDA 13)")
    return None


def _cmd_passthrough(ns) -> int:
    module = _PASSTHROUGH[ns.command]
    if ns.command == "bench" and not {"-h", "--help"} & set(ns.args):
        why = bench_unavailable()
        if why is not None:
            print(why, file=sys.stderr)
            return 2
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        print(f"daskgpu {ns.command}: not yet implemented in this version of daskgpu",
              file=sys.stderr)
        return 2
    return mod.main(list(ns.args)) or 0


