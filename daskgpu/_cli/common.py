"""What the ``daskgpu`` commands share: their usage error, parser and argument types,
and finding a kernel named ``MODULE:FUNCTION``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys

from daskgpu._errors import BundleError, ConfigError, LaunchConfigError, UsageError

#: What a command line asked for that cannot run as given: exit status 2.
USAGE_ERRORS = (UsageError, BundleError, ConfigError, LaunchConfigError)

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc):`~?([^`]+)`")


def plain(text: str | None) -> str | None:
    """Docstring text as ``--help`` shows it: no reStructuredText markup.

    Examples
    --------
    >>> plain("``daskgpu bench``: see :func:`~daskgpu.map_kernel` and :mod:`daskgpu._cli`.")
    'daskgpu bench: see map_kernel and daskgpu._cli.'
    """
    if text is None:
        return None
    text = _ROLE.sub(lambda m: m.group(1).rpartition(".")[2] if m.group(0).count("~")
                     else m.group(1), text)
    return text.replace("``", "")


class Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` instead of exiting,
    and shows its description and epilog without reStructuredText markup."""

    def __init__(self, *args, description=None, epilog=None, **kwargs):
        super().__init__(*args, description=plain(description), epilog=plain(epilog),
                         **kwargs)

    def error(self, message):
        raise UsageError(message, self)


def positive_int(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def device_list(text) -> list:
    """``--devices``: GPU ordinals or ``GPU-``/``MIG-`` UUIDs, read as a GPU worker reads them.

    Examples
    --------
    >>> device_list("0, GPU-8f1c")
    [0, 'GPU-8f1c']
    """
    from daskgpu._dask.workers.gpu_worker import parse_devices

    try:
        return list(parse_devices(str(text)))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resources(text) -> dict:
    out = {}
    for item in str(text).replace(",", " ").split():
        key, eq, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not eq or not key or number is None or not 0 <= number < math.inf:  # nan too
            raise argparse.ArgumentTypeError(
                f"cannot read resource {item!r}: an amount is a finite number, 0 or more; "
                "write resources as 'GPU=1 MEM=16e9'"
            )
        out[key] = int(number) if number.is_integer() else number
    return out


def import_module(ref: str):
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
    except SystemExit as exc:  # else the command would end with the module's status
        from daskgpu._errors import DaskGPUError

        raise DaskGPUError(
            f"importing {ref!r} exited (sys.exit({exc.code!r})) before the kernel was "
            "defined; put the module's script part under `if __name__ == '__main__':`"
        ) from None


def resolve(module, attr: str, module_ref: str):
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = sorted(n for n, v in vars(module).items()
                           if not n.startswith("_") and callable(v) and not inspect.isclass(v))
            raise UsageError(f"{module_ref} has no {attr!r}; it defines {found}")
        obj = getattr(obj, part)
    return obj


def as_kernel(obj, sigs, overrides, what):
    """``obj`` (what ``what`` named) as a kernel, through the client's one door
    (:func:`daskgpu._compiler.as_kernel.as_kernel`); what it refuses, as a usage error."""
    from daskgpu._compiler.as_kernel import as_kernel as through_the_door
    from daskgpu._runtime.kernel_kinds import KernelKind, kind_of

    kind = kind_of(obj)
    if kind in (KernelKind.LAUNCH, KernelKind.OTHER, KernelKind.BUNDLE):
        raise UsageError(f"{what} is a {type(obj).__name__}, not a function or kernel")
    if kind is KernelKind.FUNCTION and not sigs:
        raise UsageError(f"{what} is a plain function: give its signature(s) with "
                         "--sig 'void(float32[::1], ...)'")
    try:
        return through_the_door(obj, sigs, **overrides)
    except TypeError as exc:
        raise UsageError(f"{what} is {exc}" if kind is KernelKind.PTX else str(exc)) from None
