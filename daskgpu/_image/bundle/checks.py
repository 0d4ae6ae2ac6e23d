"""The field checks a bundle's decoder is built from, and the rule for the
exception classes a kernel's exception table may name.

Each check raises :class:`~daskgpu.BundleError` naming the file, the field and
the value it got, and returns the value when it passes.
"""

from __future__ import annotations

from daskgpu._errors import BundleError

#: The builtin exception classes an exception table may name, by bare name:
#: ordinary errors. Not those that stop a process (SystemExit, KeyboardInterrupt),
#: end a loop silently (StopIteration), or may read as the runtime's own state
#: (MemoryError, OSError and its kin, warnings).
BUILTIN_EXCEPTIONS = frozenset({
    "ArithmeticError", "AssertionError", "AttributeError", "BufferError", "EOFError",
    "Exception", "FloatingPointError", "IndexError", "KeyError", "LookupError",
    "NotImplementedError", "OverflowError", "RuntimeError", "SystemError", "TypeError",
    "UnicodeError", "ValueError", "ZeroDivisionError",
})

#: Packages whose classes an exception table may not name as ``module:qualname``:
#: what a worker runs on, where an exception can mean more than a failed task
#: (a task raising ``distributed:Reschedule`` is rescheduled, so a failing debug
#: kernel would run forever; ``daskgpu``'s ContextLostError replaces the worker),
#: and ``builtins``, whose classes go by bare name. ``cuda`` is a namespace
#: shared with other projects (numba-cuda's own modules live in it), so only
#: cuda-python's packages in it are reserved.
RESERVED_PACKAGES = frozenset({
    "asyncio", "builtins", "concurrent", "dask", "daskgpu", "distributed", "tornado",
    "cuda.bindings", "cuda.core", "cuda.pathfinder", "cuda.cuda", "cuda.cudart", "cuda.nvrtc",
})


def check_keys(obj: dict, allowed: set, where: str, path: str, optional=frozenset()) -> None:
    """Refuse ``obj`` when it has keys beyond ``allowed | optional`` or lacks one of ``allowed``."""
    missing = allowed - obj.keys()
    unknown = obj.keys() - allowed - optional
    if unknown:
        raise BundleError(f"{path!r}: {where} has unknown fields {sorted(unknown)}")
    if missing:
        raise BundleError(f"{path!r}: {where} lacks the fields {sorted(missing)}")


def check_type(value, types, what: str, path: str):
    """``value`` when its JSON type is exactly one of ``types`` (a bool is no int here)."""
    types = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass in Python, but not in a bundle.
    if not any(type(value) is t for t in types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise BundleError(f"{path!r}: field {what} must be {names}, got {value!r:.80}")
    return value


def check_int(value, lo: int, hi: int, what: str, path: str) -> int:
    """``value`` when it is an int in ``lo..hi``."""
    check_type(value, int, what, path)
    if not lo <= value <= hi:
        raise BundleError(f"{path!r}: field {what} must be in {lo}..{hi}, got {value}")
    return value


def check_pair(value, what: str, path: str) -> list:
    """``value`` when it is a list of two items."""
    check_type(value, list, what, path)
    if len(value) != 2:
        raise BundleError(f"{path!r}: field {what} must be a pair, got {len(value)} items")
    return value


def reserved_module(module: str) -> bool:
    """Whether the module named ``module`` belongs to :data:`RESERVED_PACKAGES`."""
    parts = str(module).split(".", 2)
    return parts[0] in RESERVED_PACKAGES or ".".join(parts[:2]) in RESERVED_PACKAGES


def exception_name_refusal(name: str):
    """Why an exception table may not name the class ``name``; None when it may.

    A builtin is named bare and must be in :data:`BUILTIN_EXCEPTIONS`; any
    other class is ``module:qualname``, from a module outside
    :data:`RESERVED_PACKAGES`, such as the kernel's own. Only the name is
    checked: nothing is imported.
    """
    module, colon, qualname = name.partition(":")
    if not colon:
        if name not in BUILTIN_EXCEPTIONS:
            return (f"a bare name must be one of the builtin exception classes "
                    f"{sorted(BUILTIN_EXCEPTIONS)}; other classes are written module:qualname")
        return None
    if not module or not qualname:
        return "it must be written module:qualname"
    if reserved_module(module):
        return (f"a kernel may not raise the classes of {module.partition('.')[0]!r}, which "
                "can mean more than a failed task to a worker (distributed:Reschedule "
                "reschedules it, forever); raise a builtin exception or one of your own")
    return None


def check_exception_class(name, what: str, path: str) -> str:
    """``name`` when it is a class name an exception table may hold."""
    reason = exception_name_refusal(name)
    if reason is not None:
        raise BundleError(f"{path!r}: field {what} {name!r:.80} is refused: {reason}")
    return name
