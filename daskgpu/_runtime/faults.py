"""Exceptions raised by kernels on the device, rebuilt from the image's plain-data table.

A ``debug=True`` kernel reports a raised exception through globals that the
launch reads back; :func:`device_exception` turns the code it finds into the
Python exception Numba would raise, from the exception table the client
compiled into the image (:func:`exception_name` names the classes there).
No Python function is needed on the worker, and nothing is imported to
resolve a class.

Sticky CUDA errors are not handled here: the runtime raises them as
:class:`~daskgpu._errors.ContextLostError` and does nothing else; the Dask
layer's :class:`~daskgpu.GPUWorkerPlugin` has a worker replaced after one.
"""

from __future__ import annotations

import builtins
import sys
import weakref

from daskgpu._errors import DeviceError

#: The builtin exception classes a kernel's exception table may name by bare
#: name. Any other bare name (SystemExit, KeyboardInterrupt, ...) becomes a
#: DeviceError that carries it: a bundle must not make a worker raise what
#: stops a process.
EXCEPTION_CLASSES = frozenset({
    "ArithmeticError", "AssertionError", "AttributeError", "BufferError", "EOFError",
    "Exception", "FloatingPointError", "IndexError", "KeyError", "LookupError",
    "NotImplementedError", "OverflowError", "RuntimeError", "SystemError", "TypeError",
    "UnicodeError", "ValueError", "ZeroDivisionError",
})

# User exception classes of the kernels compiled in this process, by the name
# the table gives them: a local launch raises the class itself even where it
# cannot be found by name (a class defined inside a function). Weak, so that a
# redefined class does not keep its predecessor alive.
_COMPILED_CLASSES: weakref.WeakValueDictionary[str, type] = weakref.WeakValueDictionary()


def exception_name(cls: type) -> str:
    """How an exception table names ``cls``: a builtin by its name, others as
    ``module:qualname`` (and remembered for launches in this process)."""
    if cls.__module__ == "builtins":
        return cls.__name__
    name = f"{cls.__module__}:{cls.__qualname__}"
    _COMPILED_CLASSES[name] = cls
    return name


def _resolve(cls_name: str):
    """The Exception subclass that ``cls_name`` names, else None.

    A ``module:qualname`` resolves from a module this process has already
    imported (nothing is imported: an image must not run code), or from the
    kernels compiled here; BaseException-only classes never resolve.
    """
    if ":" in cls_name:
        cls = _COMPILED_CLASSES.get(cls_name)
        if cls is None:
            module, _, qualname = cls_name.partition(":")
            cls = sys.modules.get(module)
            for part in qualname.split("."):
                cls = getattr(cls, part, None) if not part.startswith("<") else None
    elif cls_name in EXCEPTION_CLASSES:
        cls = getattr(builtins, cls_name, None)
    else:
        cls = None
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def device_exception(image, code: int, tid, ctaid) -> BaseException:
    """The Python exception a ``debug=True`` kernel's thread reported, as Numba raises it.

    ``tid`` and ``ctaid`` are the reporting thread's ``(z, y, x)`` indices; the
    exception's class, arguments and source location come from the image's
    exception table, so no Python function is needed on the worker. A user
    class that cannot be resolved here (its module not imported in this
    process) becomes a :class:`DeviceError` naming it.
    """
    entry = next((e for e in image.exceptions if e[0] == code), None)
    if entry is not None:
        _, cls_name, args, loc = entry
    else:
        cls_name, args, loc = ("SystemError", (f"unknown error {code} in kernel {image.name!r}",),
                               None)
    where = f"In function {loc[0]!r}, file {loc[1]}, line {loc[2]}, " if loc else ""
    prefix = f"{where}tid={list(tid)} ctaid={list(ctaid)}"
    cls = _resolve(cls_name)
    if cls is not None:
        try:
            return cls(*((f"{prefix}: {args[0]}",) + tuple(args[1:]) if args else (prefix,)))
        except Exception:  # a user class whose constructor wants other arguments
            pass
    shown = cls_name.replace(":", ".")
    return DeviceError(f"{prefix}: {shown}: {args[0]}" if args else f"{prefix}: {shown}",
                       *args[1:])
