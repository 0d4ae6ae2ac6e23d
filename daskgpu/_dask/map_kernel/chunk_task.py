"""What one :func:`~daskgpu.map_kernel` task runs on a worker: a launch per chunk.

A :class:`ChunkLaunch` holds the PTX-only kernel plus one small parameter
object per kernel parameter (:mod:`daskgpu._dask.map_kernel.chunk_params`), so a worker
needs no compiler and no Python function. Each task runs the launch core's
:func:`~daskgpu._dask.launch_core.task.run_chunk` on it, its chunks and values,
and its last argument says where its chunk lies (a
:class:`~daskgpu._dask.launch_core.task.ChunkPlace`: block id, shape, start), so a
task carries nothing about the other chunks.
In a graph of many chunks it is a key of its own, and the kernel's PTX
travels to each worker once; a small graph carries it in each task, sparing
the scheduler a round trip (:func:`~daskgpu._dask.map_kernel.api._launches`).
:class:`Fused` runs two chained launches in one task, the intermediate staying
on the GPU. The graph around them is built in
:mod:`daskgpu._dask.map_kernel.api`.
"""

from __future__ import annotations

import hashlib
import math
from typing import NamedTuple

import numpy as np

from daskgpu._bounded import BoundedCache
from daskgpu._dask.map_kernel.arrays import array_module, is_cupy
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkContext,
    ChunkParam,
    OutParam,
    ValueParam,
)
from daskgpu._runtime import backends, faults
from daskgpu._runtime.launch_task import LaunchTask

__all__ = ["ChunkLaunch", "ChunkMemory", "Fused", "launches"]


class ChunkMemory(NamedTuple):
    """The device memory a chunk's launch needs: ``fixed + per_element * block elements``.

    ``per_element`` counts the bytes that scale with the block (outputs, and
    inputs chunked as the launch's blocks); ``fixed`` the rest (whole arrays,
    per-chunk outputs, inputs broadcast along some axis, counted at their
    largest chunk). Worked out on the client; the scheduler's placement asks
    each task for its own block's figure, so small chunks of a map with a few
    large ones still share the device.

    Examples
    --------
    >>> m = ChunkMemory(fixed=100, per_element=8, largest=1000)
    >>> m.most, m.for_block((10, 10))
    (8100, 900)
    """

    fixed: int = 0
    per_element: int = 0
    largest: int = 0  # elements of the map's largest block

    @property
    def most(self) -> int:
        """Bytes for the map's largest block: what the graph's check and annotation use."""
        return self.fixed + self.per_element * self.largest

    def for_block(self, shape) -> int:
        """Bytes for a block of ``shape`` (the chunk's place, halos included)."""
        return self.fixed + self.per_element * math.prod(shape)

    def __add__(self, other):  # two launches in one task (Fused) hold both at once
        return ChunkMemory(self.fixed + other.fixed, self.per_element + other.per_element,
                           max(self.largest, other.largest))


class ChunkLaunch(LaunchTask):
    """Launch a PTX-only kernel on one chunk: a small, picklable callable.

    Called with the task's arguments (chunks, whole arrays and values, in the
    order of the parameters that take them), then the chunk's place
    ``(block id, shape, start)`` from :class:`~daskgpu._dask.map_kernel.chunk_params.ChunkPlaces`.

    Parameters
    ----------
    kernel : PTXKernel
        Holds exactly the image selected on the client.
    params : tuple
        One parameter object of :mod:`daskgpu._dask.map_kernel.chunk_params` per kernel
        parameter (``dg.offset`` is one :class:`OffsetParam` per axis).
    returns : tuple of int
        The parameters returned, in order: outputs, then written dask inputs.
    rank : int
        Launch rank: 1 for ``ntasks = chunk.size``, else ``ntasks = chunk.shape``.
    tpb : int
        Threads per block; 0 asks the occupancy API.
    cupy : bool
        Allocate outputs with CuPy even when no chunk argument is a CuPy array.
    ident : tuple, optional
        ``(image hash, backend name)``, the launch cache's key; read once on
        the client, since hashing the PTX again in every task would cost more
        than the cache saves.
    timeout : float, optional
        Seconds a task running it may take on a GPU worker (``map_kernel``'s
        ``timeout=``); None: the worker's ``daskgpu.launch-timeout``.
    memory : ChunkMemory, optional
        The device memory a chunk's launch needs (inputs copied in, outputs),
        which its task asks of its worker's ``GPU-memory``.
    """

    __slots__ = ("kernel", "params", "returns", "rank", "tpb", "cupy", "ident", "timeout",
                 "memory")

    def __init__(self, kernel, params, returns, rank, tpb, cupy, ident=None, timeout=None,
                 memory=None):
        self.kernel, self.params, self.returns = kernel, params, returns
        self.rank, self.tpb, self.cupy = rank, tpb, cupy
        image = kernel.images[0]
        self.ident = ident or (image.hash, backends.for_image(image).name)
        self.timeout = timeout
        self.memory = ChunkMemory() if memory is None else ChunkMemory(*memory)

    def __reduce__(self):
        return ChunkLaunch, (self.kernel, self.params, self.returns, self.rank, self.tpb,
                             self.cupy, self.ident, self.timeout, tuple(self.memory))

    def device_bytes(self, block=None, argument_bytes=0) -> int:
        """The device memory a chunk's launch needs for a block of shape ``block`` (the
        map's largest without one), in bytes; its arguments are counted already."""
        return self.memory.most if block is None else self.memory.for_block(block)

    @property
    def kernel_name(self) -> str:
        return self.kernel.__name__

    def __repr__(self):
        return f"<map_kernel chunk launch of {self.kernel.__name__}>"

    @property
    def __name__(self):
        return self.kernel.__name__

    def __call__(self, *values):
        results = self.run(values[:-1], values[-1])
        return results[0] if len(results) == 1 else results

    def run(self, values, place, chain=None, keep=False):
        """Launch on one chunk; return the returned parameters, as a tuple.

        ``place`` is the chunk's :class:`~daskgpu._dask.launch_core.task.ChunkPlace`.
        ``chain`` is the backend's ``DeviceChain`` of a fused task (see
        :class:`Fused`), or None: with it, host chunks go to the device through the chain,
        once per task, and with ``keep`` the outputs stay there, as
        intermediates of the chain.
        """
        block_id, block, start, members = place
        taking = [p for p in self.params if p.takes_value]
        inputs = [v for p, v in zip(taking, values) if isinstance(p, ChunkParam)]
        shape = tuple(np.broadcast_shapes(block, *(v.shape for v in inputs)))
        chunk = ChunkContext(block_id, shape, start,
                             array_module(self.cupy or any(is_cupy(v) for v in inputs)),
                             backends.for_image(self.kernel.images[0]), chain, keep)
        it = iter(values)
        args = [p.for_chunk(chunk, next(it)) if p.takes_value else p.for_chunk(chunk)
                for p in self.params]
        size = math.prod(shape)
        if size:
            ntasks = size if self.rank == 1 else shape
            with faults.in_chunk(self.kernel.__name__, block_id, shape, start, members):
                self._launch(ntasks, chain)(*args)
        return tuple(self.params[i].result(args[i], chunk) for i in self.returns)

    def _launch(self, ntasks, chain):
        """The Launch for ``ntasks``: one per worker process and shape, kept across tasks.

        Every task unpickles its own PTXKernel, whose Launch (and its fast
        path on device arrays) would otherwise be made afresh per chunk.
        """
        if chain is not None:  # the chain's stream: not cached
            return self.kernel.forall(ntasks, self.tpb, stream=chain.handle)
        return launches.get((self.ident, ntasks, self.tpb),
                            lambda: self.kernel.forall(ntasks, self.tpb))


#: This process's launches of map_kernel tasks (worker side), keyed by
#: ``((image hash, backend name), ntasks, tpb)``.
launches = BoundedCache(256, "map_kernel launches")


class Fused(LaunchTask):
    """Two launches over the same chunks in one task: ``second`` reads ``first``'s output.

    ``first`` takes ``count`` of the task's values from position ``slot`` on;
    its one result takes their place among ``second``'s. On host chunks the
    intermediate stays on the GPU and every host input crosses PCIe once
    (the backend's ``device_chain()``); on CuPy chunks, and in the simulator
    (which has none), the launches simply follow each other.

    A chain of at least ``daskgpu.chain-graphs`` launches on small host chunks
    is replayed from one CUDA graph per key (:meth:`graph_key`) where the
    backend captures graphs (its ``chain_graphs()``): a graph's launch per
    chunk in place of one per kernel.
    """

    __slots__ = ("first", "second", "slot", "count", "_graph")

    def __init__(self, first, second, slot: int, count: int):
        self.first, self.second, self.slot, self.count = first, second, slot, count
        self._graph = None  # its _GraphForm once worked out; False: no graph holds it

    def __reduce__(self):
        return Fused, (self.first, self.second, self.slot, self.count)

    def __repr__(self):
        return f"<map_kernel fused chunk launch of {self.__name__}>"

    @property
    def __name__(self):
        return f"{self.first.__name__}+{self.second.__name__}"

    @property
    def kernel(self):  # the last launch's, for the names of errors and tasks
        return self.second.kernel

    @property
    def memory(self) -> ChunkMemory:  # both launches' arrays, the intermediate among them
        return self.first.memory + self.second.memory

    def device_bytes(self, block=None, argument_bytes=0) -> int:
        return self.memory.most if block is None else self.memory.for_block(block)

    @property
    def kernel_name(self) -> str:
        return self.__name__

    @property
    def timeout(self):  # the task runs both launches: the longer limit, if both have one
        limits = (self.first.timeout, self.second.timeout)
        return None if None in limits else max(limits)

    @property
    def cupy(self):
        return self.first.cupy or self.second.cupy

    def __call__(self, *values):
        values, place = values[:-1], values[-1]
        chain = None
        if not (self.cupy or any(is_cupy(v) for v in values)):
            # A process builds all its images simulated or all for the GPU.
            backend = backends.for_image(self.kernel.images[0])
            results = self._replayed(backend.chain_graphs(), values, place)
            if results is not None:
                return results[0] if len(results) == 1 else results
            chain = backend.device_chain(self.__name__)
        try:
            results = self.run(values, place, chain)
        finally:
            if chain is not None:
                chain.free()
        return results[0] if len(results) == 1 else results

    def run(self, values, place, chain=None, keep=False):
        end = self.slot + self.count
        (middle,) = self.first.run(values[self.slot:end], place, chain, keep=True)
        rest = values[:self.slot] + (middle,) + values[end:]
        return self.second.run(rest, place, chain, keep)

    # -- replayed from a captured graph ------------------------------------------------
    def steps(self, positions=None):
        """Each launch of the chain in the order it runs, with the positions among the
        task's values of what its value-taking parameters read (None: the output of
        the launch before it). A fused chain is a tree: ``Fused(Fused(a, b, 0, 1), c,
        1, 2)`` runs ``a`` on value 1, ``b`` on ``a``'s output and value 2, and ``c``
        on value 0 and ``b``'s output.
        """
        if positions is None:
            positions = tuple(range(self._value_count()))
        end = self.slot + self.count
        first, second = self.first, self.second
        inner = positions[self.slot:end]
        outer = positions[:self.slot] + (None,) + positions[end:]
        for launch, where in ((first, inner), (second, outer)):
            if isinstance(launch, Fused):
                yield from launch.steps(where)
            else:
                yield launch, where

    def _value_count(self) -> int:
        def taking(launch):
            if isinstance(launch, Fused):
                return launch._value_count()
            return sum(p.takes_value for p in launch.params)

        return taking(self.first) + taking(self.second) - 1

    def _graph_form(self):
        """The :class:`_GraphForm` of a chain a graph can hold, else False; worked out once.

        A graph holds chunks, aligned outputs and numbers: no chunk's offset, random
        states, per-chunk outputs, whole arrays or written inputs (which differ per
        chunk or come back through the host), no kernel compiled for debugging (whose
        launch waits to read what a thread raised) and no cooperative launch (which
        the capture does not take).
        """
        if self._graph is None:
            identity, sources, scalars, form = [], [], [], True
            for launch, where in self.steps():
                if any(image.option("debug") or image.option("cooperative")
                       for image in launch.kernel.images):
                    form = False
                taking = [p for p in launch.params if p.takes_value]
                for param, position in zip(taking, where):
                    if isinstance(param, ChunkParam) and not param.written:
                        if position is not None:
                            sources.append(position)
                    elif isinstance(param, ValueParam):
                        scalars.append(position)
                    else:
                        form = False
                if any(not isinstance(p, OutParam | ChunkParam | ValueParam)
                       for p in launch.params):
                    form = False
                identity.append((launch.ident, launch.params, launch.returns, launch.rank,
                                 launch.tpb, where))
            digest = hashlib.blake2b(repr(identity).encode(), digest_size=16).hexdigest()
            self._graph = (_GraphForm(digest, len(identity), tuple(sources), tuple(scalars),
                                      self.memory) if form else False)
        return self._graph

    def graph_key(self, values, place):
        """What a graph of this chain holds fixed for a task of ``values`` at ``place``, as
        a hashable key; None where no graph can hold the chain or these values.

        The chain's launches; the chunk's shape; each chunk input's shape, dtype and
        layout, and which inputs are one array (read by several launches, staged
        once); and each number, by its type and exact value (``repr``: 0.0 and -0.0
        differ). Two chunks of one map of equal shapes have equal keys.
        """
        form = self._graph_form()
        if form is False:
            return None
        arrays, first = [], {}
        for position in form.sources:
            value = values[position]
            if type(value) is not np.ndarray:
                return None
            flags = value.flags
            arrays.append((value.shape, value.dtype, flags.c_contiguous, flags.f_contiguous,
                           first.setdefault(id(value), position)))
        numbers = []
        for position in form.scalars:
            value = values[position]
            if not isinstance(value, _NUMBERS):
                return None
            numbers.append((type(value), repr(value)))
        return form.identity, tuple(place[1]), tuple(arrays), tuple(numbers)

    def _replayed(self, graphs, values, place):
        """The task's results replayed from a captured graph of the chain, or None: launch."""
        if graphs is None:
            return None
        form, block = self._graph_form(), place[1]
        if (form is False or not math.prod(block)
                or not graphs.pays(form.launches, form.memory.for_block(block))):
            return None
        key = self.graph_key(values, place)
        if key is None:
            return None
        with faults.in_chunk(self.__name__, *place):  # a fault of the graph names the chunk
            return graphs.run(key, values, form.sources,
                              lambda chain: self.run(values, place, chain, keep=True),
                              self.__name__)


class _GraphForm(NamedTuple):
    """What a :class:`Fused` chain that a CUDA graph can hold keeps of itself for its keys.

    Attributes
    ----------
    identity : str
        A digest of each launch's image, parameters, results, rank and block size,
        and where its values come from: hashing those on every task would cost
        more than a launch.
    launches : int
        How many launches the chain runs.
    sources : tuple of int
        The position among the task's values of each chunk input, in the order the
        launches copy them to the device.
    scalars : tuple of int
        The positions of the values passed as numbers.
    memory : ChunkMemory
        The chain's device memory (its launches', added once).
    """

    identity: str
    launches: int
    sources: tuple
    scalars: tuple
    memory: ChunkMemory


#: The values a graph holds as numbers (anything else is no scalar it can hold).
_NUMBERS = (bool, int, float, complex, np.number, np.bool_)
