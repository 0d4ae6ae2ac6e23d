"""Random states built where the kernel runs: on the GPU, or on the host when simulating.

:func:`build` makes the xoroshiro128+ states of one launch through the backend
(:mod:`daskgpu._runtime.backends`): on a GPU by launching the states kernel that
the client compiled (the worker needs no numba), in simulation on the host by
the same jump table (:func:`~daskgpu._image.random_states.host_states`).
Either way state *g* is state *g* of Numba's
``create_xoroshiro128p_states(n, seed)``.
"""

from __future__ import annotations

from daskgpu._image.random_states import RandomStates
from daskgpu._runtime import backends

__all__ = ["build", "expand"]


def build(seed: int, base: int, shape: tuple, strides: tuple, builder=None):
    """The states of a launch of ``shape``: element ``i`` gets state ``base + i . strides``.

    ``shape`` and ``strides`` have up to 3 axes (row-major; ``strides`` count
    states). On a GPU ``builder`` (the shipped states kernel) runs on this
    thread's device and a
    :class:`~daskgpu._runtime.gpu.random_states.DeviceStates` comes back; with
    no builder, or while simulating, a host array of ``STATE_DTYPE``.

    Examples
    --------
    >>> build(7, 0, (3,), (1,)).shape
    (3,)
    """
    return backends.current().random_states(seed, base, shape, strides, builder)


def expand(args):
    """``args`` with each :class:`~daskgpu._image.random_states.RandomStates` built."""
    out = []
    for a in args:
        if type(a) is RandomStates:
            if a.n is None:
                raise TypeError(
                    f"{a!r} has no n: outside map_kernel, give the number of states, "
                    "dg.random_states(seed, n, start=0)"
                )
            a = build(a.seed, a.start, (a.n,), (1,), a.builder)
        out.append(a)
    return tuple(out)
