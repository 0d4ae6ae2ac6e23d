"""What one :func:`~daskgpu.map_kernel` task runs on a worker: a launch per chunk.

A task holds a :class:`ChunkLaunch`: one small parameter object per kernel
parameter (:mod:`daskgpu._dask.chunk_params`), so a worker needs no compiler
and no Python function. The PTX-only kernel is the task's first argument, a
key of the graph of its own, so it travels to each worker once, not in every
task; the last argument says where the chunk lies (block id, shape, start), so
a task carries nothing about the other chunks. :class:`Fused` runs two chained launches in one task, the
intermediate staying on the GPU. The graph around them is built in
:mod:`daskgpu._dask.mapping`.
"""

from __future__ import annotations

import math

import numpy as np

from daskgpu._bounded import BoundedCache
from daskgpu._dask.chunk_params import ChunkContext, ChunkParam, array_module, is_cupy
from daskgpu._runtime import backend as backends

__all__ = ["ChunkLaunch", "Fused", "launches"]


class ChunkLaunch:
    """Launch a PTX-only kernel on one chunk: a small, picklable callable.

    Called with the kernel (a :class:`~daskgpu.PTXKernel` holding exactly the
    image selected on the client), the task's arguments (chunks, whole arrays
    and values, in the order of the parameters that take them), then the
    chunk's place ``(block id, shape, start)`` from
    :class:`~daskgpu._dask.chunk_params.ChunkPlaces`.

    Parameters
    ----------
    name : str
        The kernel's name, for task names and error messages.
    params : tuple
        One parameter object of :mod:`daskgpu._dask.chunk_params` per kernel
        parameter (``dg.offset`` is one :class:`OffsetParam` per axis).
    returns : tuple of int
        The parameters returned, in order: outputs, then written dask inputs.
    rank : int
        Launch rank: 1 for ``ntasks = chunk.size``, else ``ntasks = chunk.shape``.
    tpb : int
        Threads per block; 0 asks the occupancy API.
    cupy : bool
        Allocate outputs with CuPy even when no chunk argument is a CuPy array.
    ident : tuple
        ``(image hash, backend name)``, the launch cache's key; read once on
        the client, since hashing the PTX again in every task would cost more
        than the cache saves.
    """

    __slots__ = ("name", "params", "returns", "rank", "tpb", "cupy", "ident")
    #: Marks a GPU launch for :mod:`daskgpu._dask.placement`, which keeps it on GPU workers.
    daskgpu_launch = True
    #: How many kernels lead the task's arguments.
    kernel_count = 1

    def __init__(self, name, params, returns, rank, tpb, cupy, ident):
        self.name, self.params, self.returns = name, params, returns
        self.rank, self.tpb, self.cupy, self.ident = rank, tpb, cupy, ident

    def __reduce__(self):
        return ChunkLaunch, (self.name, self.params, self.returns, self.rank, self.tpb,
                             self.cupy, self.ident)

    def __repr__(self):
        return f"<map_kernel chunk launch of {self.name}>"

    @property
    def __name__(self):
        return self.name

    def __call__(self, kernel, *values):
        results = self.run((kernel,), values[:-1], values[-1])
        return results[0] if len(results) == 1 else results

    def run(self, kernels, values, place, chain=None, keep=False):
        """Launch ``kernels[0]`` on one chunk; return the returned parameters, as a tuple.

        ``place`` is the chunk's ``(block id, shape, start)``. ``chain`` is
        the backend's ``DeviceChain`` of a fused task (see :class:`Fused`),
        or None: with it, host chunks go to the device through the chain,
        once per task, and with ``keep`` the outputs stay there, as
        intermediates of the chain.
        """
        (kernel,) = kernels
        block_id, block, start = place
        taking = [p for p in self.params if p.takes_value]
        inputs = [v for p, v in zip(taking, values) if isinstance(p, ChunkParam)]
        shape = tuple(np.broadcast_shapes(block, *(v.shape for v in inputs)))
        chunk = ChunkContext(block_id, shape, start,
                             array_module(self.cupy or any(is_cupy(v) for v in inputs)),
                             backends.for_image(kernel.images[0]), chain, keep)
        it = iter(values)
        args = [p.for_chunk(chunk, next(it)) if p.takes_value else p.for_chunk(chunk)
                for p in self.params]
        size = math.prod(shape)
        if size:
            ntasks = size if self.rank == 1 else shape
            try:
                self._launch(kernel, ntasks, chain)(*args)
            except Exception as exc:
                if hasattr(exc, "add_note"):
                    exc.add_note(
                        f"daskgpu.map_kernel: launching {self.name} on chunk "
                        f"{tuple(block_id)} of shape {shape}, offset {tuple(start)}"
                    )
                raise
        return tuple(self.params[i].result(args[i], chunk) for i in self.returns)

    def _launch(self, kernel, ntasks, chain):
        """The Launch for ``ntasks``: one per worker process and shape, kept across tasks.

        A worker may hold several copies of one kernel (from different graphs),
        whose Launch (and its fast path on device arrays) would otherwise be
        made afresh for each.
        """
        if chain is not None:  # the chain's stream: not cached
            return kernel.forall(ntasks, self.tpb, stream=chain.handle)
        return launches.get((self.ident, ntasks, self.tpb),
                            lambda: kernel.forall(ntasks, self.tpb))


#: This process's launches of map_kernel tasks (worker side), keyed by
#: ``((image hash, backend name), ntasks, tpb)``.
launches = BoundedCache(256, "map_kernel launches")


class Fused:
    """Two launches over the same chunks in one task: ``second`` reads ``first``'s output.

    ``first`` takes ``count`` of the task's values from position ``slot`` on;
    its one result takes their place among ``second``'s. The task's arguments
    start with ``first``'s kernels, then ``second``'s. On host chunks the
    intermediate stays on the GPU and every host input crosses PCIe once
    (the backend's ``device_chain()``); on CuPy chunks, and in the simulator
    (which has none), the launches simply follow each other.
    """

    __slots__ = ("first", "second", "slot", "count")
    daskgpu_launch = True  # see ChunkLaunch

    def __init__(self, first, second, slot: int, count: int):
        self.first, self.second, self.slot, self.count = first, second, slot, count

    def __reduce__(self):
        return Fused, (self.first, self.second, self.slot, self.count)

    def __repr__(self):
        return f"<map_kernel fused chunk launch of {self.__name__}>"

    @property
    def __name__(self):
        return f"{self.first.__name__}+{self.second.__name__}"

    @property
    def kernel_count(self) -> int:
        return self.first.kernel_count + self.second.kernel_count

    @property
    def cupy(self):
        return self.first.cupy or self.second.cupy

    def __call__(self, *values):
        n = self.kernel_count
        kernels, values, place = values[:n], values[n:-1], values[-1]
        chain = None
        if not (self.cupy or any(is_cupy(v) for v in values)):
            # A process builds all its images simulated or all for the GPU.
            chain = backends.for_image(kernels[-1].images[0]).device_chain()
        try:
            results = self.run(kernels, values, place, chain)
        finally:
            if chain is not None:
                chain.free()
        return results[0] if len(results) == 1 else results

    def run(self, kernels, values, place, chain=None, keep=False):
        n, end = self.first.kernel_count, self.slot + self.count
        (middle,) = self.first.run(kernels[:n], values[self.slot:end], place, chain, keep=True)
        rest = values[:self.slot] + (middle,) + values[end:]
        return self.second.run(kernels[n:], rest, place, chain, keep)
