"""Run a stencil kernel for many steps over dask arrays: :func:`iterate`.

:func:`iterate` plans the step as a map (:func:`~daskgpu._dask.map_kernel.plan.plan_map`,
one step's halo), then what the steps add (:mod:`.plan`), and builds one layer
of tasks per block of steps on the graph layer ``dask.array`` runs on here
(:mod:`.graph`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from daskgpu._dask.iterate import plan as planning
from daskgpu._dask.iterate.graph import build
from daskgpu._dask.map_kernel.api import graph_layer
from daskgpu._dask.map_kernel.plan import plan_map
from daskgpu._runtime import backends

__all__ = ["iterate"]


def iterate(kernel: Any, *args: Any, steps: int, depth: Any = None, boundary: Any = None,
            state: dict | None = None, block_steps: int | None = None, tpb: int = 0,
            name: str | None = None, token: str | None = None, grid_ndim: int | None = None,
            timeout: float | None = None, group: Any = None) -> Any:
    """Run ``kernel`` for ``steps`` steps over dask arrays, each step's outputs the next
    step's inputs; return the final states lazily.

    One step is what ``dg.map_kernel(kernel, *args, depth=depth, boundary=boundary)``
    computes. ``iterate`` runs a block of steps in each task, back to back on the
    GPU, with a halo as deep as the block needs, so that Dask exchanges halos
    once per block and its graph holds one layer of tasks per block, not per
    step. Neighbouring chunks are merged into larger ones, as ``map_kernel``
    groups them, so that fewer halos are exchanged and computed twice. Results
    equal a loop of single steps that fills the boundary before every step.

    Blocks and groups are exact only for a kernel whose results do not depend
    on where its chunk begins or ends (a stencil that reads its neighbours
    within ``depth``, with ``dg.offset`` for global coordinates). daskgpu
    reads that from the compiled kernel, as ``map_kernel`` does before it
    groups; where it cannot show it, each task runs one step over the chunks
    as given, and a ``PerformanceWarning`` says why and how to block anyway.

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        One step, from :func:`daskgpu.jit` (or :func:`daskgpu.kernel`,
        :func:`daskgpu.load`), launched over each chunk as by
        :func:`~daskgpu.map_kernel`. It writes each next state to a
        :class:`~daskgpu.Out` and should write every element of it: an output's
        buffer holds the state of two steps before when the step starts, as in
        a ping-pong loop.
    *args
        The kernel's arguments, as for :func:`~daskgpu.map_kernel`: outputs
        (``dg.Out(dtype, like=u0)``), the initial states (dask arrays), dask
        arrays that never change (a coefficient map), numbers, ``dg.offset``.
    steps : int
        How many steps to run; 0 returns the initial states.
    depth, boundary
        One step's halo, as in ``da.map_overlap`` and ``map_kernel``: ``depth``
        cells per side (an int, or per axis), ``boundary`` ``"none"`` (or
        None), ``"periodic"``, ``"reflect"``, ``"nearest"`` or a constant,
        per axis or for all. A block of ``k`` steps takes a halo ``k * depth``
        deep; its cells outside the whole array are filled again from the
        boundary after each step, so every kind gives what single steps give.
        A ``"periodic"`` halo is stepped like the chunk it copies, which is
        exact for kernels that do not read where they are: with ``dg.offset``
        and a periodic axis, blocks are one step unless ``block_steps=`` says
        otherwise.
    state : dict, optional
        Which value each state takes after a step: ``{input: source}``, the
        input a dask array parameter, the source an output or another state
        input, each by the kernel parameter's name or position. By default the
        first output feeds the first dask array argument, the second output the
        second, and so on. A wave equation ``wave(u_next, u, u_prev, c2)``
        rotates with ``state={"u": "u_next", "u_prev": "u"}``. Dask arrays that
        are no key of ``state`` never change (a coefficient map), and every
        output must feed some state.
    block_steps : int, optional
        Steps per task. None: the number that makes a step cheapest, from the
        chunks' size, the halo and Dask's per-task cost (see the guide's "Time
        steps"), at most what the smallest chunk holds as a halo; one step
        where the kernel may depend on where its chunk begins. Where
        ``steps`` is no multiple of it, the last block is shorter. A number is
        taken as given.
    group : bool or str or int, optional
        How chunks are merged, as ``map_kernel``'s ``group=``: None (the
        default) merges neighbouring chunks into groups of up to 1 GiB on the
        device (a quarter of a GPU's memory at most, a group per GPU at
        least) where the kernel cannot tell where its chunk begins; True
        merges (and blocks) whatever the kernel; a size merges into groups of
        that size; False keeps the chunks as given. The final states come in
        the chunks the steps ran on.
    tpb, name, token, grid_ndim, timeout
        As for :func:`~daskgpu.map_kernel`. ``name=`` is the key name of the last
        block's launches (the final states are trimmed from them, as a map's
        outputs with ``depth``); ``token=`` the prefix of every block's;
        ``timeout=`` limits each block's task.

    Returns
    -------
    dask.array.Array or tuple of them
        The final states, one per key of ``state`` (by default one per output),
        in the order of their parameters; one comes back bare.

    Notes
    -----
    On host (NumPy) chunks a task copies its extended chunk to the GPU once,
    runs its steps there, two buffers a state taking turns, and copies the
    states back once; CuPy chunks stay on the GPU throughout. Between blocks
    only halos move between workers. Tasks are placed, ask for device memory
    and are limited in time as a map's launches are.

    Examples
    --------
    A 1-D heat equation, periodic, 10 steps in blocks of 4:

    >>> import dask, numpy as np, dask.array as da, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit
    ... def heat(out, u, a):
    ...     i = cuda.grid(1)
    ...     if 0 < i < u.shape[0] - 1:
    ...         out[i] = u[i] + a * (u[i - 1] - 2 * u[i] + u[i + 1])
    ...     elif i < u.shape[0]:
    ...         out[i] = u[i]
    >>> u0 = da.from_array(np.eye(1, 16, 3, dtype=np.float32)[0], chunks=8)
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     u = dg.iterate(heat, dg.Out(np.float32, like=u0), u0, np.float32(0.25),
    ...                    steps=10, depth=1, boundary="periodic", block_steps=4)
    ...     u.compute().round(3)[:6]
    array([0.074, 0.12 , 0.16 , 0.176, 0.16 , 0.12 ], dtype=float32)

    Two states that rotate, a wave equation over a fixed coefficient map:

    >>> @dg.jit
    ... def wave(u_next, u, u_prev, c2):
    ...     i = cuda.grid(1)
    ...     if 0 < i < u.shape[0] - 1:
    ...         lap = u[i - 1] - 2 * u[i] + u[i + 1]
    ...         u_next[i] = 2 * u[i] - u_prev[i] + c2[i] * lap
    ...     elif i < u.shape[0]:
    ...         u_next[i] = u[i]
    >>> c2 = da.full(16, 0.25, dtype=np.float32, chunks=8)
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     u, u_prev = dg.iterate(wave, dg.Out(np.float32, like=u0), u0, u0, c2,
    ...                            steps=3, depth=1, boundary=0,
    ...                            state={"u": "u_next", "u_prev": "u"})
    ...     u.compute()[:6]
    array([ 0.015625,  0.21875 ,  0.484375, -0.4375  ,  0.484375,  0.21875 ],
          dtype=float32)
    """
    steps, block_steps = planning.check_steps(steps, block_steps)
    layer = graph_layer()
    mp = plan_map(kernel, args, depth=depth, boundary=boundary, tpb=tpb, name=name,
                  grid_ndim=grid_ndim, token=token, timeout=timeout, group=group,
                  layer=layer, group_bytes=planning.GROUP_BYTES,
                  group_spread=planning.group_spread, layout_warning=False)
    planning.check_params(mp.kernel_name, mp.params)
    feeds = planning.feeds_of(kernel, mp.params, state)
    dtypes = planning.state_dtypes(mp, feeds)
    if steps == 0:
        arrays = tuple(mp.arrays[mp.params[t].source] for t in sorted(dtypes))
        return arrays[0] if len(arrays) == 1 else arrays
    ndim = mp.ndim
    halo, bounds = layer.coerce_halo(ndim, 0 if depth is None else depth, boundary)
    one = tuple(_depth(halo[ax], ax) for ax in range(ndim))
    # No halo where one chunk spans an axis without a boundary, as after merging: nothing
    # lies beyond it, and Dask's overlap would only copy the chunk to add nothing.
    one = tuple(d if len(mp.out_chunks[ax]) > 1 or bounds[ax] != "none" else 0
                for ax, d in enumerate(one))
    fills = planning.fills_of(bounds, ndim) if any(one) else ()
    # group=True or a size: the user vouches that where a chunk begins does not matter.
    vouched = group is not None and group is not False
    if block_steps is None:
        position = planning.takes_position(mp.params) and any(
            bounds[ax] == "periodic" for ax in range(ndim))
        itemsize = sum(dt.itemsize for dt in dtypes.values())
        block = 1 if position else planning.default_block_steps(
            steps, mp.out_chunks, one, itemsize, mp.on_device)
        if block > 1 and mp.hazards and not vouched:
            planning.warn_single_steps(mp.kernel_name, mp.hazards, block)
            block = 1
    else:
        block = min(block_steps, steps)
    planning.check_block(block, mp.out_chunks, one)
    simulate = backends.current().simulated or mp.cluster.simulates
    fill_kernels = {}
    if fills and not simulate:  # simulated blocks are NumPy arrays, filled by NumPy
        from daskgpu._compiler.boundary_fill import fill_kernel

        for dt in set(dtypes.values()):
            fill_kernels[dt.str] = fill_kernel(dt, ndim, simulate)
    if mp.token is not None:  # the steps and blocks belong in the name, as the step does
        from dask.base import tokenize

        mp = replace(mp, name=f"{mp.token}-" + tokenize(mp.name, steps, block, feeds))
    plan = planning.IteratePlan(
        mp, feeds, one, dict(bounds), steps, planning.block_lengths(steps, block), fills,
        tuple(map(sum, mp.out_chunks)), fill_kernels)
    results = build(plan, layer)
    return results[0] if len(results) == 1 else results


def _depth(d, ax) -> int:
    from numbers import Integral

    if isinstance(d, bool) or not isinstance(d, Integral | np.integer) or d < 0:
        raise ValueError(f"iterate takes a non-negative integer depth per axis, got {d!r} for "
                         f"axis {ax}")
    return int(d)
