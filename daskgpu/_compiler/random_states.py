"""``dg.random_states`` and the states kernel, compiled here on the client.

The kernel applies :data:`~daskgpu._image.random_states.JUMP_TABLE` to the
seed's state, one jump polynomial per set bit of the state's global index:
O(log g) work per state where Numba's host loop costs ``g`` jumps. It is
compiled once per process and ships as PTX like any kernel, so workers build
states on their own GPU without numba.
"""

from __future__ import annotations

import threading

from numba import cuda, uint32, uint64

from daskgpu._image.random_states import RandomStates
from daskgpu._runtime import backends

__all__ = ["builder", "random_states"]

#: states as uint64[n, 2], the table, the seed word, the first global index,
#: the launch's axes 1 and 2, and the global strides of axes 0, 1 and 2.
SIGNATURE = ("void(uint64[:, ::1], uint64[:, ::1], uint64, uint64, uint64, uint64, "
             "uint64, uint64, uint64)")


@cuda.jit(device=True, inline="always")
def _rotl(x, k):
    return (x << uint32(k)) | (x >> uint32(64 - k))


def build_states(states, table, z, base, n1, n2, st0, st1, st2):
    """``states[i]`` = state ``base + i0*st0 + i1*st1 + i2*st2`` of seed word ``z``.

    ``(i0, i1, i2)`` is the row-major position of ``i`` in a launch whose axes
    1 and 2 have ``n1`` and ``n2`` elements.
    """
    i = cuda.grid(1)
    if i >= states.shape[0]:
        return
    ui = uint64(i)
    rest = ui // n2
    g = base + (rest // n1) * st0 + (rest % n1) * st1 + (ui % n2) * st2
    s0 = z
    s1 = z
    k = 0
    while g != uint64(0):
        if g & uint64(1):
            # The jump polynomial table[k] applied as Numba's xoroshiro128p_jump does.
            a0 = uint64(0)
            a1 = uint64(0)
            for w in range(2):
                word = table[k, w]
                for b in range(64):
                    if (word >> uint32(b)) & uint64(1):
                        a0 ^= s0
                        a1 ^= s1
                    t = s1 ^ s0
                    s0 = _rotl(s0, 55) ^ t ^ (t << uint32(14))
                    s1 = _rotl(t, 36)
            s0 = a0
            s1 = a1
        g >>= uint32(1)
        k += 1
    states[i, 0] = s0
    states[i, 1] = s1


class _Builder:
    """The states kernel, compiled on first use, once per process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kernel = None

    def __call__(self):
        from daskgpu._compiler.kernel import Kernel
        from daskgpu._runtime.ptx_kernel import PTXKernel

        with self._lock:
            if self._kernel is None:
                kernel = Kernel(build_states, [SIGNATURE])
                self._kernel = PTXKernel(kernel.images)  # PTX only, also when simulating
        return self._kernel


builder = _Builder()


def random_states(seed: int, n: int | None = None, start: int = 0) -> RandomStates:
    """xoroshiro128+ random states for kernels, built on the device that runs them.

    State *g* equals state *g* of Numba's
    ``numba.cuda.random.create_xoroshiro128p_states(n, seed)``, and kernels
    draw from it with ``xoroshiro128p_uniform_float32(states, i)`` and its
    siblings, unchanged. States are built on the GPU in O(log g) steps each,
    with no host loop over the offset.

    Parameters
    ----------
    seed : int
        The seed, as for Numba (0 to 2**64 - 1).
    n : int, optional
        Leave out in :func:`map_kernel`: there each chunk gets one state per
        element of its launch, state *g* for the global row-major flat index
        *g*, so the numbers do not depend on the chunking. Give it for a
        launch (``kernel[...]``, ``client.submit``): the launch then gets
        ``n`` states.
    start : int
        With ``n``: the global index of the first state.

    Returns
    -------
    RandomStates
        Plain data (the seed, ``n``, ``start`` and the PTX-only states kernel),
        expanded where the launch runs; a kernel's writes to the states are
        not returned.

    Examples
    --------
    >>> import dask, numpy as np, dask.array as da, daskgpu as dg
    >>> from numba import cuda
    >>> from numba.cuda.random import xoroshiro128p_uniform_float32
    >>> @dg.jit
    ... def uniform(out, states):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = xoroshiro128p_uniform_float32(states, i)
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     a = dg.map_kernel(uniform, dg.Out(np.float32, shape=8, chunks=3),
    ...                       dg.random_states(7)).compute()
    ...     b = dg.map_kernel(uniform, dg.Out(np.float32, shape=8, chunks=8),
    ...                       dg.random_states(7)).compute()
    >>> bool((a == b).all())
    True
    """
    if n is None:
        if start:
            raise TypeError("random_states(start=...) needs n; in map_kernel give only the seed")
        return RandomStates(seed)
    states = RandomStates(seed, n, start)
    if not backends.current().simulated:  # simulated workers build states on the host
        states.builder = builder()
    return states
