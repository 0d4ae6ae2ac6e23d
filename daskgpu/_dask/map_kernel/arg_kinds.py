"""The kinds of :func:`~daskgpu.map_kernel` argument: one class each, all the client plans for it.

A kind recognises its arguments (``claims``) and refuses those it cannot
take, in one line that names the fix (``of``), when the graph is built. It
gives the example values a kernel image is selected or compiled for
(``examples``), and plans the kernel parameters of
:mod:`daskgpu._dask.map_kernel.chunk_params` that its argument becomes (``plan``).
:func:`classify` asks :data:`KINDS` in order, and
:mod:`daskgpu._dask.map_kernel.selection` asks the kinds it got.

A new kind of argument is one class here, listed in :data:`KINDS`, plus a
parameter type in :mod:`~daskgpu._dask.map_kernel.chunk_params` when none there does
what its tasks need; a kind that leaves out ``claims``, ``examples`` or
``plan`` is refused when this module is imported.
"""

from __future__ import annotations

from numbers import Number
from typing import Any, ClassVar, NamedTuple

import numpy as np

from daskgpu._dask.map_kernel.arguments import Out, offset, unknown_sizes
from daskgpu._dask.map_kernel.arrays import native_fix, plain_dtype
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkParam,
    FlatChunkParam,
    FlatOutParam,
    OffsetParam,
    OutParam,
    PerChunkParam,
    StatesParam,
    ValueParam,
    WholeParam,
)
from daskgpu._image.random_states import STATE_DTYPE, RandomStates

__all__ = ["ArrayKind", "KINDS", "Kind", "OffsetKind", "OutKind", "PerChunkKind", "Planned",
           "Planning", "Result", "StatesKind", "Step", "ValueKind", "WholeKind",
           "check_array", "check_extras", "classify"]


class Planned(NamedTuple):
    """One kernel parameter: its parameter object and, on the client, where it comes from.

    ``source`` indexes the dask arrays and outputs for :class:`ChunkParam`
    and :class:`OutParam`, is the :class:`Out` of a :class:`PerChunkParam`,
    the task argument of a :class:`WholeParam` or :class:`ValueParam`, else None.
    """

    param: Any
    source: Any


class Result(NamedTuple):
    """A returned parameter: its index among the kernel's parameters, and its dtype."""

    index: int
    dtype: np.dtype


class Planning(NamedTuple):
    """What every kind's ``plan`` is given: the map as a whole.

    Attributes
    ----------
    kernel_name : str
    writes : frozenset of int
        The kernel parameters the selected image may write.
    out_chunks : tuple of tuple of int
        The mapped chunks (aligned, before halos).
    simulate : bool
        The tasks run in the CUDA simulator.
    flat : bool
        Chunks and aligned outputs are passed as flat 1-D arrays.
    arrays : list
        The dask arrays and aligned :class:`Out` of the map, as :func:`classify` found them.
    """

    kernel_name: str
    writes: frozenset
    out_chunks: tuple
    simulate: bool
    flat: bool
    arrays: list


class Step(NamedTuple):
    """What one argument becomes: its kernel parameters, and what of them a task returns.

    ``output`` is a declared output's :class:`Result`; ``written`` a written
    dask input's, which comes back after all the outputs.
    """

    planned: tuple
    output: Result | None = None
    written: Result | None = None


class Kind:
    """One kind of ``map_kernel`` argument, as the client sees it.

    Subclasses define ``claims`` (whether an argument is of this kind),
    ``examples`` (one value per kernel parameter, of the type its chunks
    have) and ``plan``; they may refine ``of`` (validation), ``width`` (how
    many kernel parameters the argument stands for) and ``check`` (what the
    whole map must allow).

    Attributes
    ----------
    value : object
        The argument.
    index : int or None
        For an aligned kind (``aligned``: a dask array or an aligned output),
        its place among the map's arrays; else None.
    """

    __slots__ = ("value", "index")
    #: Whether the argument is one of the arrays the map takes its chunks from.
    aligned: ClassVar[bool] = False
    #: The argument in a message that lists what map_kernel got.
    label: ClassVar[str] = "an argument"
    _REQUIRED: ClassVar[tuple] = ("claims", "examples", "plan")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        missing = [m for m in Kind._REQUIRED if getattr(cls, m) is getattr(Kind, m)]
        if missing:
            raise TypeError(f"map_kernel argument kind {cls.__name__} must define "
                            f"{', '.join(missing)}")

    def __init__(self, value, index=None):
        self.value, self.index = value, index

    def __repr__(self):
        return f"{type(self).__name__}({self.value!r})"

    @staticmethod
    def claims(arg) -> bool:
        """Whether ``arg`` is of this kind."""
        raise NotImplementedError

    @classmethod
    def of(cls, arg, pos: int, index=None) -> Kind:
        """The kind of ``arg``, argument ``pos`` of ``map_kernel``; refuses what it cannot take."""
        return cls(arg, index)

    def check(self, ndim: int, depth) -> None:
        """Refuse a map this argument has no meaning in (``depth``: halos asked for, or None)."""

    def width(self, ndim: int) -> int:
        """How many kernel parameters this argument stands for."""
        return 1

    def examples(self, ndim: int, flat: bool) -> tuple:
        """One value per kernel parameter, of the type a chunk's launch passes."""
        raise NotImplementedError

    def plan(self, specs: tuple, index: int, planning: Planning) -> Step:
        """The kernel parameters from ``index`` on (their ``specs``: ArgSpecs) for every chunk."""
        raise NotImplementedError


def check_array(a, pos: int) -> None:
    """Refuse a dask array a kernel cannot take as it is, naming the fix.

    Unknown chunk sizes (after boolean indexing), a masked array (``da.ma``:
    a kernel would see the data alone, and drop the mask) and non-native byte
    order are refused when the graph is built.
    """
    if unknown_sizes(a.chunks):
        raise ValueError(
            f"map_kernel argument {pos} has unknown chunk sizes {a.chunks} (as after "
            "boolean indexing, x[x > 0]); call x = x.compute_chunk_sizes() first"
        )
    if isinstance(a._meta, np.ma.MaskedArray):
        raise TypeError(
            f"map_kernel argument {pos} is a masked array (da.ma), and a kernel sees its "
            "data alone, so the mask would be dropped; pass da.ma.filled(x, fill_value), "
            "and the mask as an argument of its own (da.ma.getmaskarray(x)) if the kernel "
            "needs it"
        )
    fix = native_fix(a.dtype)
    if fix is not None:
        raise TypeError(
            f"map_kernel argument {pos} has dtype {a.dtype.str}, not in this machine's "
            f"byte order, which kernels cannot take; convert with x{fix}"
        )


# -- the kinds ------------------------------------------------------------------

class ArrayKind(Kind):
    """A dask array: one chunk per launch, returned after the outputs if the kernel writes it."""

    __slots__ = ()
    label = "a dask array"
    aligned = True

    @staticmethod
    def claims(arg) -> bool:
        import dask.array as da

        return isinstance(arg, da.Array)

    @classmethod
    def of(cls, arg, pos, index=None):
        check_array(arg, pos)
        return cls(arg, index)

    def examples(self, ndim, flat):
        a = self.value
        return (np.empty((1,) * (1 if flat else a.ndim), dtype=a.dtype),)

    def plan(self, specs, index, planning):
        (spec,) = specs
        written = index in planning.writes
        if planning.flat and written:
            _check_flat_written(planning.kernel_name, self.value, planning.out_chunks)
        param = (FlatChunkParam if planning.flat else ChunkParam)(spec.layout, written)
        return Step((Planned(param, self.index),),
                    written=Result(index, self.value.dtype) if written else None)


class OutKind(Kind):
    """An output aligned with the chunks (:class:`Out` without ``per_chunk``)."""

    __slots__ = ()
    label = "dg.Out"
    aligned = True

    @staticmethod
    def claims(arg) -> bool:
        return isinstance(arg, Out) and arg.per_chunk is None

    def examples(self, ndim, flat):
        return (np.empty((1,) * (1 if flat else ndim), dtype=self.value.dtype),)

    def plan(self, specs, index, planning):
        (spec,) = specs
        dtype = self.value.dtype
        param = (FlatOutParam if planning.flat else OutParam)(plain_dtype(dtype), spec.layout)
        return Step((Planned(param, self.index),), output=Result(index, dtype))


class PerChunkKind(Kind):
    """An output of its own shape per launch (``dg.Out(dtype, per_chunk=shape)``)."""

    __slots__ = ()
    label = "dg.Out(per_chunk=...)"

    @staticmethod
    def claims(arg) -> bool:
        return isinstance(arg, Out) and arg.per_chunk is not None

    def check(self, ndim, depth):
        if depth is not None:
            raise ValueError(
                f"map_kernel got depth={depth!r} with a per-chunk output "
                "(dg.Out(per_chunk=...)). Halos overlap neighbouring chunks, so their "
                "elements would count in two per-chunk results; map without depth, or use "
                "an aligned output (dg.Out(dtype, like=x)) and reduce it afterwards"
            )

    def examples(self, ndim, flat):
        out = self.value
        return (np.empty((1,) * out.ndim, dtype=out.dtype),)

    def plan(self, specs, index, planning):
        (spec,) = specs
        out = self.value
        param = PerChunkParam(plain_dtype(out.dtype), out.per_chunk, out.fill, spec.layout)
        return Step((Planned(param, out),), output=Result(index, out.dtype))


class OffsetKind(Kind):
    """``dg.offset``: the chunk's global start, one ``int64`` kernel parameter per axis."""

    __slots__ = ()
    label = "dg.offset"

    @staticmethod
    def claims(arg) -> bool:
        return arg is offset

    def width(self, ndim):
        return ndim

    def examples(self, ndim, flat):
        return (np.int64(0),) * ndim

    def plan(self, specs, index, planning):
        return Step(tuple(Planned(OffsetParam(ax), None) for ax in range(len(specs))))


class StatesKind(Kind):
    """``dg.random_states(seed)``: the chunk's random states, scratch (not returned)."""

    __slots__ = ()
    label = "dg.random_states"

    @staticmethod
    def claims(arg) -> bool:
        return isinstance(arg, RandomStates)

    @classmethod
    def of(cls, arg, pos, index=None):
        if arg.n is not None or arg.start:
            raise TypeError(
                f"map_kernel argument {pos} is {arg!r}; in map_kernel write "
                f"dg.random_states({arg.seed}) without n or start: each chunk gets the "
                "states of its elements' global indices"
            )
        return cls(arg, index)

    def check(self, ndim, depth):
        if depth is not None:
            raise ValueError(
                f"map_kernel got depth={depth!r} with dg.random_states: a halo element "
                "belongs to two chunks and would draw from one state twice; map without depth"
            )
        if ndim > 3:
            raise ValueError(
                f"dg.random_states numbers the elements of maps of up to 3 dimensions; this "
                f"map is {ndim}-D. Reshape the arrays to at most 3 dimensions first"
            )

    def examples(self, ndim, flat):
        return (np.empty(1, dtype=STATE_DTYPE),)

    def plan(self, specs, index, planning):
        shape = tuple(int(sum(c)) for c in planning.out_chunks)  # random states refuse halos
        param = StatesParam(self.value.seed, StatesParam.strides_of(shape),
                            _states_builder(planning.simulate))
        return Step((Planned(param, None),))


class WholeKind(Kind):
    """A NumPy or device array, passed whole to every launch (a copy, if written)."""

    __slots__ = ()
    label = "an array passed whole"

    @staticmethod
    def claims(arg) -> bool:
        return isinstance(arg, np.ndarray) or hasattr(arg, "__cuda_array_interface__")

    @classmethod
    def of(cls, arg, pos, index=None):
        fix = native_fix(arg.dtype) if isinstance(arg, np.ndarray) else None
        if fix is not None:
            raise TypeError(
                f"map_kernel argument {pos} has dtype {arg.dtype.str}, not in this machine's "
                f"byte order, which kernels cannot take; convert with a{fix}"
            )
        if isinstance(arg, np.ma.MaskedArray):
            raise TypeError(
                f"map_kernel argument {pos} is a numpy masked array, and a kernel sees its "
                "data alone, so the mask would be dropped; pass np.ma.filled(a, fill_value), "
                "and np.ma.getmaskarray(a) as an argument of its own if the kernel needs it"
            )
        return cls(arg, index)

    def examples(self, ndim, flat):
        return (self.value,)

    def plan(self, specs, index, planning):
        return Step((Planned(WholeParam(index in planning.writes), self.value),))


class ValueKind(Kind):
    """A number, passed as it is to every launch."""

    __slots__ = ()
    label = "a number"

    @staticmethod
    def claims(arg) -> bool:
        from dask.base import is_dask_collection

        return isinstance(arg, (Number, np.generic)) and not is_dask_collection(arg)

    def examples(self, ndim, flat):
        return (self.value,)

    def plan(self, specs, index, planning):
        return Step((Planned(ValueParam(), self.value),))


#: The kinds :func:`classify` tries, in order: the first that claims an argument has it.
KINDS = (ArrayKind, PerChunkKind, OutKind, OffsetKind, StatesKind, WholeKind, ValueKind)


def classify(args):
    """The kind of each argument, and the dask arrays and aligned :class:`Out` among them.

    Returns ``(roles, arrays)``: one :class:`Kind` per argument; an aligned
    one's ``index`` is its place in ``arrays``.
    """
    roles, arrays = [], []
    for pos, a in enumerate(args):
        kind = next((k for k in KINDS if k.claims(a)), None)
        if kind is None:
            raise TypeError(
                f"map_kernel argument {pos} is a {type(a).__name__}; pass dask arrays, "
                "numpy or device arrays (passed whole to every chunk), numbers, "
                "dg.Out(dtype, like=x) outputs, dg.offset or dg.random_states(seed)"
            )
        role = kind.of(a, pos, len(arrays) if kind.aligned else None)
        if kind.aligned:
            arrays.append(a)
        roles.append(role)
    if not arrays:
        raise ValueError(
            "map_kernel needs at least one dask array or dg.Out among the arguments "
            "to take its chunks from (an aligned one: a per-chunk output has no chunks); "
            "for a single launch use kernel.forall(n)(...)"
        )
    return roles, arrays


def check_extras(roles, ndim, depth):
    """Refuse arguments that have no meaning in this map (per-chunk outputs or random
    states with halos, random states over more than 3 dimensions)."""
    halo = depth is not None and any(
        depth.values() if isinstance(depth, dict) else np.atleast_1d(depth).tolist())
    for role in roles:
        role.check(ndim, depth if halo else None)


def _check_flat_written(kernel_name, array, out_chunks):
    """A written input of a flat map must have the map's shape: it comes back in its own."""
    shape = tuple(int(sum(c)) for c in out_chunks)
    if tuple(array.shape) != shape:
        raise ValueError(
            f"kernel {kernel_name!r} writes a dask array of shape {tuple(array.shape)} that "
            f"it sees flat, broadcast to the map's shape {shape}; broadcast elements share "
            "memory, so it cannot come back. Broadcast it first (da.broadcast_to(x, "
            f"{shape}).copy()), or write into a dg.Out instead"
        )


def _states_builder(simulate: bool):
    """The PTX-only states kernel, compiled here on the client; None for ``simulate``."""
    if simulate:
        return None  # simulated workers build states on the host, from the same table
    from daskgpu._compiler.random_states import builder

    return builder()
