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

An error a kernel causes says where, in the first line of its message, as
:func:`thread_site` and :func:`launch_site` write it: the kernel, the
``map_kernel`` chunk (when the Dask layer runs the launch inside
:func:`in_chunk`), the grid and block, and for a raised exception the thread
and block that raised it (x, y, z) and the source line, followed by the text
Numba gives the same exception (``tid=[...] ctaid=[...]: ...``, whose order
is z, y, x on a GPU and x, y, z in the simulator), so that what matched
Numba's messages still matches; its class stays the kernel's.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import contextvars
import itertools
import sys
import weakref

from daskgpu._errors import DeviceError
from daskgpu._image.bundle import BUILTIN_EXCEPTIONS, exception_name_refusal, reserved_module
from daskgpu._image.launch_config import pad3

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


def device_exception(image, code: int, tid, ctaid, dims=None) -> BaseException:
    """The Python exception a ``debug=True`` kernel's thread reported, as Numba raises it.

    ``tid`` and ``ctaid`` are the reporting thread's ``(z, y, x)`` indices, as
    Numba's globals hold them; ``dims`` is the launch's ``(griddim,
    blockdim)``. The exception's class, arguments and source location come
    from the image's exception table, so no Python function is needed on the
    worker. Its message is :func:`thread_site`, then Numba's own (``In
    function 'k', file f.py, line 7, tid=[z, y, x] ctaid=[z, y, x]: text``),
    which code written for Numba matches. A class that cannot be resolved
    here (its module not imported in this process), or that a kernel may not
    raise, becomes a :class:`DeviceError` naming it.
    """
    entry = next((e for e in image.exceptions if e[0] == code), None)
    if entry is not None:
        _, cls_name, args, loc = entry
    else:
        cls_name, args, loc = ("SystemError", (f"unknown error {code} in kernel {image.name!r}",),
                               None)
    grid, block = dims if dims is not None else (None, None)
    site = thread_site(image.name, grid, block, tuple(tid)[::-1], tuple(ctaid)[::-1])
    # Then Numba's own words, which code written for Numba matches.
    where = f"In function {loc[0]!r}, file {loc[1]}, line {loc[2]}, " if loc else ""
    prefix = f"{site}: {where}tid={list(tid)} ctaid={list(ctaid)}"
    cls = _resolve(cls_name)
    if cls is not None:
        try:
            return cls(*((f"{prefix}: {args[0]}",) + tuple(args[1:]) if args else (prefix,)))
        except Exception:  # a user class whose constructor wants other arguments
            pass
    shown = cls_name.replace(":", ".")
    return DeviceError(f"{prefix}: {shown}: {args[0]}" if args else f"{prefix}: {shown}",
                       *args[1:])


# -- where a launch ran: named in the errors it raises ------------------------------------

#: The ``map_kernel`` chunk whose launch this thread runs, as ``(block id, shape,
#: offset, members)``; set by :func:`in_chunk`, read by :func:`launch_site`.
_CHUNK = contextvars.ContextVar("daskgpu_chunk", default=None)


@contextlib.contextmanager
def in_chunk(name: str, block_id, shape, start, members=None):
    """Launches inside this block run on one ``map_kernel`` chunk: their errors name it.

    A kernel's exception and a CUDA error after its launch name the chunk in
    their message (:func:`launch_site`); any other exception raised inside
    (a bad argument, say) gets the chunk as a note. ``members`` is given for a
    launch over a group of the user's chunks: per axis, ``(index, start, sizes)``
    of the chunks it holds; a thread's error then names the user's chunk it fell in.

    Examples
    --------
    >>> with in_chunk("saxpy", (2,), (100,), (200,)):
    ...     launch_site("saxpy", (1,), (128,))
    "kernel 'saxpy'<<<(1, 1, 1), (128, 1, 1)>>> on chunk (2,) at offset (200,)"
    >>> with in_chunk("saxpy", (1,), (400,), (400,), ((4, 400, (100,) * 4),)):
    ...     launch_site("saxpy")
    "kernel 'saxpy' on chunks (4,) to (7,), one grouped launch at offset (400,)"
    """
    chunk = (tuple(block_id), tuple(shape), tuple(start), members)
    token = _CHUNK.set(chunk)
    try:
        yield
    except Exception as exc:
        if _chunk_words(chunk) not in str(exc) and hasattr(exc, "add_note"):
            if members is None:
                exc.add_note(f"daskgpu.map_kernel: launching {name} on chunk {chunk[0]} of "
                             f"shape {chunk[1]}, offset {chunk[2]}")
            else:
                exc.add_note(f"daskgpu.map_kernel: launching {name} {_chunk_words(chunk)} "
                             "(map_kernel(group=False) launches each chunk alone)")
        raise
    finally:
        _CHUNK.reset(token)


def _chunk_words(chunk, element=None) -> str:
    """The chunk of a launch in words; with ``element`` (a position within a grouped
    launch), the user's chunk that holds it."""
    block_id, _, start, members = chunk
    if members is None:
        return f"on chunk {block_id} at offset {start}"
    first = tuple(index for index, _, _ in members)
    last = tuple(index + len(sizes) - 1 for index, _, sizes in members)
    group = f"chunks {first} to {last}" if first != last else f"chunk {first}"
    if element is None:
        return f"on {group}, one grouped launch at offset {start}"
    index, offset = [], []
    for (i, begin, sizes), s, e in zip(members, start, element):
        g = s + e  # the element's global index along this axis
        if not begin <= g < begin + sum(sizes):
            return f"in the halo of {group} (a grouped launch at offset {start})"
        k = bisect.bisect_right(list(itertools.accumulate(sizes)), g - begin)
        index.append(i + k)
        offset.append(begin + sum(sizes[:k]))
    return (f"on chunk {tuple(index)} at offset {tuple(offset)} (in a grouped launch over "
            f"{group})")


def _dims(dims) -> tuple:
    return pad3((dims,) if isinstance(dims, int) else tuple(dims))


def launch_site(name: str, grid=None, block=None, element=None) -> str:
    """Where a launch ran: the kernel, its grid and block as CUDA writes them
    (``<<<grid, block>>>``, where known), and its ``map_kernel`` chunk if any
    (with ``element``, the thread's position in the launch, the user's chunk that
    holds it where the launch covers several).

    Examples
    --------
    >>> launch_site("mod.saxpy", (4,), (256,))
    "kernel 'saxpy'<<<(4, 1, 1), (256, 1, 1)>>>"
    """
    site = f"kernel {name.rpartition('.')[2]!r}"
    if grid is not None and block is not None:
        site += f"<<<{_dims(grid)}, {_dims(block)}>>>"
    chunk = _CHUNK.get()
    return site if chunk is None else f"{site} {_chunk_words(chunk, element)}"


def thread_site(name: str, grid, block, thread, cta, line=None) -> str:
    """Where a kernel's thread raised: :func:`launch_site`, then the thread's
    ``threadIdx`` and ``blockIdx`` (x, y, z) and the source ``line`` as ``(file, line)``.

    ``grid`` and ``block`` may be None where the launch's are not known.

    Examples
    --------
    >>> thread_site("check", (2,), (64,), (39, 0, 0), (1, 0, 0), ("k.py", 7))
    "kernel 'check'<<<(2, 1, 1), (64, 1, 1)>>>, thread (39, 0, 0) of block (1, 0, 0), at k.py:7"
    >>> with in_chunk("check", (1,), (400,), (400,), ((4, 400, (100,) * 4),)):
    ...     thread_site("check", (4,), (100,), (50, 0, 0), (2, 0, 0))
    "kernel 'check'<<<(4, 1, 1), (100, 1, 1)>>> on chunk (6,) at offset (600,) (in a \
grouped launch over chunks (4,) to (7,)), thread (50, 0, 0) of block (2, 0, 0)"
    """
    where = "" if line is None else f", at {line[0]}:{line[1]}"
    element = _element(block, thread, cta)
    return (f"{launch_site(name, grid, block, element)}, thread {tuple(thread)} of block "
            f"{tuple(cta)}{where}")


def _element(block, thread, cta):
    """The position in its grouped launch's chunk of the thread ``thread`` of block
    ``cta``: per axis for a launch of the chunk's rank, unravelled for a flat one; None
    where no grouped launch runs, or the thread lies beyond the chunk."""
    chunk = _CHUNK.get()
    if chunk is None or chunk[3] is None or block is None:
        return None
    shape, dims = chunk[1], _dims(block)
    if len(shape) == 1 or all(d == 1 for d in dims[1:]) and all(c == 0 for c in cta[1:]):
        flat = cta[0] * dims[0] + thread[0]
        size = 1
        for n in shape:
            size *= n
        if flat >= size:
            return None
        element = []
        for n in reversed(shape):  # C order, as the chunk's elements lie
            flat, r = divmod(flat, n)
            element.append(r)
        return tuple(reversed(element))
    element = tuple(cta[a] * dims[a] + thread[a] for a in range(len(shape)))
    return element if all(e < n for e, n in zip(element, shape)) else None


def relocated(exc: BaseException, site: str) -> BaseException:
    """``exc`` with ``site`` at the head of its message, its class and attributes kept.

    The message is its first argument, as for every builtin exception; a
    class whose text ignores its arguments gets ``site`` as a note instead.
    """
    args = exc.args
    if not args or args == ("",):
        exc.args = (site,)
    elif isinstance(args[0], str):
        exc.args = (f"{site}: {args[0]}",) + args[1:]
    if site not in str(exc) and hasattr(exc, "add_note"):
        exc.add_note(site)
    return exc
