"""What a worker does when a launch fails: sticky CUDA errors, device exceptions.

After an illegal address (and the other sticky errors in
:data:`~daskgpu._runtime._cuda.STICKY_ERRORS`) every later CUDA call in the
process fails. The task that hit it fails with the original error; the Dask
worker process is then closed so that its nanny starts a fresh one, and later
tasks (and retries, with ``retries=``) run on a working context. Outside a Dask
worker the error is only raised.
"""

from __future__ import annotations

import logging

from daskgpu._errors import DeviceError

logger = logging.getLogger("daskgpu")

# Seconds the worker keeps running after the failure, so that the task's
# error reaches the scheduler before the process goes.
_GRACE = 0.5


def replace_worker_process(error) -> bool:
    """Have this process's Dask worker replaced by its nanny; False outside a worker."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return False
    logger.error("daskgpu: %s; closing worker %s so its nanny restarts it", error, worker.address)
    worker.loop.call_later(_GRACE, _close, worker)
    return True


def _close(worker):
    import asyncio

    # nanny=False: the nanny sees its worker process exit and starts a new one.
    asyncio.ensure_future(
        worker.close(nanny=False, executor_wait=False, reason="daskgpu: CUDA context lost")
    )


#: The builtin exception classes a kernel's exception table may name. Any other
#: name (SystemExit, KeyboardInterrupt, a user class) becomes a DeviceError that
#: carries it: a bundle must not make a worker raise what stops a process.
EXCEPTION_CLASSES = frozenset({
    "ArithmeticError", "AssertionError", "AttributeError", "BufferError", "EOFError",
    "Exception", "FloatingPointError", "IndexError", "KeyError", "LookupError",
    "NotImplementedError", "OverflowError", "RuntimeError", "SystemError", "TypeError",
    "UnicodeError", "ValueError", "ZeroDivisionError",
})


def device_exception(image, code: int, tid, ctaid) -> BaseException:
    """The Python exception a ``debug=True`` kernel's thread reported, as Numba raises it.

    ``tid`` and ``ctaid`` are the reporting thread's ``(z, y, x)`` indices; the
    exception's class, arguments and source location come from the image's
    exception table, so no Python function is needed on the worker.
    """
    import builtins

    for known, cls_name, args, loc in image.exceptions:
        if known == code:
            break
    else:
        cls_name, args, loc = "SystemError", (f"unknown error {code} in kernel {image.name!r}",), None
    cls = getattr(builtins, cls_name, None) if cls_name in EXCEPTION_CLASSES else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = DeviceError
        args = (f"{cls_name}: {args[0]}" if args else cls_name,) + tuple(args[1:])
    where = f"In function {loc[0]!r}, file {loc[1]}, line {loc[2]}, " if loc else ""
    prefix = f"{where}tid={list(tid)} ctaid={list(ctaid)}"
    args = (f"{prefix}: {args[0]}",) + tuple(args[1:]) if args else (prefix,)
    return cls(*args)
