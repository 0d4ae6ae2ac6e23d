"""The ``daskgpu batch`` command line: its parser, the kernel it names, its exit status.

``daskgpu batch KERNEL --input PATH --output PATH[:DTYPE] ...`` parses its
arguments here, loads the kernel (a ``.dgk`` bundle or MODULE:FUNCTION),
connects to a scheduler or starts a local GPU cluster, and hands the job to
:func:`daskgpu._dask.batch.run_batch`; the report's summary goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from daskgpu._cli.common import Parser, as_kernel, import_module, resolve
from daskgpu._dask.batch import local_client as _local_client
from daskgpu._dask.batch import run_batch
from daskgpu._errors import (
    BatchError,
    BundleError,
    ConfigError,
    DaskGPUError,
    LaunchConfigError,
    UsageError,
)

__all__ = ["build_parser", "load_kernel", "main"]

# Exit statuses of ``daskgpu batch``, besides 0 (complete) and 2 (usage).
FAILED, INCOMPLETE, INTERRUPTED = 1, 3, 130


def _output(text):
    """``PATH`` or ``(PATH, dtype)`` from ``PATH[:DTYPE]``; a bad spec is a usage error.

    A colon followed by no path separator starts a dtype, so ``z.zarr:floot32``
    is refused rather than created as a directory of that name.
    """
    path, sep, dtype = text.rpartition(":")
    spec = None
    if sep and path and not any(c in dtype for c in "/\\"):
        try:
            spec = np.dtype(dtype) if dtype else None
        except (TypeError, ValueError):
            spec = None
        if spec is None:
            raise argparse.ArgumentTypeError(
                f"--output {text!r}: {dtype!r} is not a dtype; write PATH:DTYPE with a numpy "
                "dtype, e.g. out.zarr:float32, or PATH alone for the first input's dtype")
        text = path
    if text.endswith(".npy"):
        raise argparse.ArgumentTypeError(
            f"--output {text!r}: batch writes zarr arrays (chunk by chunk, resumable), not "
            f".npy files; name it e.g. {text[:-4] + '.zarr'!r} and convert afterwards with "
            "numpy.save if you need a .npy")
    return text if spec is None else (text, spec)


def _devices(text):
    """``--devices``: GPU ordinals or UUIDs, checked as LocalGPUCluster checks them."""
    from daskgpu._dask.cluster import parse_devices

    try:
        return list(parse_devices(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _scalar(text):
    """``3`` (int), ``2.5`` (float), or typed as ``float32:2.5``."""
    kind, sep, value = text.partition(":")
    if sep:
        try:
            return np.dtype(kind).type(value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read scalar {text!r}: {exc}") from None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"cannot read scalar {text!r}; write 3, 2.5 or "
                                     "float32:2.5")


def _chunks(text):
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if not parts or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"cannot read chunks {text!r}; write 1000 or 256,256")
    return parts[0] if len(parts) == 1 else parts


def build_parser() -> argparse.ArgumentParser:
    """The ``daskgpu batch`` argument parser.

    Examples
    --------
    >>> ns = build_parser().parse_args(["k.dgk", "--input", "x.zarr", "--output",
    ...                                 "z.zarr:float32", "--scalar", "float32:2"])
    >>> ns.output, ns.scalar
    ([('z.zarr', dtype('float32'))], [np.float32(2.0)])
    """
    parser = Parser(
        prog="daskgpu batch",
        description="Run a kernel over stored arrays (zarr or .npy) and write its outputs "
                    "to zarr chunk by chunk, with progress, retries and resume. The kernel "
                    "is called per chunk as kernel(*outputs, *scalars, *inputs).",
        epilog="Exit status: 0 when every chunk is written, 1 when chunks failed, 2 for a "
               "usage error (bad arguments, an input that cannot be read, an output that "
               "overlaps an input or holds another job), 3 when chunks are left "
               "(--max-chunks), 130 when interrupted. "
               "Rerun the same command to compute only the chunks not yet written.")
    parser.add_argument("kernel", metavar="KERNEL",
                        help="a kernel bundle (.dgk), or MODULE:FUNCTION (a dotted module "
                             "or a .py path)")
    parser.add_argument("--sig", action="append", default=[], metavar="SIG",
                        help="signature for MODULE:FUNCTION, e.g. 'void(float32[::1], "
                             "float32[::1])'; repeatable (default: from the inputs)")
    parser.add_argument("--input", action="append", default=[], required=True,
                        metavar="PATH", help="a zarr array or .npy file; repeatable, in order")
    parser.add_argument("--output", action="append", default=[], required=True,
                        type=_output, metavar="PATH[:DTYPE]",
                        help="a zarr array to write, e.g. out.zarr:float32 (default dtype: "
                             "the first input's); repeatable, in order")
    parser.add_argument("--scalar", action="append", default=[], type=_scalar,
                        metavar="VALUE", help="3, 2.5 or float32:2.5; repeatable, in order")
    parser.add_argument("--chunks", type=_chunks, metavar="N[,N...]",
                        help="chunk shape (default: the first zarr input's chunks)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on this Dask scheduler (default: a local GPU cluster)")
    where.add_argument("--scheduler-file", metavar="PATH", help="read the scheduler from a file")
    where.add_argument("--devices", metavar="LIST", type=_devices,
                       help="GPUs of the local cluster, e.g. 0,1 (default: all)")
    parser.add_argument("--retries", type=int, default=2, metavar="N",
                        help="attempts to make again for a failing chunk (default 2)")
    parser.add_argument("--max-chunks", type=int, metavar="N",
                        help="compute at most N chunks in this run")
    parser.add_argument("--no-resume", dest="resume", action="store_false",
                        help="overwrite the outputs and compute every chunk")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None,
                        help="run in Numba's CUDA simulator (default: only without a GPU)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")
    return parser


def load_kernel(ref, sigs=()):
    """The kernel named on the command line: a bundle file, or MODULE:FUNCTION."""
    import inspect

    if ref.endswith(".dgk") or os.path.isfile(ref):
        if sigs:
            raise UsageError(f"{ref} is a compiled bundle; --sig is for MODULE:FUNCTION")
        from daskgpu._runtime.kernel_files import load

        return load(ref)
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise UsageError(f"KERNEL is a .dgk bundle or MODULE:FUNCTION, got {ref!r}")
    module = import_module(module_ref)
    if module_ref.endswith(".py"):  # simulated workers cannot import it by name
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    obj = resolve(module, attr, module_ref)
    if inspect.isfunction(obj) and not sigs:
        from daskgpu._compiler.kernel import jit

        return jit(obj)  # compiled for the inputs' dtypes
    return as_kernel(obj, list(sigs), {}, ref)


def main(argv=None) -> int:
    """``daskgpu batch KERNEL --input PATH --output PATH[:DTYPE] ...``; the exit status.

    Examples
    --------
    >>> main(["saxpy.dgk", "--input", "x.zarr", "--input", "y.zarr",
    ...       "--output", "z.zarr:float32", "--scalar", "2.0"])  # doctest: +SKIP
    batch saxpy: 40 chunks of 25000 over 1000000 on 4 workers; 0 already written, 40 to compute
    chunks written: 100%|##########| 40/40 [00:02<00:00, 19.0chunk/s]
    40/40 chunks written (40 this run, 0 before) in 2.3 s
    0
    """
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
        if ns.retries < 0 or (ns.max_chunks is not None and ns.max_chunks < 0):
            raise UsageError("--retries and --max-chunks take numbers of 0 or more", parser)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"daskgpu batch: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return _main(ns)
    except (UsageError, BatchError, BundleError, ConfigError, LaunchConfigError) as exc:
        # What the command line asked for cannot run as given: a usage error.
        print(f"daskgpu batch: error: {exc}", file=sys.stderr)
        return 2
    except (DaskGPUError, OSError) as exc:
        print(f"daskgpu batch: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        for note in getattr(exc, "__notes__", ()):
            print(note, file=sys.stderr)
        return INTERRUPTED


def _main(ns) -> int:
    from contextlib import ExitStack

    kernel = load_kernel(ns.kernel, ns.sig)
    with ExitStack() as stack:
        client = None
        if ns.scheduler or ns.scheduler_file:
            from distributed import Client

            client = stack.enter_context(Client(ns.scheduler, scheduler_file=ns.scheduler_file))
        elif ns.devices:
            client = _local_client(stack, ns.devices, ns.simulate)
        report = run_batch(kernel, ns.input, ns.output, scalars=ns.scalar, chunks=ns.chunks,
                           client=client, simulate=ns.simulate, retries=ns.retries,
                           progress=ns.progress, resume=ns.resume, max_chunks=ns.max_chunks)
    print(report.summary())
    if report.failed:
        return FAILED
    return 0 if report.complete else INCOMPLETE
