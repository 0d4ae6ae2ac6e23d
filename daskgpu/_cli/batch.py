"""The ``daskgpu batch`` command line: its parser, the kernel it names, its exit status.

``daskgpu batch KERNEL --input PATH --output PATH[:DTYPE] ...`` parses its
arguments here, loads the kernel (a ``.dgk`` bundle or MODULE:FUNCTION),
connects to a scheduler or starts a local GPU cluster, and hands the job to
:func:`daskgpu._dask.batch.run_batch`; the report's summary goes to stdout.
A local cluster starts only when a chunk is left to compute; it admits only
this run (temporary TLS credentials). Progress goes to stderr: a bar on a
terminal, plain lines in a log. SIGTERM (SLURM's time limit) stops a run as
Ctrl-C does: the chunks written are kept, and one line says how to resume (in a
job script, ``exec`` it, or SLURM kills it with the script's shell).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

from daskgpu._cli.common import Parser, as_kernel, import_module, resolve
from daskgpu._dask.batch import run_batch
from daskgpu._dask.batch.progress import MODES
from daskgpu._dask.batch.stopping import Terminated, terminate_as_interrupt
from daskgpu._errors import (
    BatchError,
    BundleError,
    ConfigError,
    DaskGPUError,
    LaunchConfigError,
    UsageError,
)

__all__ = ["build_parser", "load_kernel", "main"]

# Exit statuses of ``daskgpu batch``, besides 0 (complete) and 2 (usage): those of a
# shell for SIGINT and SIGTERM when stopped by one.
FAILED, INCOMPLETE, INTERRUPTED, TERMINATED = 1, 3, 130, 143

#: Where ``--tls-*`` would be set in Dask's configuration instead.
_TLS_CONFIG = ("distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
               "distributed.comm.tls.client.key")


def _output(text):
    """``PATH`` or ``(PATH, dtype)`` from ``PATH[:DTYPE]``; a bad spec is a usage error.

    A colon followed by no path separator starts a dtype, so ``z.zarr:floot32``
    is refused rather than created as a directory of that name.
    """
    path, sep, dtype = text.rpartition(":")
    spec = None
    if sep and not path:
        raise argparse.ArgumentTypeError(
            f"--output {text!r} names no path before the colon; write PATH or PATH:DTYPE, "
            "e.g. out.zarr:float32")
    if sep and not any(c in dtype for c in "/\\"):
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
    from daskgpu._dask.workers.gpu_worker import parse_devices

    try:
        return list(parse_devices(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _scalar(text):
    """``3`` (int), ``2.5`` (float), or typed as ``float32:2.5``, within its type's range.

    Examples
    --------
    >>> _scalar("int8:-5"), _scalar("bool:false")
    (np.int8(-5), np.False_)
    >>> _scalar("uint8:-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: scalar 'uint8:-1': -1 is out of range for uint8 (0 to 255)
    """
    kind, sep, value = text.partition(":")
    if sep:
        return _typed_scalar(text, kind, value.strip())
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"cannot read scalar {text!r}; write 3, 2.5 or "
                                     "float32:2.5")


def _typed_scalar(text, kind, value):
    try:
        dtype = np.dtype(kind)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biufc":
        raise argparse.ArgumentTypeError(
            f"cannot read scalar {text!r}: {kind!r} is not a numeric dtype; write e.g. "
            "float32:2.5, int8:-3 or bool:true")
    if dtype.kind == "b":
        words = {"true": True, "1": True, "false": False, "0": False}
        if value.lower() not in words:
            raise argparse.ArgumentTypeError(f"cannot read scalar {text!r}: a bool is true "
                                             "or false")
        return np.bool_(words[value.lower()])
    if dtype.kind in "iu":
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"cannot read scalar {text!r}: {dtype} takes a whole number") from None
        info = np.iinfo(dtype)
        if not info.min <= number <= info.max:
            raise argparse.ArgumentTypeError(f"scalar {text!r}: {number} is out of range for "
                                             f"{dtype} ({info.min} to {info.max})")
        return dtype.type(number)
    try:
        parsed = (complex if dtype.kind == "c" else float)(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read scalar {text!r}: {dtype} takes a "
                                         "number, e.g. 2.5") from None
    with np.errstate(over="ignore"):
        result = dtype.type(parsed)
    if np.isinf(result) and not np.isinf(parsed):
        raise argparse.ArgumentTypeError(
            f"scalar {text!r}: {value} is out of range for {dtype} (at most "
            f"{np.finfo(dtype).max} in magnitude)")
    return result


def _scheduler_file(text):
    """``--scheduler-file``: a file that exists now; Dask would wait for it silently."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(
            f"no scheduler file {text!r}: start the scheduler first (dask scheduler "
            "--scheduler-file PATH), or give its address with --scheduler")
    return text


def _order(text):
    """``--order``: one word per kernel parameter, checked for its words here."""
    from daskgpu._dask.batch import argument_order

    words = [w.strip() for w in text.split(",")]
    counts = [words.count(w) for w in ("out", "scalar", "in")]
    try:
        return argument_order(words, *counts)
    except BatchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _chunks(text):
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if not parts or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"cannot read chunks {text!r}; write 1000 or 256,256")
    return parts[0] if len(parts) == 1 else parts


def _group(text):
    """``--group``: a size, checked as ``map_kernel``'s ``group=`` is."""
    from daskgpu._dask.launch_layout import check_group

    try:
        return check_group(text, "--group")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or --no-group for one task a chunk") from None


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
                    "is called per chunk as kernel(*outputs, *scalars, *inputs), unless "
                    "--order says otherwise. Before any cluster starts, the chunks written "
                    "before are checked: a rerun with nothing left to compute starts none. "
                    "One run at a time writes an output.",
        epilog="Exit status: 0 when every chunk is written, 1 when chunks failed, another "
               "run is writing the output or the scheduler was lost, 2 for a usage error "
               "(bad arguments, an input that cannot be read, an output that overlaps an "
               "input or holds another job, a kernel that does not take the arguments in "
               "the order given), 3 when chunks are left "
               "(--max-chunks), 130 when interrupted (SIGINT), 143 when terminated "
               "(SIGTERM, e.g. SLURM's time limit). "
               "Rerun the same command to compute only the chunks not yet written. In a "
               "SLURM job script, start it with exec (exec daskgpu batch ...): at the time "
               "limit the script's shell dies at once, and SLURM kills what it leaves "
               "before the run can stop cleanly.")
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
    parser.add_argument("--order", type=_order, metavar="WORD[,WORD...]",
                        help="the kernel's parameters in order, one word per parameter: out "
                             "(the next --output), in (the next --input) or scalar (the "
                             "next --scalar); e.g. kernel(out, x, a) takes --order "
                             "out,in,scalar (default: every output, every scalar, every "
                             "input)")
    parser.add_argument("--chunks", type=_chunks, metavar="N[,N...]",
                        help="chunk shape (default: the first zarr input's chunks)")
    grouping = parser.add_mutually_exclusive_group()
    grouping.add_argument("--group", type=_group, metavar="BYTES",
                          help="read, launch and write neighbouring small chunks together, "
                               "in groups that need about BYTES of GPU memory, e.g. 64MiB "
                               "(default: the daskgpu.launch-bytes setting, 32 MiB; a chunk "
                               "is grouped when it needs less than a quarter of that)")
    grouping.add_argument("--no-group", dest="group", action="store_const", const=False,
                          help="one task a chunk: the kernel sees each stored chunk alone")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on this Dask scheduler (default: a local GPU cluster)")
    where.add_argument("--scheduler-file", metavar="PATH", type=_scheduler_file,
                       help="read the scheduler from a file")
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
    parser.add_argument("--progress", choices=MODES, default="auto",
                        help="how to show progress on stderr: a bar, plain lines (for a log "
                             "file) or none; auto: a bar on a terminal, else lines (default)")
    parser.add_argument("--no-progress", dest="progress", action="store_const",
                        const="none", help="the same as --progress none")
    tls = parser.add_argument_group(
        "TLS", "for a scheduler that speaks tls://, as dask worker takes them (default: "
               f"Dask's {_TLS_CONFIG} settings)")
    tls.add_argument("--tls-ca-file", metavar="PATH", help="the CA certificate(s), PEM")
    tls.add_argument("--tls-cert", metavar="PATH",
                     help="this client's certificate, PEM (may hold the key too)")
    tls.add_argument("--tls-key", metavar="PATH", help="this client's private key, PEM")
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
        with terminate_as_interrupt():
            return _main(ns)
    except BatchError as exc:
        # Caused by an OSError (a busy output, a lost scheduler): the run failed;
        # else the job cannot run as given: a usage error.
        print(f"daskgpu batch: error: {exc}", file=sys.stderr)
        return FAILED if isinstance(exc.__cause__, OSError) else 2
    except (UsageError, BundleError, ConfigError, LaunchConfigError, ImportError) as exc:
        # ImportError: a package the run needs is missing here (its message names it).
        print(f"daskgpu batch: error: {exc}", file=sys.stderr)
        return 2
    except (DaskGPUError, OSError) as exc:
        print(f"daskgpu batch: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated
        notes = getattr(exc, "__notes__", None) or [
            "daskgpu batch interrupted before the job started: nothing was written"]
        for note in notes:
            print(note, file=sys.stderr)
        return TERMINATED if isinstance(exc, Terminated) else INTERRUPTED


def _main(ns) -> int:
    from contextlib import ExitStack

    security = _security(ns)
    kernel = load_kernel(ns.kernel, ns.sig)
    report = None
    try:
        # Warnings (a lock file left behind) as one line each, after what they concern.
        with warnings.catch_warnings(record=True) as caught, ExitStack() as stack:
            stack.callback(_print_warnings, caught)
            client = None
            if ns.scheduler or ns.scheduler_file:
                from distributed import Client

                client = stack.enter_context(Client(
                    ns.scheduler, scheduler_file=ns.scheduler_file, security=security))
                stack.callback(_quiet_if_lost, client)  # runs before the client closes
            report = run_batch(kernel, ns.input, ns.output, scalars=ns.scalar,
                               order=ns.order, chunks=ns.chunks, client=client,
                               devices=ns.devices, simulate=ns.simulate, retries=ns.retries,
                               progress=ns.progress, resume=ns.resume,
                               max_chunks=ns.max_chunks, group=ns.group)
            print(report.summary())
    except KeyboardInterrupt as exc:
        if report is not None and not getattr(exc, "__notes__", None):
            # The job had ended, and said how: only closing the client was cut short.
            exc.add_note("daskgpu batch interrupted after the job ended, while closing its "
                         "connection to the scheduler: its outputs are as the line above "
                         "says")
        raise
    if report.failed:
        return FAILED
    return 0 if report.complete else INCOMPLETE


def _print_warnings(caught) -> None:
    for w in caught:
        print(f"daskgpu batch: warning: {w.message}", file=sys.stderr)


def _security(ns):
    """The ``Security`` for ``--scheduler``: ``--tls-*`` over Dask's settings.

    A ``tls://`` scheduler without a CA and a client certificate is refused
    here, in one line naming what to set, rather than deep in the connection.
    """
    from distributed.security import Security

    given = {"tls_ca_file": ns.tls_ca_file, "tls_client_cert": ns.tls_cert,
             "tls_client_key": ns.tls_key}
    if not (ns.scheduler or ns.scheduler_file):
        if any(given.values()):
            raise UsageError("--tls-ca-file, --tls-cert and --tls-key are for --scheduler or "
                             "--scheduler-file; the local cluster makes its own credentials")
        return None
    security = Security(**{k: v for k, v in given.items() if v})
    address = ns.scheduler or _file_address(ns.scheduler_file)
    if address.startswith("tls://") and not (security.tls_ca_file
                                              and security.tls_client_cert):
        missing = [option for option, value in (("--tls-ca-file", security.tls_ca_file),
                                                ("--tls-cert", security.tls_client_cert))
                   if not value]
        raise UsageError(
            f"the scheduler {address} speaks TLS, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: give --tls-ca-file, --tls-cert "
            f"and --tls-key (the CA, this client's certificate and its key), or set "
            f"{_TLS_CONFIG} in Dask's configuration")
    if address.startswith("tls://"):
        _check_tls_files(security, {"tls_ca_file": ns.tls_ca_file, "tls_client_cert": ns.tls_cert,
                                    "tls_client_key": ns.tls_key})
    return security


#: Each credential's flag and Dask setting, and what it must hold.
_TLS_FILES = {
    "tls_ca_file": ("--tls-ca-file", "distributed.comm.tls.ca-file",
                    "the scheduler's CA certificate(s)"),
    "tls_client_cert": ("--tls-cert", "distributed.comm.tls.client.cert",
                        "this client's certificate"),
    "tls_client_key": ("--tls-key", "distributed.comm.tls.client.key",
                       "this client's private key"),
}


def _check_tls_files(security, given) -> None:
    """Refuse, in one line naming the flag (or setting) and the file, credentials that
    cannot serve: a file that cannot be read, one that holds no PEM certificate, a key
    that is not the certificate's. The connection would fail with the bare OS or SSL
    message, naming neither.
    """
    import ssl

    def source(attr):
        flag, setting, _ = _TLS_FILES[attr]
        value = getattr(security, attr)
        where = flag if given.get(attr) else f"Dask's {setting}"
        return f"{where} {value!r}" if "\n" not in value else f"{where} (PEM text)"

    def refuse(attr, problem):
        _, _, what = _TLS_FILES[attr]
        raise UsageError(f"{source(attr)}: {problem}; give a readable PEM file holding "
                         f"{what}")

    credentials = {attr: getattr(security, attr) for attr in _TLS_FILES
                   if getattr(security, attr)}
    for attr, value in credentials.items():
        if "\n" not in value:  # a path; Security also takes the PEM text itself
            try:
                with open(value, "rb") as f:
                    f.read(1)
            except OSError as exc:
                refuse(attr, f"cannot read it ({exc.strerror or exc})")
    for attr in ("tls_ca_file", "tls_client_cert"):  # each must hold a certificate
        value = credentials[attr]
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
                **({"cadata": value} if "\n" in value else {"cafile": value}))
        except (ssl.SSLError, ValueError) as exc:
            refuse(attr, f"it holds no PEM certificate ({getattr(exc, 'reason', None) or exc})")
    cert, key = credentials["tls_client_cert"], credentials.get("tls_client_key")
    if "\n" in cert or (key and "\n" in key):
        return  # PEM text: Security writes it to files itself; checked as far as above
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise UsageError(f"{source('tls_client_key')} is not the key of "
                             f"{source('tls_client_cert')}: give the private key that "
                             "belongs to that certificate") from None
        refuse("tls_client_key" if key else "tls_client_cert", "it holds no PEM private key")


def _file_address(path) -> str:
    """The scheduler's address in a scheduler file; "" when it names none."""
    import json

    try:
        with open(path) as f:
            address = json.load(f).get("address", "")
    except (OSError, ValueError, AttributeError):
        return ""  # Dask's own error will name the problem
    return address if isinstance(address, str) else ""


def _quiet_if_lost(client) -> None:
    """Without a scheduler, closing the client logs its reconnection's traceback; the
    run has already said, in one line, that the scheduler was lost."""
    import logging

    if client.status not in ("running", "newly-created"):
        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
