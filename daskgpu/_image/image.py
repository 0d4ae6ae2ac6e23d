"""``KernelImage``: one compiled signature of a kernel, as immutable plain data.

This is the only thing that travels from the client to the workers. It holds
PTX text, argument specs and options; never Numba objects or the Python
function (except, opt-in, for the CUDA simulator). Unpickling it touches no GPU:
the worker links it on first launch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from daskgpu._image.argspec import ArgSpec, signature_str
from daskgpu._image.position_uses import check_uses


@dataclass(frozen=True)
class LinkInput:
    """A file given to ``jit(link=...)``, carried as bytes.

    ``kind`` is the input type cuda.core's ``ObjectCode`` takes: ``"ptx"``,
    ``"cubin"``, ``"fatbin"``, ``"ltoir"``, ``"object"`` or ``"library"``.
    """

    name: str
    kind: str
    data: bytes


@dataclass(frozen=True)
class KernelImage:
    """A kernel compiled for one signature.

    Parameters
    ----------
    name : str
        The Python function's qualified name, for messages.
    entry : str
        The kernel's (mangled) PTX entry symbol.
    ptx : tuple of ((int, int), str)
        PTX text per target compute capability, ascending.
    args : tuple of ArgSpec
    writes : tuple of int
        Indices of the array parameters the kernel may write.
    grid_ndim : int
        Rank of the kernel's ``cuda.grid``/``cuda.gridsize`` calls; 0 if none.
    links : tuple of LinkInput
    options : tuple of (str, object)
        Link options: ``max_registers``, ``debug``, ``lineinfo``, ``fastmath``.
    versions : tuple of (str, str)
        What produced the PTX (numba-cuda, NVVM, PTX ISA), for diagnostics.
    exceptions : tuple of (int, str, tuple, tuple or None)
        For ``debug=True`` kernels: what each error code a thread can set
        means, as ``(code, exception class name, args, (function, file,
        line))``, so that a worker raises it without the Python function.
    py_func : bytes or None
        The cloudpickled Python function, carried only for the simulator.
    positions : tuple or None
        How the kernel uses its thread's position (records of
        :mod:`daskgpu._image.position_uses`), by which a map decides whether
        grouping chunks can change its results; None where not recorded.

    Attributes
    ----------
    hash : str
        sha256 over everything that determines the linked code and its use:
        the cubin cache key on workers.
    signature : str
        The argument types, as Numba writes a signature.
    targets : tuple of (int, int)
        The compute capabilities there is PTX for.

    Examples
    --------
    A :class:`~daskgpu.Kernel` holds one image per compiled signature; it is
    plain data (strings, tuples, bytes), compared and hashed by value.

    >>> import daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float64[::1], float64)")
    ... def scale(x, a):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         x[i] *= a
    >>> image = scale.images[0]
    >>> image.signature, image.targets, image.writes, image.grid_ndim
    ('(float64[::1], float64)', ((7, 5),), (0,), 1)
    >>> [a.kind for a in image.args]
    ['array', 'scalar']
    >>> image.ptx[0][1].lstrip().startswith("//")  # PTX text per target
    True
    >>> len(image.hash)
    64
    """

    name: str
    entry: str
    ptx: tuple
    args: tuple
    writes: tuple = ()
    grid_ndim: int = 0
    links: tuple = ()
    options: tuple = ()
    versions: tuple = ()
    exceptions: tuple = ()
    py_func: bytes | None = field(default=None, compare=False, repr=False)
    # Read off the typed IR like ``writes``, but about what a map may group, not about
    # the code: left out of the hash and of comparisons (None: not recorded).
    positions: tuple | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if not self.ptx:
            raise ValueError(f"KernelImage {self.name!r} has no PTX")
        for i in self.writes:
            if self.args[i].kind not in ("array", "record", "tuple"):
                raise ValueError(
                    f"write set index {i} of {self.name!r} is not an array or a record"
                )

    @property
    def hash(self) -> str:
        """sha256 over everything that determines the linked code and its use."""
        try:
            return self.__dict__["_hash"]
        except KeyError:
            pass
        h = hashlib.sha256()
        for part in (self.name, self.entry, repr(self.args), repr(self.writes),
                     repr(self.options), str(self.grid_ndim), repr(self.exceptions)):
            h.update(part.encode())
            h.update(b"\0")
        for cc, text in self.ptx:
            h.update(f"{cc}".encode())
            h.update(text.encode())
        for link in self.links:
            h.update(f"{link.name}:{link.kind}".encode())
            h.update(link.data)
        digest = h.hexdigest()
        object.__setattr__(self, "_hash", digest)
        return digest

    @property
    def targets(self) -> tuple:
        """The compute capabilities there is PTX for, ascending."""
        return tuple(cc for cc, _ in self.ptx)

    @property
    def signature(self) -> str:
        """The argument types as Numba writes a signature, e.g. ``(float32[::1], float32)``."""
        return signature_str(self.args)

    def option(self, key: str, default: Any = None) -> Any:
        """The link option ``key`` (e.g. ``"max_registers"``), else ``default``."""
        return dict(self.options).get(key, default)

    def ptx_for(self, cc: tuple) -> str | None:
        """The PTX of the highest target at or below ``cc``, else None."""
        best = None
        for target, text in self.ptx:
            if target <= tuple(cc):
                best = text
        return best

    def with_py_func(self, py_func: bytes | None) -> KernelImage:
        """This image carrying ``py_func`` (cloudpickled, for the simulator), or none."""
        fields = image_fields(self)
        fields["py_func"] = py_func
        return image_from_fields(fields)

    def __reduce__(self):
        return image_from_fields, (image_fields(self),)

    def __repr__(self) -> str:
        targets = ", ".join(f"{a}.{b}" for a, b in self.targets)
        return (f"<KernelImage {self.name}{self.signature} targets=[{targets}] "
                f"hash={self.hash[:12]}>")


def image_fields(image: KernelImage) -> dict:
    """The fields of ``image`` as plain tuples, for pickles and bundles.

    The inverse of :func:`image_from_fields`; ``exceptions`` and ``py_func``
    appear only when set.
    """
    fields = {
        "name": image.name,
        "entry": image.entry,
        "ptx": image.ptx,
        "args": tuple(a.as_tuple() for a in image.args),
        "writes": image.writes,
        "grid_ndim": image.grid_ndim,
        "links": tuple((x.name, x.kind, x.data) for x in image.links),
        "options": image.options,
        "versions": image.versions,
    }
    if image.exceptions:
        fields["exceptions"] = image.exceptions
    if image.positions is not None:
        fields["positions"] = image.positions
    if image.py_func is not None:  # simulator only; PTX-only images carry no trace of it
        fields["py_func"] = image.py_func
    return fields


def image_from_fields(fields: dict) -> KernelImage:
    """Rebuild a :class:`KernelImage` from plain fields (the pickle and bundle form)."""
    fields = dict(fields)
    fields["ptx"] = tuple((tuple(cc), text) for cc, text in fields["ptx"])
    fields["args"] = tuple(
        a if isinstance(a, ArgSpec) else ArgSpec(*a) for a in fields["args"]
    )
    fields["links"] = tuple(
        x if isinstance(x, LinkInput) else LinkInput(*x) for x in fields.get("links", ())
    )
    fields["writes"] = tuple(fields.get("writes", ()))
    fields["options"] = tuple(tuple(kv) for kv in fields.get("options", ()))
    fields["versions"] = tuple(tuple(kv) for kv in fields.get("versions", ()))
    fields["exceptions"] = tuple(
        (int(code), str(cls), tuple(args), tuple(loc) if loc is not None else None)
        for code, cls, args, loc in fields.get("exceptions", ())
    )
    fields["positions"] = check_uses(fields.get("positions"), len(fields["args"]))
    return KernelImage(**fields)


# The name pickles made before image_from_fields was public refer to; they still load.
_rebuild_image = image_from_fields
