"""The parameters of a :func:`~daskgpu.map_kernel` launch, one small type per kind.

Each kernel parameter of a :class:`~daskgpu._dask.map_kernel.chunk_task.ChunkLaunch` is
one of these frozen types, plain data that pickles in a few bytes:

=====================  ===========================================================
:class:`ChunkParam`    the task's chunk of a dask array (a task argument)
:class:`FlatChunkParam` the same, as a flat 1-D view, for a 1-D parameter
:class:`OutParam`      an output aligned with the chunks, allocated per chunk
:class:`FlatOutParam`  the same, allocated flat for a 1-D parameter
:class:`WholeParam`    a NumPy or device array passed whole (a task argument)
:class:`ValueParam`    a number (a task argument)
:class:`OffsetParam`   one axis of the chunk's global start (``dg.offset``)
:class:`PerChunkParam` an output of its own shape per launch (``per_chunk=``)
:class:`StatesParam`   the chunk's random states (``dg.random_states(seed)``)
=====================  ===========================================================

Each prepares itself for one chunk with ``for_chunk(chunk, value)``, given the
:class:`ChunkContext` of that chunk; the outputs turn what the kernel wrote
into the task's result with ``result(argument, chunk)``. A task learns where
its chunk lies from :class:`ChunkPlaces`, a ``BlockwiseDep`` that gives every
task its own block id, shape and start, so no task carries the chunking of
the whole array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple

import numpy as np
from dask._task_spec import DataNode
from dask.layers import ArrayBlockwiseDep

from daskgpu._dask.launch_core.task import ChunkPlace

# What both halves of a map ask of arrays; is_cupy is named here for the plan's import.
from daskgpu._dask.map_kernel.arrays import is_cupy  # noqa: F401
from daskgpu._image.array_info import Zeroed
from daskgpu._runtime.launch import unwrap

__all__ = [
    "ChunkContext", "ChunkParam", "ChunkPlaces", "FlatChunkParam", "FlatOutParam", "FlatView",
    "OffsetParam", "OutParam", "PerChunkParam", "StatesParam", "ValueParam", "WholeParam",
    "flat_view", "fresh",
]


class ChunkContext(NamedTuple):
    """One chunk, as the parameters of its launch see it (worker side).

    Attributes
    ----------
    block_id : tuple of int
        The chunk's block index in the mapped arrays.
    shape : tuple of int
        The chunk's shape: the launch's, and its aligned outputs' (with halos,
        when ``depth`` is given).
    start : tuple of int
        Global index of the chunk's element 0, per axis (with ``depth``, of
        the extended chunk: negative at the lower edge unless
        ``boundary="none"``).
    xp : module
        NumPy, or CuPy when the chunks are CuPy arrays.
    backend : GPUBackend or SimulatorBackend
        Where the launch runs (:mod:`daskgpu._runtime.backends`).
    chain : DeviceChain or None
        The device chain of a fused task (:class:`~daskgpu._dask.map_kernel.chunk_task.Fused`).
    keep : bool
        Within a chain, keep the outputs on the device: they are intermediates.
    """

    block_id: tuple
    shape: tuple
    start: tuple
    xp: Any
    backend: Any
    chain: Any = None
    keep: bool = False


class ChunkPlaces(ArrayBlockwiseDep):
    """Where each block lies, handed to its task alone: a
    :class:`~daskgpu._dask.launch_core.task.ChunkPlace` ``(block id, shape, start)``, and
    for a grouped launch the user's chunks it holds (``members``).

    A ``BlockwiseDep`` of the launch layer: dask calls ``places[block_id]``
    as it builds each task and puts just that block's place (a small record of ints) in
    it, so a task's size does not grow with the number of chunks.

    Parameters
    ----------
    chunks : tuple of tuple of int
        The launch's blocks (with halos, when ``depth`` is given).
    starts : tuple of tuple of int
        Per axis and block, the global index of the block's element 0.
    members : tuple or None
        Grouped launches: per axis and block, ``(index, start, sizes)`` of the
        user's chunks it holds (the first one's index and global start, and
        each one's size), so that errors name the user's chunk; None where
        each block is one chunk.

    Examples
    --------
    >>> places = ChunkPlaces(((2, 2), (3,)), ((0, 2), (0,)))
    >>> tuple(places[1, 0])
    ((1, 0), (2, 3), (2, 0), None)
    >>> ChunkPlaces(((4,),), ((0,),), (((0, 0, (2, 2)),),))[0,].members
    ((0, 0, (2, 2)),)
    """

    def __init__(self, chunks, starts, members=None):
        super().__init__(tuple(tuple(int(c) for c in axis) for axis in chunks))
        self.starts = tuple(tuple(int(s) for s in axis) for axis in starts)
        self.members = members

    def __getitem__(self, idx: tuple) -> ChunkPlace:
        idx = tuple(int(i) for i in idx)
        members = None if self.members is None else tuple(
            m[i] for m, i in zip(self.members, idx))
        return ChunkPlace(idx, tuple(c[i] for c, i in zip(self.chunks, idx)),
                          tuple(s[i] for s, i in zip(self.starts, idx)), members)

    def get(self, idx: tuple, default=None):
        """Block ``idx``'s place as the task's argument: a ``DataNode`` already.

        What dask asks as it builds each task. Handed a plain tuple, it would
        search the nested tuples of ints for keys, one call per element, on
        every task (a tenth of a 20,000-chunk graph's build time).

        Examples
        --------
        >>> ChunkPlaces(((2, 2),), ((0, 2),)).get((1,)).value
        ChunkPlace(block_id=(1,), shape=(2,), start=(2,), members=None)
        """
        return DataNode(None, self[idx])

    def __reduce__(self):
        return ChunkPlaces, (self.chunks, self.starts, self.members)


class _Param:
    """What every parameter type shares: plain fields, pickled as a constructor call.

    Each type is a frozen dataclass whose ``__slots__`` name its fields in
    order; they are written out rather than made by ``dataclass(slots=True)``,
    whose frozen ``__setattr__`` raises TypeError instead on Python 3.11.
    """

    __slots__ = ()
    #: Whether the parameter takes the task's next argument.
    takes_value: ClassVar[bool] = False

    def __reduce__(self):
        # The dataclass's fields, not __slots__: a subclass adds no slots of its own.
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    def for_chunk(self, chunk: ChunkContext, value=None):
        """This parameter's kernel argument for ``chunk``.

        ``value`` is the task's argument, for the types that take one
        (``takes_value``).
        """
        raise NotImplementedError

    def result(self, argument, chunk: ChunkContext):
        """What the task returns for this parameter after the launch wrote ``argument``."""
        return unwrap(argument)


@dataclass(frozen=True)
class ChunkParam(_Param):
    """The task's chunk of a dask array, in the layout the kernel's signature asks for.

    ``layout`` is ``"C"``, ``"F"`` or ``"A"`` (any); a chunk the kernel
    writes (``written``) is passed as a copy, never as dask's own.

    Examples
    --------
    >>> import numpy as np
    >>> p = ChunkParam("C", written=False)
    >>> chunk = ChunkContext((0,), (2, 2), (0, 0), np, backend=None)
    >>> p.for_chunk(chunk, np.ones((2, 2), order="F")).flags.c_contiguous
    True
    """

    __slots__ = ("layout", "written")
    layout: str
    written: bool
    takes_value: ClassVar[bool] = True

    def for_chunk(self, chunk: ChunkContext, value):
        if chunk.chain is not None and not self.written:
            if isinstance(value, np.ndarray):
                return chunk.chain.to_device(self._laid_out(value, chunk.xp))
            return value  # an intermediate of the chain, already on the device
        return self._laid_out(value, chunk.xp)

    def _laid_out(self, value, xp):
        if self.written:  # never touch the user's chunk: dask may share it
            return xp.array(value, order=_order(self.layout), copy=True)
        if self.layout == "C" and not value.flags.c_contiguous:
            return xp.ascontiguousarray(value)
        if self.layout == "F" and not value.flags.f_contiguous:
            return xp.asfortranarray(value)
        return value


@dataclass(frozen=True)
class OutParam(_Param):
    """An output aligned with the chunks: a zero-filled array of the chunk's shape."""

    __slots__ = ("dtype", "layout")
    dtype: Any
    layout: str

    def for_chunk(self, chunk: ChunkContext, value=None):
        if chunk.chain is not None and chunk.keep:
            return chunk.chain.zeros(chunk.shape, self.dtype, _order(self.layout))
        return fresh(chunk.xp, chunk.shape, self.dtype, self.layout, 0)


@dataclass(frozen=True)
class FlatChunkParam(ChunkParam):
    """The task's chunk as a flat, C-ordered 1-D array: a rank-1 kernel over N-D chunks.

    A chunk smaller than the launch (a broadcast one, of lower rank or with
    axes of length 1) is broadcast to the launch's shape first, a copy, so
    that element ``i`` of every flat argument is the same element of the
    chunk, as a NumPy ufunc pairs them. A written chunk comes back in its
    chunk's shape.

    Examples
    --------
    >>> import numpy as np
    >>> chunk = ChunkContext((0, 0), (2, 2), (0, 0), np, backend=None)
    >>> FlatChunkParam("C", written=False).for_chunk(chunk, np.array([10, 20]))
    array([10, 20, 10, 20])
    """

    __slots__ = ()

    def for_chunk(self, chunk: ChunkContext, value):
        if chunk.chain is not None and not self.written:
            if isinstance(value, np.ndarray):
                return chunk.chain.to_device(self._flat(value, chunk))
            return flat_view(value)  # an intermediate of the chain, already on the device
        return self._flat(value, chunk)

    def _flat(self, value, chunk):
        xp = chunk.xp
        if tuple(value.shape) != tuple(chunk.shape):
            value = xp.broadcast_to(value, chunk.shape)
        if self.written:  # never touch the user's chunk: dask may share it
            return xp.array(value, order="C", copy=True).reshape(-1)
        return xp.ascontiguousarray(value).reshape(-1)

    def result(self, argument, chunk: ChunkContext):
        return unwrap(argument).reshape(chunk.shape)


@dataclass(frozen=True)
class FlatOutParam(OutParam):
    """An aligned output allocated flat (1-D, C order) and returned in the chunk's shape.

    Examples
    --------
    >>> import numpy as np
    >>> chunk = ChunkContext((0, 0), (2, 3), (0, 0), np, backend=None)
    >>> out = FlatOutParam("<f8", "C").for_chunk(chunk)
    >>> out.array.shape, FlatOutParam("<f8", "C").result(out, chunk).shape
    ((6,), (2, 3))
    """

    __slots__ = ()

    def for_chunk(self, chunk: ChunkContext, value=None):
        if chunk.chain is not None and chunk.keep:
            # Kept on the device in the chunk's shape, for the chain's next launch.
            return flat_view(chunk.chain.zeros(chunk.shape, self.dtype, "C"))
        return fresh(chunk.xp, (math.prod(chunk.shape),), self.dtype, "C", 0)

    def result(self, argument, chunk: ChunkContext):
        if isinstance(argument, FlatView):
            return argument.base
        return unwrap(argument).reshape(chunk.shape)


class FlatView:
    """A flat 1-D view of a C-contiguous device array, through ``__cuda_array_interface__``.

    For device arrays that have no ``reshape`` of their own (a fused task's
    intermediates); ``base`` is the array seen.
    """

    __slots__ = ("base",)

    def __init__(self, base):
        self.base = base

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = dict(self.base.__cuda_array_interface__)
        cai["shape"] = (math.prod(cai["shape"]),)
        cai["strides"] = None
        return cai


def flat_view(value):
    """``value``, a C-contiguous array, as 1-D: a NumPy or CuPy view, else a :class:`FlatView`."""
    if hasattr(value, "reshape"):
        return value.reshape(-1)
    return FlatView(value)


@dataclass(frozen=True)
class WholeParam(_Param):
    """A NumPy or device array passed whole to every launch; a copy when written."""

    __slots__ = ("written",)
    written: bool
    takes_value: ClassVar[bool] = True

    def for_chunk(self, chunk: ChunkContext, value):
        return value.copy() if self.written else value


@dataclass(frozen=True)
class ValueParam(_Param):
    """A number, passed as it is."""

    __slots__ = ()
    takes_value: ClassVar[bool] = True

    def for_chunk(self, chunk: ChunkContext, value):
        return value


@dataclass(frozen=True)
class OffsetParam(_Param):
    """Axis ``axis`` of the chunk's global start, an ``int64`` (``dg.offset`` gives one per axis).

    Examples
    --------
    >>> import numpy as np
    >>> OffsetParam(1).for_chunk(ChunkContext((1, 2), (4, 4), (4, 8), np, backend=None))
    np.int64(8)
    """

    __slots__ = ("axis",)
    axis: int

    def for_chunk(self, chunk: ChunkContext, value=None):
        return np.int64(chunk.start[self.axis])


@dataclass(frozen=True)
class PerChunkParam(_Param):
    """An output of ``shape`` per launch, starting as ``fill``; one block of the result."""

    __slots__ = ("dtype", "shape", "fill", "layout")
    dtype: Any
    shape: tuple
    fill: Any
    layout: str

    def for_chunk(self, chunk: ChunkContext, value=None):
        return fresh(chunk.xp, self.shape, self.dtype, self.layout, self.fill)

    def result(self, argument, chunk: ChunkContext):
        # Leading axes of length 1: the result has one block per launch.
        return unwrap(argument).reshape((1,) * len(chunk.shape) + tuple(self.shape))


@dataclass(frozen=True)
class StatesParam(_Param):
    """The chunk's random states: element ``i`` gets the state of its global flat index.

    ``strides`` count states per step along each axis of the whole mapped
    array (row-major); ``builder`` is the PTX-only states kernel for a GPU, or
    None where the client simulated.
    """

    __slots__ = ("seed", "strides", "builder")
    seed: int
    strides: tuple
    builder: Any

    def for_chunk(self, chunk: ChunkContext, value=None):
        base = sum(s * st for s, st in zip(chunk.start, self.strides))
        return chunk.backend.random_states(self.seed, base, tuple(chunk.shape), self.strides,
                                           self.builder)

    @staticmethod
    def strides_of(shape) -> tuple:
        """Row-major strides, in elements, of an array of ``shape``."""
        return tuple(math.prod(shape[ax + 1:]) for ax in range(len(shape)))


def _order(layout) -> str:
    return "F" if layout == "F" else "C"


def fresh(xp, shape, dtype, layout, fill):
    """A new output of ``shape`` filled with ``fill``; NumPy zeros are filled on the GPU."""
    order = _order(layout)
    if xp is not np:
        if fill == 0:  # a memset, not a fill kernel
            return xp.zeros(shape, dtype=dtype, order=order)
        return xp.full(shape, fill, dtype=dtype, order=order)
    if fill == 0:
        # Zero-filled on the GPU by the launch, not copied there.
        return Zeroed(np.empty(shape, dtype=dtype, order=order))
    return np.full(shape, fill, dtype=dtype, order=order)
