"""What one :func:`~daskgpu.map_kernel` task runs on a worker: a launch per chunk.

A task holds a :class:`ChunkLaunch`, the PTX-only kernel plus a plain
description of its parameters (their kinds are the constants below), so a
worker needs no compiler and no Python function. :class:`Fused` runs two
chained launches in one task, the intermediate staying on the GPU. The graph
around them is built in :mod:`daskgpu._dask.mapping`.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from daskgpu._image.array_info import Zeroed
from daskgpu._runtime.launch import unwrap

# Parameter kinds of a ChunkLaunch; CHUNK, WHOLE and VALUE take a task argument.
CHUNK, OUT, WHOLE, VALUE, OFFSET = "chunk", "out", "whole", "value", "offset"
# A per-chunk output (dg.Out(dtype, per_chunk=shape)) and random states (dg.random_states).
PER_CHUNK, RANDOM = "per_chunk", "random"


def is_cupy(value) -> bool:
    return type(value).__module__.partition(".")[0] == "cupy"


def _array_module(use_cupy: bool):
    if use_cupy:
        import cupy

        return cupy
    return np


class ChunkLaunch:
    """Launch a PTX-only kernel on one chunk: a small, picklable callable.

    Parameters
    ----------
    kernel : PTXKernel
        Holds exactly the image selected on the client.
    params : tuple
        One ``(kind, a, b)`` per kernel parameter: ``(CHUNK, layout, written)``,
        ``(OUT, dtype, layout)``, ``(WHOLE, written, None)``, ``(VALUE, None,
        None)``, ``(OFFSET, axis, None)``, ``(PER_CHUNK, (dtype, shape,
        fill), layout)`` or ``(RANDOM, seed, states kernel)``.
    returns : tuple of int
        The parameters returned, in order: outputs, then written dask inputs.
    rank : int
        Launch rank: 1 for ``ntasks = chunk.size``, else ``ntasks = chunk.shape``.
    chunks : tuple of tuple of int
        The output's chunks (with halos, when ``depth`` is given): an ``OUT``
        is allocated in the shape of its block, so outputs need no task of
        their own.
    starts, depth, edge_halo
        Per axis: chunk start indices in the aligned array, halo depth, and
        whether the first chunk also has a halo (a boundary other than
        ``"none"``); together they give :data:`offset`.
    cupy : bool
        Allocate outputs with CuPy even when no chunk argument is a CuPy array.
    """

    __slots__ = ("kernel", "params", "returns", "rank", "tpb", "chunks", "starts", "depth",
                 "edge_halo", "cupy", "ident")

    def __init__(self, kernel, params, returns, rank, tpb, chunks, starts, depth, edge_halo,
                 cupy, ident=None):
        self.kernel, self.params, self.returns = kernel, params, returns
        self.rank, self.tpb, self.chunks = rank, tpb, chunks
        self.starts, self.depth, self.edge_halo = starts, depth, edge_halo
        self.cupy = cupy
        # The image's hash and whether it is simulated, read once on the client:
        # hashing the PTX again in every task would cost more than the cache saves.
        image = kernel.images[0]
        self.ident = ident or (image.hash, image.py_func is not None)

    def __reduce__(self):
        return ChunkLaunch, (self.kernel, self.params, self.returns, self.rank, self.tpb,
                              self.chunks, self.starts, self.depth, self.edge_halo, self.cupy,
                              self.ident)

    def __repr__(self):
        return f"<map_kernel chunk launch of {self.kernel.__name__}>"

    @property
    def __name__(self):
        return self.kernel.__name__

    def offsets(self, block_id) -> tuple:
        out = []
        for axis, b in enumerate(block_id):
            start = self.starts[axis][b]
            if b > 0 or self.edge_halo[axis]:
                start -= self.depth[axis]
            out.append(np.int64(start))
        return tuple(out)

    def __call__(self, *values, block_id):
        results = self.run(values, block_id)
        return results[0] if len(results) == 1 else results

    def run(self, values, block_id, chain=None, keep=False):
        """Launch on one chunk; return the returned parameters, as a tuple.

        ``chain`` is the :class:`~daskgpu._runtime.staging.DeviceChain` of a
        fused task (see :class:`Fused`), or None: with it, host chunks go to
        the device through the chain, once per task, and with ``keep`` the
        outputs stay there, as intermediates of the chain.
        """
        # A lone per-chunk result's block ids also count its own new axes.
        block_id = block_id[:len(self.chunks)]
        block = tuple(c[b] for c, b in zip(self.chunks, block_id))
        inputs = [v for (kind, _, _), v in zip(self._taking(), values) if kind == CHUNK]
        xp = _array_module(self.cupy or any(is_cupy(v) for v in inputs))
        shape = np.broadcast_shapes(block, *(v.shape for v in inputs))
        offsets = self.offsets(block_id)
        args, it = [], iter(values)
        for kind, a, b in self.params:
            if kind == OFFSET:
                args.append(offsets[a])
            elif kind == OUT:
                if chain is not None and keep:
                    args.append(chain.zeros(block, a, "F" if b == "F" else "C"))
                else:
                    args.append(_fresh(xp, block, a, b, 0))
            elif kind == PER_CHUNK:
                args.append(_fresh(xp, a[1], a[0], b, a[2]))
            elif kind == RANDOM:
                args.append(self._states(a, b, block_id, shape))
            else:
                value = next(it)
                if kind == CHUNK and chain is not None and not b:
                    # An intermediate of the chain is already on the device.
                    if isinstance(value, np.ndarray):
                        value = chain.to_device(_prepared(kind, a, b, value, xp))
                    args.append(value)
                else:
                    args.append(_prepared(kind, a, b, value, xp))
        size = math.prod(shape)
        if size:
            ntasks = size if self.rank == 1 else tuple(shape)
            try:
                self._launch(ntasks, chain)(*args)
            except Exception as exc:
                if hasattr(exc, "add_note"):
                    exc.add_note(
                        f"daskgpu.map_kernel: launching {self.kernel.__name__} on chunk "
                        f"{tuple(block_id)} of shape {tuple(shape)}, offset "
                        f"{tuple(int(o) for o in offsets)}"
                    )
                raise
        lead = (1,) * len(block)  # a per-chunk output is one block of the result
        return tuple(
            unwrap(args[i]).reshape(lead + self.params[i][1][1])
            if self.params[i][0] == PER_CHUNK else unwrap(args[i])
            for i in self.returns
        )

    def _launch(self, ntasks, chain):
        """The Launch for ``ntasks``: one per worker process and shape, kept across tasks.

        Every task unpickles its own PTXKernel, whose Launch (and its fast
        path on device arrays) would otherwise be made afresh per chunk.
        """
        if chain is not None:  # the chain's stream: not cached
            return self.kernel.forall(ntasks, self.tpb, stream=chain.handle)
        return launches.get((self.ident, ntasks, self.tpb),
                            lambda: self.kernel.forall(ntasks, self.tpb))

    def _taking(self):
        """The parameters that take a task argument, in order."""
        return [p for p in self.params if p[0] in (CHUNK, WHOLE, VALUE)]

    def _states(self, seed, builder, block_id, shape):
        """This launch's random states: element ``i`` gets the state of its global flat index."""
        from daskgpu._runtime.random_states import build

        full = tuple(sum(c) for c in self.chunks)  # random states refuse halos
        strides = tuple(math.prod(full[ax + 1:]) for ax in range(len(full)))
        base = sum(self.starts[ax][b] * st for ax, (b, st) in enumerate(zip(block_id, strides)))
        return build(seed, base, tuple(shape), strides, builder)


class _LaunchCache:
    """Launches of map_kernel tasks, keyed by ((image hash, simulated), ntasks, tpb).

    Bounded by ``size``; a full cache starts afresh, which, unlike evicting
    one entry, is safe while other threads use the launches it held.
    """

    def __init__(self, size: int = 256):
        self.size = size
        self._launches = {}
        self._lock = threading.Lock()

    def get(self, key, make):
        launch = self._launches.get(key)
        if launch is None:
            launch = make()
            with self._lock:
                if len(self._launches) >= self.size:
                    self._launches.clear()
                self._launches[key] = launch
        return launch

    def clear(self) -> None:
        with self._lock:
            self._launches.clear()


#: This process's launches of map_kernel tasks (worker side).
launches = _LaunchCache()


class Fused:
    """Two launches over the same chunks in one task: ``second`` reads ``first``'s output.

    ``first`` takes ``count`` of the task's values from position ``slot`` on;
    its one result takes their place among ``second``'s. On host chunks the
    intermediate stays on the GPU and every host input crosses PCIe once
    (a :class:`~daskgpu._runtime.staging.DeviceChain`); on CuPy chunks, and in
    the simulator, the launches simply follow each other.
    """

    __slots__ = ("first", "second", "slot", "count")

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
    def kernel(self):  # the last launch's, for the names of errors and tasks
        return self.second.kernel

    @property
    def cupy(self):
        return self.first.cupy or self.second.cupy

    def __call__(self, *values, block_id):
        chain = None
        if not (self.cupy or self._simulated() or any(is_cupy(v) for v in values)):
            from daskgpu._runtime.launcher import stager
            from daskgpu._runtime.staging import DeviceChain

            chain = DeviceChain(stager)
        try:
            results = self.run(values, block_id, chain)
        finally:
            if chain is not None:
                chain.free()
        return results[0] if len(results) == 1 else results

    def _simulated(self) -> bool:
        # A process builds all its images simulated or all for the GPU.
        return self.kernel.images[0].py_func is not None

    def run(self, values, block_id, chain=None, keep=False):
        end = self.slot + self.count
        (middle,) = self.first.run(values[self.slot:end], block_id, chain, keep=True)
        rest = values[:self.slot] + (middle,) + values[end:]
        return self.second.run(rest, block_id, chain, keep)


def _fresh(xp, shape, dtype, layout, fill):
    """A new output of ``shape`` filled with ``fill``; NumPy zeros are filled on the GPU."""
    order = "F" if layout == "F" else "C"
    if xp is not np:
        if fill == 0:  # a memset, not a fill kernel
            return xp.zeros(shape, dtype=dtype, order=order)
        return xp.full(shape, fill, dtype=dtype, order=order)
    if fill == 0:
        # Zero-filled on the GPU by the launch, not copied there.
        return Zeroed(np.empty(shape, dtype=dtype, order=order))
    return np.full(shape, fill, dtype=dtype, order=order)


def _prepared(kind, a, b, value, xp):
    """A task argument as the kernel parameter ``(kind, a, b)`` takes it."""
    if kind == CHUNK:
        if b:  # written: never touch the user's chunk, dask may share it
            return xp.array(value, order="F" if a == "F" else "C", copy=True)
        if a == "C" and not value.flags.c_contiguous:
            return xp.ascontiguousarray(value)
        if a == "F" and not value.flags.f_contiguous:
            return xp.asfortranarray(value)
    elif kind == WHOLE and a:
        return value.copy()
    return value
