"""Compile device functions for the requested target instead of the current GPU.

numba-cuda 0.30 compiles a ``@cuda.jit(device=True)`` function, when a kernel
calls it, for ``get_current_device().compute_capability``; with no driver that
raises ``CudaSupportError``. Inside :func:`compiling_for`, that lookup answers
with the target being compiled, so a kernel and its device functions compile on
a machine without a GPU. The device function's code is linked into the kernel's
library and lowered to PTX for each target anyway; the cc only steers typing.
"""

from __future__ import annotations

import contextlib
from collections import namedtuple

from numba.cuda import dispatcher as _dispatcher
from numba.cuda.core.compiler_lock import global_compiler_lock

_TargetDevice = namedtuple("_TargetDevice", ["compute_capability"])


@contextlib.contextmanager
def compiling_for(cc: tuple):
    """Within this block, numba-cuda compiles device functions for ``cc``."""
    # Numba's own compiler lock serialises every compile, so no other thread
    # can observe the swapped lookup.
    with global_compiler_lock:
        original = _dispatcher.get_current_device
        _dispatcher.get_current_device = lambda: _TargetDevice(tuple(cc))
        try:
            yield
        finally:
            _dispatcher.get_current_device = original
