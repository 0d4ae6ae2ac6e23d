"""One :func:`~daskgpu.iterate` call, planned once on the client: :class:`IteratePlan`.

An iteration is a map (:func:`~daskgpu._dask.map_kernel.plan.plan_map` plans the
kernel's image, parameters and chunks, as for ``map_kernel`` with the step's
halo) plus what the steps add: which parameter each step's results feed
(:func:`feeds_of`), how many steps a task runs (:func:`default_block_steps`),
and which cells outside the array a block fills again after each step
(:class:`Fill`).
"""

from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass
from numbers import Integral, Number

import numpy as np

from daskgpu._dask.iterate.block_task import Fill
from daskgpu._dask.map_kernel.chunk_params import (
    ChunkParam,
    FlatChunkParam,
    OffsetParam,
    OutParam,
    StatesParam,
)
from daskgpu._dask.map_kernel.plan import MapPlan, user_level

__all__ = ["GROUP_BYTES", "IteratePlan", "PCIE_PASSES", "TASK_BYTES", "block_lengths",
           "check_block", "check_params", "check_steps", "default_block_steps",
           "exchange_tasks", "feeds_of", "fills_of", "group_spread", "state_dtypes",
           "takes_position", "warn_single_steps"]

#: A chunk's copy over PCIe, one way, costs about as long as this many passes over the
#: same bytes in the GPU's own memory (the ratio of the two bandwidths).
PCIE_PASSES = 28

#: About as many bytes as a GPU streams through its memory in the time Dask spends on
#: one task: the per-task cost, in the units of a step.
TASK_BYTES = 300e6

#: The device memory a group of merged chunks may need by default (``group=None``):
#: more than a map's groups (``daskgpu.launch-bytes``), since every group pays a halo
#: exchange per block and computes its halo again at each step. ``launch_bytes`` caps
#: it at a quarter of a worker's GPU memory; :func:`group_spread` says how many
#: groups are left at least.
GROUP_BYTES = 1 << 30


def group_spread(cluster) -> int:
    """The groups an iteration's chunks are merged into at least, by default: one per
    GPU worker (each drives one GPU), not one per thread as a map's, since a block's
    steps keep its GPU busy and a second group on the same GPU only adds a halo to
    exchange and compute; the threads where no worker offers a GPU (simulated).

    Examples
    --------
    >>> from daskgpu._dask.cluster_facts import ClusterFacts
    >>> group_spread(ClusterFacts(gpu_workers=2, threads=8))
    2
    >>> group_spread(ClusterFacts(threads=4)), group_spread(ClusterFacts())
    (4, 1)
    """
    return max(1, cluster.gpu_workers or cluster.threads)


def exchange_tasks(depth: tuple) -> int:
    """The tasks a block costs per chunk: its launch, and the halo exchange that
    ``map_overlap``'s graph makes before it, a slice of each neighbour along the axes
    with a halo and the task that joins them (``3 ** axes + 1`` in all; a chunk on
    the array's edge has fewer neighbours).

    Examples
    --------
    >>> [exchange_tasks(d) for d in ((1,), (1, 1), (0, 2, 2), (0,))]
    [4, 10, 10, 1]
    """
    axes = sum(1 for d in depth if d)
    return 3 ** axes + 1 if axes else 1


@dataclass(frozen=True, eq=False)
class IteratePlan:
    """Everything about one ``iterate`` call.

    Attributes
    ----------
    map : MapPlan
        The step as a map: its kernel, parameters, chunks and one step's halo.
    feeds : tuple of (int, int)
        ``(target, source)`` kernel parameter pairs: after a step, parameter
        ``target`` (a dask array input) holds what ``source`` (an output, or
        another state input) held.
    depth : tuple of int
        One step's halo per axis: 0 along an axis one chunk spans without a
        boundary, where nothing lies beyond the chunk.
    boundary : dict
        Per axis, as Dask coerces ``map_overlap``'s ``boundary``.
    steps : int
    blocks : tuple of int
        Steps per task, block by block (the last one shorter where ``steps`` is no
        multiple of the block).
    fills : tuple of Fill
        In axis order, what each block fills again after each of its steps.
    shape : tuple of int
        The whole array's shape.
    fill_kernels : dict
        ``{dtype string: PTXKernel}`` for the states' dtypes, where ``fills`` is not empty.
    """

    map: MapPlan
    feeds: tuple
    depth: tuple
    boundary: dict
    steps: int
    blocks: tuple
    fills: tuple
    shape: tuple
    fill_kernels: dict

    @property
    def targets(self) -> tuple:
        """The state parameters, in kernel parameter order: what ``iterate`` returns."""
        return tuple(sorted(t for t, _ in self.feeds))

    @property
    def outputs(self) -> tuple:
        """The kernel parameters that are :class:`Out`."""
        return tuple(i for i, (p, _) in enumerate(self.map.params) if isinstance(p, OutParam))


def feeds_of(kernel, params, state) -> tuple:
    """``state`` (``iterate``'s keyword) as ``(target, source)`` kernel parameter pairs.

    ``state`` maps a dask array parameter to the parameter whose value it takes
    after each step: an output (:class:`~daskgpu.Out`) or another state input,
    each given by its position among the kernel's parameters or by its name.
    None: the first output feeds the first dask array, the second the second,
    and so on.
    """
    arrays = [i for i, (p, _) in enumerate(params) if isinstance(p, ChunkParam)]
    outs = [i for i, (p, _) in enumerate(params) if isinstance(p, OutParam)]
    name = kernel.__name__
    if not outs:
        raise ValueError(f"iterate({name!r}): give the next state's output, dg.Out(dtype, "
                         "like=u0), among the kernel's arguments")
    if state is None:
        if len(arrays) < len(outs):
            raise ValueError(
                f"iterate({name!r}) has {len(outs)} outputs and {len(arrays)} dask array "
                "inputs, so each output cannot feed one; pass state={input: output} to say "
                "which input each output becomes")
        return tuple(zip(arrays, outs))
    if not isinstance(state, dict) or not state:
        raise TypeError(f"iterate(state=) takes a dict {{input: source}}, got {state!r}")
    names = getattr(kernel, "parameter_names", None)

    def position(key, what):
        if isinstance(key, str):
            if not names or key not in names:
                raise ValueError(
                    f"iterate(state=): {key!r} is no parameter of kernel {name!r}"
                    + (f" ({', '.join(names)})" if names else "; give positions instead"))
            return names.index(key)
        try:
            index = operator.index(key)
        except TypeError:
            raise TypeError(f"iterate(state=): a {what} is a parameter's name or position, "
                            f"got {key!r}") from None
        if not 0 <= index < len(params):
            raise ValueError(f"iterate(state=): kernel {name!r} has no parameter {index}")
        return index

    feeds = tuple((position(t, "state"), position(s, "source")) for t, s in state.items())
    for target, source in feeds:
        if target not in arrays:
            raise ValueError(
                f"iterate(state=): parameter {target} of {name!r} takes the next state, so "
                f"it must be a dask array input (those are parameters {arrays})")
        if source not in arrays and source not in outs:
            raise ValueError(
                f"iterate(state=): parameter {target} would take parameter {source}, which "
                f"is neither an output (parameters {outs}) nor a dask array input")
    fed = {s for _, s in feeds}
    lost = [o for o in outs if o not in fed]
    if lost:
        raise ValueError(f"iterate(state=): outputs {lost} of {name!r} feed no state; each "
                         "output must become some input's next value")
    return feeds


def check_params(kernel_name, params) -> None:
    """Refuse what a state cannot carry from step to step."""
    for i, (p, _) in enumerate(params):
        if isinstance(p, ChunkParam) and p.written:
            raise ValueError(
                f"iterate: kernel {kernel_name!r} writes its input parameter {i}; write each "
                "next state to a dg.Out instead (its old value stays the kernel's input)")
        if isinstance(p, FlatChunkParam):
            raise ValueError(
                f"iterate: kernel {kernel_name!r} sees its N-D chunks flat (a rank-1 kernel); "
                "write it over cuda.grid(ndim) with N-D arrays")
        if isinstance(p, StatesParam):
            raise ValueError(
                f"iterate: kernel {kernel_name!r} takes dg.random_states, which would give "
                "every step the same numbers; draw from states you keep as a state array")
        if isinstance(p, OutParam) and p.layout == "F":
            raise ValueError(f"iterate: kernel {kernel_name!r} takes an F-ordered output; "
                             "iterate keeps C-ordered states")


def takes_position(params) -> bool:
    """Whether the kernel reads its chunk's place (``dg.offset``)."""
    return any(isinstance(p, OffsetParam) for p, _ in params)


def fills_of(boundary: dict, ndim: int) -> tuple:
    """What a block fills again after each step, per axis: constants, reflections and
    nearest values; periodic and ``"none"`` axes need nothing (a periodic halo stays
    right as it is stepped; a ``"none"`` axis has no cells outside the array)."""
    from daskgpu._compiler.boundary_fill import CONSTANT, NEAREST, REFLECT

    fills = []
    for ax in range(ndim):
        kind = boundary[ax]
        if kind in ("none", "periodic", None):
            continue
        if kind == "reflect":
            fills.append(Fill(ax, "reflect", REFLECT, 0))
        elif kind == "nearest":
            fills.append(Fill(ax, "nearest", NEAREST, 0))
        elif isinstance(kind, Number) and not isinstance(kind, bool):
            fills.append(Fill(ax, "constant", CONSTANT, kind))
        else:
            raise ValueError(
                f"iterate takes boundary 'none', 'periodic', 'reflect', 'nearest' or a "
                f"number per axis, got {kind!r} for axis {ax}")
    return tuple(fills)


def default_block_steps(steps: int, chunks: tuple, depth: tuple, itemsize: int,
                        on_device: bool) -> int:
    """The steps a task runs by default: those that make a step cheapest on average.

    A block of ``k`` steps pays, once, the costs of its tasks (Dask's per-task
    cost, :data:`TASK_BYTES`, for each of :func:`exchange_tasks`, and for host
    chunks their copies to the GPU and back, :data:`PCIE_PASSES` each); and each
    of its steps computes its chunk
    extended by ``k * depth`` cells per side. Per step, in units of one step
    over the chunk (which reads it and writes it: two passes), that is
    ``R / k + prod(1 + 2 * k * depth / chunk)`` over the axes, with ``R`` the
    per-task cost in steps; ``k`` is the one that minimises it, at most the
    steps and at most what the smallest chunk can hold as a halo
    (``k * depth <= chunk`` on each axis).

    Examples
    --------
    >>> default_block_steps(1000, ((2048,) * 4, (2048,) * 4), (1, 1), 4, on_device=False)
    222
    >>> default_block_steps(1000, ((2048,) * 4, (2048,) * 4), (1, 1), 4, on_device=True)
    196
    >>> default_block_steps(7, ((8, 8),), (1,), 4, on_device=False)
    7
    >>> default_block_steps(10, ((100,),), (0,), 8, on_device=False)  # no halo: one task
    10
    """
    if steps <= 1:
        return max(1, steps)
    smallest = [min(c) if c else 0 for c in chunks]
    cap = steps
    for c, d in zip(smallest, depth):
        if d:
            cap = min(cap, c // d)
    cap = max(1, cap)
    if not any(depth):
        return cap
    passes = 2  # a step reads the chunk and writes its next state
    chunk_bytes = max(1, math.prod(smallest) * itemsize)
    per_task = (exchange_tasks(depth) * TASK_BYTES / chunk_bytes
                + (0 if on_device else 2 * PCIE_PASSES))
    ratio = per_task / passes

    def cost(k):
        grown = math.prod(1 + 2 * k * d / max(c, 1) for c, d in zip(smallest, depth))
        return ratio / k + grown

    return min(range(1, cap + 1), key=cost)


def warn_single_steps(kernel_name: str, hazards: tuple, block: int) -> None:
    """Say (once per call site) that ``iterate`` runs one step a task over the chunks as
    given, where blocks of ``block`` steps would have cut its tasks, and why: blocks
    and groups are exact only for a kernel that cannot tell where its chunk begins."""
    from dask.array.core import PerformanceWarning

    more = f" (and {len(hazards) - 1} more)" if len(hazards) > 1 else ""
    warnings.warn(PerformanceWarning(
        f"iterate runs {kernel_name!r} one step a task over the chunks as given, where "
        f"blocks of {block} steps would cut its tasks {block}-fold: daskgpu cannot show "
        f"that its results do not depend on where a chunk begins or ends, since it "
        f"{hazards[0]}{more}. If they do not, pass block_steps= (and group=True to merge "
        "chunks); block_steps=1 keeps one step a task and silences this"),
        stacklevel=user_level())


def block_lengths(steps: int, block: int) -> tuple:
    """Steps per task, block by block: ``block`` each, the last one shorter.

    Examples
    --------
    >>> block_lengths(10, 4), block_lengths(8, 4), block_lengths(0, 4)
    ((4, 4, 2), (4, 4), ())
    """
    full, rest = divmod(steps, block)
    return (block,) * full + ((rest,) if rest else ())


def check_steps(steps, block_steps):
    """``steps`` and ``block_steps`` as ints, or an error that says what they take."""
    if isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 0:
        raise ValueError(f"iterate takes steps=, a number of steps of at least 0, got "
                         f"{steps!r}")
    if block_steps is not None and (isinstance(block_steps, bool)
                                    or not isinstance(block_steps, Integral)
                                    or block_steps < 1):
        raise ValueError(f"iterate(block_steps=) takes a positive number of steps per task, "
                         f"or None to choose, got {block_steps!r}")
    return int(steps), None if block_steps is None else int(block_steps)


def check_block(block: int, chunks: tuple, depth: tuple) -> None:
    """Refuse a block whose halo no chunk can hold, naming the most that fits."""
    for ax, (c, d) in enumerate(zip(chunks, depth)):
        if d and c and block * d > min(c):
            raise ValueError(
                f"iterate(block_steps={block}) needs a halo of {block * d} cells on axis "
                f"{ax}, deeper than its smallest chunk ({min(c)}); use block_steps of at "
                f"most {max(1, min(c) // d)}, or larger chunks")


def state_dtypes(plan: MapPlan, feeds) -> dict:
    """``{target: dtype}`` of each state, checked against its sources' dtypes."""
    dtypes = {}
    for i, (p, source) in enumerate(plan.params):
        if isinstance(p, ChunkParam):
            dtypes[i] = np.dtype(plan.arrays[source].dtype)
        elif isinstance(p, OutParam):
            dtypes[i] = np.dtype(p.dtype)
    for target, source in feeds:
        if dtypes[target] != dtypes[source]:
            raise ValueError(
                f"iterate: parameter {target} of {plan.kernel_name!r} is {dtypes[target]} "
                f"but takes parameter {source}'s next value, which is {dtypes[source]}; give "
                "the output the state's dtype, dg.Out(u0.dtype, like=u0)")
    for target, _ in feeds:
        a = plan.arrays[plan.params[target].source]
        if a.ndim != plan.ndim or tuple(a.shape) != tuple(map(sum, plan.out_chunks)):
            raise ValueError(
                f"iterate: the state at parameter {target} has shape {a.shape}, not the "
                f"steps' shape {tuple(map(sum, plan.out_chunks))}")
    return {t: dtypes[t] for t, _ in feeds}
