"""What a user passed as a kernel, told in one place.

Every entry point that takes a kernel (``dg.save``, ``map_kernel``,
``run_batch``, the ``daskgpu`` command) asks :func:`kind_of` what it was
given, then turns it into what daskgpu launches
(:func:`daskgpu._compiler.as_kernel.as_kernel` on the client) or refuses it
with its own fix. The kinds daskgpu defines are told by their types; a Numba
dispatcher, whose type this half of the package may not import (the worker
half never imports numba), by the one attribute probe of the house
(:func:`_numba_dispatcher`).
"""

from __future__ import annotations

import enum
import inspect
import os

from daskgpu._runtime.launch import Launch, LaunchAPI
from daskgpu._runtime.ptx_kernel import PTXKernel

__all__ = ["KernelKind", "kind_of"]


class KernelKind(enum.Enum):
    """The kinds of object a user passes where a kernel is wanted, each as errors name it."""

    #: A client kernel, compiled here: ``dg.jit``, ``dg.kernel``, ``kernel.specialize``.
    KERNEL = "a daskgpu kernel"
    #: Compiled images only: ``dg.load``, or a kernel unpickled on a worker.
    PTX = "a PTX-only kernel"
    #: A kernel with its launch configuration: ``kernel[griddim, blockdim]``,
    #: ``configure``, ``forall``.
    LAUNCH = "a configured launch"
    #: A ``numba.cuda.jit`` dispatcher.
    DISPATCHER = "a numba.cuda.jit dispatcher"
    #: A plain Python function in Numba's CUDA dialect.
    FUNCTION = "a plain Python function"
    #: The path of a kernel bundle (``dg.save``).
    BUNDLE = "the path of a kernel bundle"
    #: Anything else.
    OTHER = "no kernel"


def kind_of(obj) -> KernelKind:
    """The :class:`KernelKind` of ``obj``.

    Examples
    --------
    >>> kind_of("saxpy.dgk").name, kind_of(len).name, kind_of(42).value
    ('BUNDLE', 'OTHER', 'no kernel')
    >>> def double(out, x):
    ...     out[0] = 2 * x[0]
    >>> kind_of(double).name
    'FUNCTION'
    """
    if isinstance(obj, PTXKernel):
        return KernelKind.PTX
    if isinstance(obj, LaunchAPI):  # the other kernel that launches: the client's Kernel
        return KernelKind.KERNEL
    if isinstance(obj, Launch):
        return KernelKind.LAUNCH
    if isinstance(obj, str | os.PathLike):
        return KernelKind.BUNDLE
    if inspect.isfunction(obj):
        return KernelKind.FUNCTION
    if _numba_dispatcher(obj):
        return KernelKind.DISPATCHER
    return KernelKind.OTHER


def _numba_dispatcher(obj) -> bool:
    """Whether ``obj`` is a ``numba.cuda.jit`` dispatcher: a Python function and CUDA
    target options, the two a dispatcher is read by (``dg.kernel``)."""
    return hasattr(obj, "py_func") and hasattr(obj, "targetoptions")
