"""Exceptions raised by kernels on the device, rebuilt from the image's plain-data table.

A ``debug=True`` kernel reports a raised exception through globals that the
launch reads back; :func:`device_exception` turns the code it finds into the
Python exception Numba would raise, from the exception table the client
compiled into the image (:func:`exception_name` names the classes there).
No Python function is needed on the worker, and nothing is imported to
resolve a class. Only a class a kernel may raise resolves: a builtin of
:data:`EXCEPTION_CLASSES`, or an ``Exception`` subclass from outside the packages a worker runs on
(:data:`~daskgpu._image.bundle.RESERVED_PACKAGES`), none of whose bases is
from those packages either; anything else becomes a
:class:`~daskgpu._errors.DeviceError` naming it. A bundle naming such a class
is refused when it loads; this is the same rule for images that arrive
otherwise (pickled, or compiled here).

Sticky CUDA errors are not handled here: the runtime raises them as
:class:`~daskgpu._errors.ContextLostError` and does nothing else; the Dask
layer's :class:`~daskgpu.GPUWorkerPlugin` has a worker replaced after one.
"""

from __future__ import annotations

import builtins
import sys
import weakref

from daskgpu._errors import DeviceError
from daskgpu._image.bundle import BUILTIN_EXCEPTIONS, exception_name_refusal, reserved_module

#: The builtin exception classes a kernel's exception table may name by bare
#: name. Any other bare name (SystemExit, KeyboardInterrupt, StopIteration, ...)
#: becomes a DeviceError that carries it: a kernel must not make a worker raise
#: what stops a process or ends a loop.
EXCEPTION_CLASSES = BUILTIN_EXCEPTIONS

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
    """The exception class that ``cls_name`` names, if a kernel may raise it, else None.

    A ``module:qualname`` resolves from a module this process has already
    imported (nothing is imported: an image must not run code), or from the
    kernels compiled here.
    """
    if exception_name_refusal(cls_name) is not None:
        return None
    if ":" in cls_name:
        cls = _COMPILED_CLASSES.get(cls_name)
        if cls is None:
            module, _, qualname = cls_name.partition(":")
            cls = sys.modules.get(module)
            for part in qualname.split("."):
                cls = getattr(cls, part, None) if not part.startswith("<") else None
    else:
        cls = getattr(builtins, cls_name, None)
    return cls if _raisable(cls) else None


def _raisable(cls) -> bool:
    """Whether ``cls`` is an Exception subclass none of whose classes is reserved.

    The bases count too: a user class derived from ``distributed.Reschedule``
    reschedules its task just the same, and a name may re-export a class.
    """
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return False
    return not any(base.__module__ != "builtins" and reserved_module(base.__module__)
                   for base in cls.__mro__)


def device_exception(image, code: int, tid, ctaid) -> BaseException:
    """The Python exception a ``debug=True`` kernel's thread reported, as Numba raises it.

    ``tid`` and ``ctaid`` are the reporting thread's ``(z, y, x)`` indices; the
    exception's class, arguments and source location come from the image's
    exception table, so no Python function is needed on the worker. A class
    that cannot be resolved here (its module not imported in this process),
    or that a kernel may not raise, becomes a :class:`DeviceError` naming it.
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
