"""The time-step kernels of kit.kernels in NumPy, and a loop of single steps over them.

:func:`loop` is what ``dg.iterate`` must give: before every step the states
are padded by the boundary (as Dask's ``map_overlap`` pads: ``reflect`` is
NumPy's ``"symmetric"``, ``nearest`` its ``"edge"``), one step runs over the
padded arrays, and the padding is cut off again.
"""

import numpy as np

_MODES = {"periodic": "wrap", "reflect": "symmetric", "nearest": "edge"}


def pad(x, depth, boundary):
    """``x`` padded ``depth`` cells per side as ``da.overlap`` pads, axis by axis."""
    if boundary in (None, "none"):
        return x
    if boundary in _MODES:
        return np.pad(x, depth, mode=_MODES[boundary])
    return np.pad(x, depth, mode="constant", constant_values=boundary)


def crop(x, depth, boundary):
    if boundary in (None, "none"):
        return x
    return x[(slice(depth, -depth),) * x.ndim]


def loop(step, states, fixed, steps, depth, boundary):
    """``steps`` steps of ``step(*padded states, *padded fixed)``, which returns the next
    states (padded, like its inputs); the final states."""
    states = [np.array(s) for s in states]
    fixed = [pad(f, depth, boundary) for f in fixed]
    for _ in range(steps):
        padded = [pad(s, depth, boundary) for s in states]
        states = [crop(s, depth, boundary) for s in step(*padded, *fixed)]
    return states


def _inner(ndim):
    return (slice(1, -1),) * ndim


def _shifted(u, axis, by):
    index = [slice(1, -1)] * u.ndim
    index[axis] = slice(1 + by, u.shape[axis] - 1 + by)
    return u[tuple(index)]


def heat(a):
    """kit.kernels' heat_1d/2d/3d as a NumPy step."""
    a = np.float32(a)

    def step(u):
        out = u.copy()
        centre = u[_inner(u.ndim)]
        lap = sum(_shifted(u, ax, -1) + _shifted(u, ax, 1) for ax in range(u.ndim))
        out[_inner(u.ndim)] = centre + a * (lap - np.float32(2 * u.ndim) * centre)
        return [out]

    return step


def wave(u, u_prev, c2):
    """kit.kernels.wave_1d as a NumPy step: the next ``(u, u_prev)``."""
    nxt = u.copy()
    lap = u[:-2] - 2 * u[1:-1] + u[2:]
    nxt[1:-1] = 2 * u[1:-1] - u_prev[1:-1] + c2[1:-1] * lap
    return [nxt, u]


def life(board):
    """kit.kernels.life as a NumPy step."""
    out = board.copy()
    n, m = board.shape
    alive = sum(board[1 + di:n - 1 + di, 1 + dj:m - 1 + dj].astype(np.int64)
                for di in (-1, 0, 1) for dj in (-1, 0, 1)) - board[1:-1, 1:-1]
    centre = board[1:-1, 1:-1]
    out[1:-1, 1:-1] = ((alive == 3) | ((alive == 2) & (centre != 0))).astype(board.dtype)
    return [out]
