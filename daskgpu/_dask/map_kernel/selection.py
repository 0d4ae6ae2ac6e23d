"""What each :func:`~daskgpu.map_kernel` task runs, planned on the client.

:func:`select_image` picks the kernel image that takes the chunks' types and
:func:`shipped` the PTX-only kernel the tasks carry; :func:`plan_params` asks
every argument's kind (:mod:`daskgpu._dask.map_kernel.arg_kinds`) for its kernel
parameters (:mod:`daskgpu._dask.map_kernel.chunk_params`).
:func:`fuse` runs the launches of an earlier ``map_kernel`` whose result is
read here in the same tasks: each ``map_kernel`` whose one result is an
aligned output without halos records how it was made in :data:`chains`, a
bounded registry keyed by the result's name (nothing is stored on the dask
array). The graph is built in :mod:`daskgpu._dask.map_kernel.api`.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

from daskgpu._dask.map_kernel.arg_kinds import OffsetKind, Planning
from daskgpu._errors import CompileError
from daskgpu._image.ptx import shared_memory
from daskgpu._runtime import dispatch
from daskgpu._runtime.kernel_kinds import KernelKind, kind_of
from daskgpu._runtime.ptx_kernel import PTXKernel

__all__ = ["Selected", "check_block_size", "check_kernel", "plan_params", "select_image",
           "shipped"]


def check_kernel(kernel) -> None:
    """Refuse anything but a daskgpu kernel, with the fix for a Numba dispatcher."""
    kind = kind_of(kernel)
    if kind in (KernelKind.KERNEL, KernelKind.PTX):
        return
    hint = ""
    if kind is KernelKind.DISPATCHER:
        hint = " Wrap a numba.cuda.jit dispatcher with dg.kernel(dispatcher) first."
    raise TypeError(
        "map_kernel takes a daskgpu kernel (made by dg.jit or dg.kernel, or loaded "
        f"by dg.load), got {type(kernel).__name__}.{hint}"
    )


class Selected(NamedTuple):
    """The image a map runs, the rank of its launch grid, and whether it takes flat chunks."""

    image: Any
    rank: int
    #: The kernel takes the N-D chunks as flat 1-D arrays (a rank-1 kernel over N-D chunks).
    flat: bool


def select_image(kernel, roles, arrays, ndim, grid_ndim) -> Selected:
    """The image that takes the chunks' types, the rank of its grid, and the chunks' form.

    Over N-D chunks a rank-1 kernel (``grid_ndim=1``, or ``cuda.grid(1)`` in
    its code) sees its chunks and aligned outputs as flat 1-D arrays when it
    takes 1-D arrays there (its signature says so, or a lazy kernel types with
    them); one that indexes them in N-D (``x[i, j]``) gets them N-D. A lazy
    kernel is compiled only where no image it has takes either form.
    """
    _check_count(kernel, roles, ndim)
    forms = _forms(kernel, ndim, grid_ndim)
    candidates = [(flat, _examples(roles, ndim, flat)) for flat in forms]
    image, flat = _compiled(kernel, candidates, grid_ndim)
    if image is None:
        image, flat = _compile(kernel, candidates, grid_ndim)
    if flat:
        rank = 1
    elif grid_ndim is None:
        rank = image.grid_ndim or 1
    else:
        rank = operator.index(grid_ndim)
    if rank not in (1, ndim) or not 1 <= rank <= 3:
        raise ValueError(
            f"kernel {kernel.__name__!r} launches a {rank}-D grid over {ndim}-D chunks; "
            f"map_kernel launches 1-D over the chunk's elements or {ndim}-D over its "
            "shape (up to 3-D). Pass grid_ndim=1 to index the chunk's flat elements."
        )
    return Selected(image, rank, flat)


def check_block_size(kernel_name, image, tpb) -> None:
    """Refuse to choose the block size of a kernel whose shared memory is sized for one.

    ``map_kernel`` without ``tpb=`` takes the occupancy API's block size, which
    differs between devices (and the simulator): a ``cuda.shared.array`` of a
    constant shape, sized for the block the kernel was written for, would
    then be overrun silently. Its tasks pass no dynamic shared memory at all.
    """
    static, dynamic = shared_memory(image.ptx[0][1])  # every target's PTX declares the same
    if dynamic:
        raise ValueError(
            f"kernel {kernel_name!r} uses dynamic shared memory (cuda.shared.array(0, ...)), "
            "sized at launch, and map_kernel launches with none; give the array a constant "
            "shape and pass tpb= the block size it is sized for"
        )
    if static and not tpb:
        raise ValueError(
            f"kernel {kernel_name!r} declares {static} bytes of static shared memory "
            "(cuda.shared.array of a constant shape), sized for the block it was written "
            "for, and map_kernel would choose the block size; pass tpb= that block size, "
            "e.g. map_kernel(..., tpb=64)"
        )


def _check_count(kernel, roles, ndim) -> None:
    """Refuse arguments that are not as many as the kernel's parameters, naming ``dg.Out``.

    Forgetting an output is the usual cause: a kernel's outputs are among its
    parameters, and ``map_kernel`` allocates them only where a :class:`Out` stands.
    """
    given = sum(role.width(ndim) for role in roles)
    names = _parameter_names(kernel)
    # Numba makes each parameter of the Python function one of the kernel's.
    takes = {len(im.args) for im in kernel.images} if names is None else {len(names)}
    if not takes or given in takes:
        return
    count = sorted(takes)[0]
    listed = f" ({', '.join(names)})" if names is not None and len(names) == count else ""
    got = ", ".join(role.label for role in roles)
    offsets = (f"; dg.offset stands for {ndim} parameters, one int64 per dimension"
               if any(isinstance(role, OffsetKind) for role in roles) and ndim > 1 else "")
    hint = ""
    if given < count:
        writes = sorted({i for im in kernel.images if len(im.args) == count for i in im.writes})
        which = [repr(names[i]) if listed else f"parameter {i}" for i in writes]
        where = f" ({', '.join(which)})" if which else ""
        hint = (f". A kernel's outputs are parameters too: pass dg.Out(dtype, like=x) in "
                f"the place of each array it writes{where}, e.g. "
                f"dg.map_kernel({kernel.__name__}, dg.Out(np.float32, like=x), ...)")
    raise TypeError(
        f"kernel {kernel.__name__!r} takes {count} parameters{listed}, but map_kernel got "
        f"{given} ({got}{offsets}){hint}"
    )


def _parameter_names(kernel):
    """The names of the kernel's parameters, from its Python function; None without one
    (a kernel loaded from a file)."""
    names = getattr(kernel, "parameter_names", None)
    return None if names is None else list(names)


def _forms(kernel, ndim, grid_ndim) -> tuple:
    """Which forms of the chunks to try, first one first: ``True`` for flat, ``False`` N-D."""
    if ndim == 1 or grid_ndim not in (None, 1):
        return (False,)
    hint = grid_ndim
    if hint is None and getattr(kernel, "py_func", None) is not None:
        from daskgpu._compiler.analysis import grid_rank_hint  # client side: numba is here

        hint = grid_rank_hint(kernel.py_func)
    if hint is None:
        return (False, True)
    return (True, False) if hint == 1 else (False,)


def _takes_flat(image, grid_ndim) -> bool:
    """Whether ``image``, typed for flat chunks, is a rank-1 kernel."""
    return grid_ndim == 1 or (image.grid_ndim or 1) == 1


def _compiled(kernel, candidates, grid_ndim):
    """An image the kernel already has for one of the candidates, compiling nothing."""
    for flat, examples in candidates:
        try:
            image = dispatch.select_image(kernel.__name__, kernel.images, examples, unsafe=False)
        except TypeError:
            continue
        if not flat or _takes_flat(image, grid_ndim):
            return image, flat
    return None, False


def _compile(kernel, candidates, grid_ndim):
    """The image for the first candidate the kernel takes (a lazy kernel compiles it)."""
    first = None
    for flat, examples in candidates:
        try:
            image = kernel.select_image(examples)
        except (TypeError, CompileError) as exc:
            first = first or exc
            continue
        if not flat or _takes_flat(image, grid_ndim):
            return image, flat
    if isinstance(first, CompileError):
        raise first
    raise TypeError(
        "map_kernel passes each chunk as a C-contiguous array of its dask array's "
        "dtype and rank (a rank-1 kernel over N-D chunks may take them flat, 1-D), and "
        f"dg.offset as int64 (one per dimension).\n{first}"
    ) from None


def _examples(roles, ndim, flat=False):
    """One argument per kernel parameter that has the chunk's type (1-D where ``flat``)."""
    return tuple(v for role in roles for v in role.examples(ndim, flat))


def shipped(kernel, image, simulate: bool) -> PTXKernel:
    """The PTX-only kernel holding just ``image``; with its Python function for ``simulate``.

    ``simulate``: this process or the cluster's workers run kernels in the simulator.
    """
    if isinstance(kernel, PTXKernel):
        ptx = kernel
    else:
        ptx = kernel.ptx_kernel(with_function=simulate)
    images = tuple(im for im in ptx.images if im == image)
    # An image without its Python function (a loaded bundle) runs on GPUs only.
    if simulate and images[0].py_func is None:
        raise TypeError(
            f"kernel {ptx.__name__!r} was loaded without its Python function, so it "
            "cannot run in the CUDA simulator, where this process or the cluster's workers "
            "run kernels (daskgpu.simulate); run it on GPU workers with daskgpu.simulate "
            "off, or map the client kernel (dg.jit) instead"
        )
    return PTXKernel(images)


def plan_params(kernel_name, image, roles, arrays, out_chunks, simulate: bool, flat=False):
    """What each kernel parameter is per chunk, and which of them a task returns.

    Each argument's kind plans its own parameters
    (:mod:`daskgpu._dask.map_kernel.arg_kinds`). With ``flat``, chunks and aligned
    outputs are passed as flat 1-D arrays. Returns ``(plan, returns)``: one
    :class:`~daskgpu._dask.map_kernel.arg_kinds.Planned` per kernel parameter
    (``dg.offset`` is one per axis), and an
    :class:`~daskgpu._dask.map_kernel.arg_kinds.Result` for each output, then for
    each dask input the kernel writes.
    """
    planning = Planning(kernel_name, frozenset(image.writes), out_chunks, simulate, flat,
                        arrays)
    ndim = len(out_chunks)
    plan, outputs, written = [], [], []
    for role in roles:
        index = len(plan)
        step = role.plan(image.args[index:index + role.width(ndim)], index, planning)
        plan += step.planned
        outputs += [step.output] if step.output is not None else []
        written += [step.written] if step.written is not None else []
    returns = outputs + written
    if not returns:
        raise ValueError(
            f"kernel {kernel_name!r} has nothing to return: give an output "
            "dg.Out(dtype, like=x), or pass a dask array that the kernel writes"
        )
    return tuple(plan), tuple(returns)
