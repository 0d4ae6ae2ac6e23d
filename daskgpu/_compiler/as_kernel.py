"""The one door on the client: what a user passes, turned into what daskgpu launches.

``run_batch`` and the ``daskgpu`` command take a kernel in any form a user
has one (:class:`~daskgpu._runtime.kernel_kinds.KernelKind`): a daskgpu
kernel, a loaded bundle or its path, a ``numba.cuda.jit`` dispatcher, a plain
function. :func:`as_kernel` turns each into a :class:`~daskgpu.Kernel` or
:class:`~daskgpu.PTXKernel`, compiling the signatures and options asked for;
what is no kernel it refuses with ``TypeError``, and each entry point says it
in its own words.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from daskgpu._compiler.kernel import Kernel, jit, kernel
from daskgpu._runtime.kernel_kinds import KernelKind, kind_of
from daskgpu._runtime.ptx_kernel import PTXKernel

__all__ = ["as_kernel"]


def as_kernel(obj: Any, signatures: Sequence[Any] = (), **overrides: Any) -> Kernel | PTXKernel:
    """``obj`` as a kernel daskgpu launches, with ``signatures`` and option ``overrides``.

    A plain function or a dispatcher without signatures compiles lazily, for
    the arguments it is launched on. A PTX-only kernel (or a bundle's path) is
    taken as it is: it compiles nothing.

    Examples
    --------
    >>> from numba import cuda
    >>> def double(out, x):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = 2 * x[i]
    >>> as_kernel(double)
    <daskgpu.Kernel double signatures=[]>
    >>> as_kernel(cuda.jit(double), ["void(float32[::1], float32[::1])"]).signatures
    ['(float32[::1], float32[::1])']
    >>> as_kernel(42)
    Traceback (most recent call last):
    ...
    TypeError: no kernel: a int
    """
    kind = kind_of(obj)
    signatures = list(signatures)
    if kind in (KernelKind.PTX, KernelKind.BUNDLE):
        if signatures or overrides:
            raise TypeError(f"{kind.value}, compiled already (a loaded bundle): it cannot "
                            "compile new signatures or change options")
        if kind is KernelKind.PTX:
            return obj
        from daskgpu._runtime.kernel_files import load

        return load(obj)
    if kind is KernelKind.KERNEL:
        if not signatures and not overrides:
            return obj
        options = dataclasses.replace(obj.options, **overrides)
        return Kernel(obj.py_func, signatures or obj.argtypes, options)
    if kind is KernelKind.DISPATCHER:
        return kernel(obj, signatures or None, **overrides)
    if kind is KernelKind.FUNCTION:
        return jit(signatures or None, **overrides)(obj)
    raise TypeError(f"{kind.value}: a {type(obj).__name__}")
