"""What one :func:`~daskgpu.iterate` task runs on a worker: a block of steps on one chunk.

A :class:`BlockLaunch` advances its chunk, extended by a halo as deep as its
steps need, ``steps`` steps: each step is the map's own
:class:`~daskgpu._dask.map_kernel.chunk_task.ChunkLaunch` on the states the
step before left, the launches queued back to back on one stream. On host
chunks the states stay on the GPU for the whole block (the backend's device
chain: each chunk crosses PCIe once each way), two buffers a state taking
turns; CuPy chunks are on the device already. Cells of the halo outside the
whole array are filled again from the boundary after each step
(:mod:`daskgpu._compiler.boundary_fill`), as a loop of single steps would fill
them. The task returns the states after the block, halo included: the graph
trims them as it trims a map's outputs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from daskgpu._dask.map_kernel.arrays import array_module, is_cupy
from daskgpu._dask.map_kernel.chunk_params import ChunkContext
from daskgpu._dask.map_kernel.chunk_task import ChunkMemory, launches
from daskgpu._runtime import backends, faults
from daskgpu._runtime.launch import unwrap
from daskgpu._runtime.launch_task import LaunchTask

__all__ = ["BlockLaunch", "Fill", "fill_host"]


class Fill(NamedTuple):
    """Cells outside the whole array along ``axis`` that a block fills again after each
    step: ``kind`` is the boundary (``"constant"``, ``"reflect"``, ``"nearest"``),
    ``mode`` its number for the fill kernel (:mod:`daskgpu._compiler.boundary_fill`),
    ``value`` the constant."""

    axis: int
    kind: str
    mode: int
    value: object


def fill_host(array: np.ndarray, fill: Fill, lo: int, hi: int) -> None:
    """What the fill kernel does, on a host array: cells before ``lo`` and from ``hi`` on
    along the fill's axis take the boundary's values, as Dask's ``map_overlap`` pads.

    Examples
    --------
    >>> a = np.array([9, 9, 1, 2, 3, 9], dtype=np.int64)
    >>> fill_host(a, Fill(0, "reflect", 1, 0), 2, 5); a
    array([2, 1, 1, 2, 3, 3])
    >>> fill_host(a, Fill(0, "constant", 0, 7), 2, 5); a
    array([7, 7, 1, 2, 3, 7])
    """
    ax, n = fill.axis, array.shape[fill.axis]

    def cells(start, stop):
        return (slice(None),) * ax + (slice(start, stop),)

    if fill.kind == "constant":
        array[cells(0, lo)] = fill.value
        array[cells(hi, n)] = fill.value
    elif fill.kind == "nearest":
        array[cells(0, lo)] = array[cells(lo, lo + 1)]
        array[cells(hi, n)] = array[cells(hi - 1, hi)]
    else:  # reflect: the edge element repeated, cell lo - 1 - j = cell lo + j
        if lo:
            array[cells(0, lo)] = np.flip(array[cells(lo, 2 * lo)], axis=ax)
        if hi < n:
            array[cells(hi, n)] = np.flip(array[cells(2 * hi - n, hi)], axis=ax)


class BlockLaunch(LaunchTask):
    """Run ``steps`` steps of a kernel on one chunk: a small, picklable callable.

    Called as a ``map_kernel`` chunk launch is (through
    :func:`~daskgpu._dask.map_kernel.chunk_task.run_chunk`): the task's values,
    then the chunk's place. The scheduler's placement, memory asks and time
    limit read it as they read a map's launch.

    Parameters
    ----------
    step : ChunkLaunch
        One step: the map's launch, its outputs taken as values (each step gets
        the buffer it writes) and returned.
    slots : tuple
        Per value the step takes, in order: ``("state", p)``, the current value
        of kernel parameter ``p`` (a state input, or an output's buffer);
        ``("chunk", i)``, the task's value ``i``, a chunk that never changes
        (on host chunks copied to the device once); ``("task", i)``, the task's
        value ``i`` as it is (a number, a whole array).
    initial : tuple of (int, int)
        ``(parameter, i)``: each state's value before the block is the task's value ``i``.
    feeds : tuple of (int, int)
        After a step, parameter ``target`` takes what ``source`` held.
    outputs : tuple of int
        The kernel parameters that are outputs (the step's returns, in order).
    finals : tuple of int
        The state parameters the task returns, in order.
    steps : int
    dtypes : dict
        ``{parameter: dtype string}`` of each state and output.
    fills : tuple of Fill
        What is filled again after each step (see :func:`.plan.fills_of`).
    fill_kernels : dict
        ``{dtype string: PTXKernel}``, the fill kernel of each state dtype.
    shape : tuple of int
        The whole array's shape: which cells of a block lie outside it.
    timeout : float or None
    memory : ChunkMemory
    """

    __slots__ = ("step", "slots", "initial", "feeds", "outputs", "finals", "steps", "dtypes",
                 "fills", "fill_kernels", "shape", "timeout", "memory")

    def __init__(self, step, slots, initial, feeds, outputs, finals, steps, dtypes, fills,
                 fill_kernels, shape, timeout=None, memory=None):
        self.step, self.slots, self.feeds = step, tuple(slots), tuple(feeds)
        self.initial = tuple(initial)
        self.outputs, self.finals, self.steps = tuple(outputs), tuple(finals), int(steps)
        self.dtypes, self.fills, self.fill_kernels = dict(dtypes), tuple(fills), fill_kernels
        self.shape, self.timeout = tuple(shape), timeout
        self.memory = ChunkMemory() if memory is None else ChunkMemory(*memory)

    def __reduce__(self):
        return BlockLaunch, (self.step, self.slots, self.initial, self.feeds, self.outputs,
                             self.finals, self.steps, self.dtypes, self.fills, self.fill_kernels,
                             self.shape, self.timeout, tuple(self.memory))

    @property
    def kernel(self):
        return self.step.kernel

    @property
    def kernel_name(self) -> str:
        return self.step.kernel.__name__

    @property
    def __name__(self):
        return self.kernel_name

    def __repr__(self):
        return f"<iterate block of {self.steps} steps of {self.kernel_name}>"

    def device_bytes(self, block=None, argument_bytes=0) -> int:
        """The device memory the block needs: its states twice over (each step writes
        the next while reading the last) and the arrays that never change."""
        return self.memory.most if block is None else self.memory.for_block(block)

    def __call__(self, *values):
        values, place = values[:-1], values[-1]
        chunks = [values[i] for kind, i in self.slots if kind == "chunk"]
        chunks += [values[i] for _, i in self.initial]
        on_device = self.step.cupy or any(is_cupy(v) for v in chunks)
        backend = backends.for_image(self.step.kernel.images[0])
        chain = None if on_device else backend.device_chain(f"{self.kernel_name} block")
        try:
            states = self._run(values, place, chain, array_module(on_device))
            if chain is not None:
                states = [chain.to_host(s) if not isinstance(s, np.ndarray) else s
                          for s in states]
        finally:
            if chain is not None:
                chain.free()
        return states[0] if len(states) == 1 else tuple(states)

    def _run(self, values, place, chain, xp) -> list:
        """The block's steps; the final states, on the device where the chain keeps them.

        The kernel's arguments are made once, as the map's chunk launch makes them
        (each parameter's ``for_chunk``), and one launch runs every step: from the
        second step on, only the states' and outputs' arguments change, and a launch
        repeated on device arrays takes the runtime's fast path.
        """
        block_id, block, start, members = place
        state = {p: values[i] for p, i in self.initial}
        fixed = {i: values[i] for kind, i in self.slots if kind != "state"}
        ours = set()  # ids of the buffers this task made: only those are written
        if chain is not None:  # on the device for the whole block, copied in once
            for p, v in state.items():
                if isinstance(v, np.ndarray):
                    state[p] = chain.to_device(np.ascontiguousarray(v))
                    ours.add(id(state[p]))
            for kind, i in self.slots:
                if kind == "chunk" and isinstance(fixed[i], np.ndarray):
                    fixed[i] = chain.to_device(np.ascontiguousarray(fixed[i]))
        step = self.step
        chunks = [state[i] if kind == "state" else fixed[i] for kind, i in self.slots
                  if kind == "chunk" or (kind == "state" and i in state)]
        shape = tuple(np.broadcast_shapes(tuple(block), *(tuple(c.shape) for c in chunks)))
        chunk = ChunkContext(block_id, shape, start, xp,
                             backends.for_image(step.kernel.images[0]), chain, True)
        launch, args, fill_launches = None, None, {}
        spare = []  # buffers no state holds any more: the next step's outputs
        with faults.in_chunk(self.kernel_name, block_id, shape, start, members):
            for _ in range(self.steps):
                buffers = {p: self._buffer(spare, ours, p, shape, chain, xp)
                           for p in self.outputs}
                if args is None:
                    taken = iter(state[i] if kind == "state" and i in state else
                                 buffers[i] if kind == "state" else fixed[i]
                                 for kind, i in self.slots)
                    args = [p.for_chunk(chunk, next(taken)) if p.takes_value
                            else p.for_chunk(chunk) for p in step.params]
                    launch = self._step_launch(shape, chain)
                else:
                    for p, v in (*state.items(), *buffers.items()):
                        args[p] = v
                if math.prod(shape):
                    launch(*args)
                for p in self.outputs:
                    self._fill(buffers[p], self.dtypes[p], shape, start, chain, fill_launches)
                current = {**state, **buffers}
                nxt = {target: current[source] for target, source in self.feeds}
                # What no state holds any more is the next step's output buffer, if this
                # task made it; two states may hold one buffer (a state fed by another,
                # or one chunk given twice).
                held = {id(v) for v in nxt.values()} | {id(v) for v in spare}
                for v in current.values():
                    if id(v) not in held and id(v) in ours:
                        spare.append(v)
                        held.add(id(v))
                state = nxt
        return [unwrap(state[p]) for p in self.finals]

    def _step_launch(self, shape, chain):
        """The one launch of the block's steps: on the chain's stream, or the process's
        launch of the kernel for this shape (kept across tasks, as a map's chunk launch
        keeps it)."""
        step = self.step
        ntasks = math.prod(shape) if step.rank == 1 else shape
        if chain is not None:
            return step.kernel.forall(ntasks, step.tpb, stream=chain.handle)
        return launches.get((step.ident, ntasks, step.tpb),
                            lambda: step.kernel.forall(ntasks, step.tpb))

    def _buffer(self, spare, ours, param, shape, chain, xp):
        """An output buffer for ``param``: a spare one of its dtype, else a new one, zeroed."""
        dtype = np.dtype(self.dtypes[param])
        for k, b in enumerate(spare):
            if np.dtype(b.dtype) == dtype and tuple(b.shape) == tuple(shape):
                return spare.pop(k)
        if chain is not None:
            new = chain.zeros(tuple(shape), dtype, "C")
        else:
            new = xp.zeros(tuple(shape), dtype=dtype)
        ours.add(id(new))
        return new

    def _fill(self, array, dtype, block, start, chain, made) -> None:
        """Give ``array``'s cells outside the whole array their boundary values again: on
        the device by the fill kernel, in the chain's stream; on the host (where the
        simulator keeps the block) with NumPy. ``made`` keeps the block's fill launches,
        one per dtype and side, so that each step repeats them."""
        if not self.fills:
            return
        if isinstance(array, np.ndarray):
            for fill in self.fills:
                ax = fill.axis
                fill_host(array, fill, max(0, -start[ax]),
                          min(block[ax], self.shape[ax] - start[ax]))
            return
        kernel = self.fill_kernels.get(np.dtype(dtype).str)
        if kernel is None:
            raise RuntimeError(
                f"iterate({self.kernel_name!r}) was built for simulated workers, whose "
                "blocks are NumPy arrays, and runs on a GPU, which fills its boundary with "
                "a kernel the client did not compile; build it with daskgpu.simulate off "
                "and no simulated workers")
        value_type = np.dtype(dtype).type
        for fill in self.fills:
            ax = fill.axis
            lo = max(0, -start[ax])
            hi = min(block[ax], self.shape[ax] - start[ax])
            for first, count in ((0, lo), (hi, block[ax] - hi)):
                if count <= 0:
                    continue
                ntasks = tuple(count if a == ax else n for a, n in enumerate(block))
                ntasks = ntasks[0] if len(ntasks) == 1 else ntasks
                key = (np.dtype(dtype).str, ntasks)
                if key not in made:
                    made[key] = self._fill_launch(kernel, ntasks, chain)
                made[key](array, ax, first, count, lo, hi, fill.mode, value_type(fill.value))

    @staticmethod
    def _fill_launch(kernel, ntasks, chain):
        if chain is not None:  # the chain's stream, after the step that wrote the array
            return kernel.forall(ntasks, 0, stream=chain.handle)
        image = kernel.images[0]
        return launches.get(((image.hash, backends.for_image(image).name), ntasks, 0),
                            lambda: kernel.forall(ntasks, 0))
