"""The kinds of value the position analysis (:mod:`daskgpu._compiler.positions`)
follows through a kernel, and how arithmetic combines them.

A kind is a small tuple (see :class:`~daskgpu._compiler.positions._Walk`): the
position plus a constant, an extent, a constant, a weighted sum of positions and
number parameters, a built tuple. These functions know nothing of Numba's IR:
they take kinds and give kinds, so that each rule can be read, and tested, alone.
"""

from __future__ import annotations

import operator

__all__ = ["MAX_KINDS", "combinations", "combined", "index_items", "is_int", "linear",
           "widened"]


#: The most integer constants, and the most other kinds, a variable keeps before they
#: widen to ``("int",)`` (an integer of no known value: plain data) and ``("top",)`` (a
#: value made from the position in a way not followed). A loop that adds to a counter or
#: a position (``k += 1``, ``i += 1``) makes a new kind each time round; widening, and
#: each widened kind absorbing what it stands for, is what lets the walk end.
MAX_KINDS = 16
_KEPT = ("arr", "sarg", "shape", "dim3")


def widened(kinds: frozenset) -> frozenset:
    """``kinds``, with its constants or its other kinds widened where they are too many."""
    consts = [k for k in kinds if k[0] in ("const", "int")]
    others = [k for k in kinds if k[0] not in _KEPT and k[0] not in ("const", "int")]
    if ("int",) not in kinds and len(consts) <= MAX_KINDS and \
            ("top",) not in kinds and len(others) <= MAX_KINDS:
        return kinds
    out = {k for k in kinds if k[0] in _KEPT}
    if ("int",) in kinds or len(consts) > MAX_KINDS:
        out.add(("int",))
    else:
        out.update(consts)
    if ("top",) in kinds or len(others) > MAX_KINDS:
        out.add(("top",))
    else:
        out.update(others)
    return frozenset(out)


def combined(fn, a, b):
    """``a + b``, ``a - b`` or ``a * b`` as a kind where it keeps one: a position or an
    extent shifted by a constant, constants folded, or a weighted sum (``("lin",
    terms)``) of positions and number parameters; None where the operation uses its
    operands as plain values."""
    if fn is not operator.mul:
        sign = 1 if fn is operator.add else -1
        if sign > 0 and a is not None and b is not None and {a[0], b[0]} == {
                "start", "threadIdx"} and a[1] == b[1]:
            return ("pos", a[1], 0)  # blockIdx.x * blockDim.x + threadIdx.x, as cuda.grid(1)
        if a is not None and b is not None:
            if a[0] in ("pos", "ext") and b[0] == "const":
                return a[:-1] + (a[-1] + sign * b[1],)
            if sign > 0 and b[0] in ("pos", "ext") and a[0] == "const":
                return b[:-1] + (b[-1] + a[1],)
            if a[0] == "const" and b[0] == "const":
                return ("const", a[1] + sign * b[1])
        la, lb = linear(a), linear(b)
        if la is None or lb is None:
            return None
        terms = dict(la)
        for sym, w in lb.items():
            terms[sym] = terms.get(sym, 0) + sign * w
        return ("lin", tuple(sorted((s, w) for s, w in terms.items() if w)))
    if a is not None and b is not None and a[0] == "const" and b[0] == "const":
        return ("const", a[1] * b[1])
    if a is not None and b is not None and {a[0], b[0]} == {"blockIdx", "blockDim"} \
            and a[1] == b[1]:
        return ("start", a[1])  # the first thread of this block along an axis
    for k, factor in ((a, b), (b, a)):
        if factor is not None and factor[0] == "const" and linear(k):
            return ("lin", tuple(sorted((s, w * factor[1]) for s, w in linear(k).items()
                                        if w * factor[1])))
    return None


def linear(kind):
    """``kind`` as weighted terms of positions and number parameters (empty for plain
    data and constants); None for a kind that is no such sum."""
    if kind is None or kind[0] == "const":
        return {}
    if kind[0] == "pos":
        return {("pos", kind[1]): 1}
    if kind[0] == "sarg":
        return {("sarg", kind[1]): 1}
    if kind[0] == "lin":
        return dict(kind[1])
    return None


def index_items(kind):
    """The index kinds per axis of an index value: a tuple of kind-sets, None if unknown."""
    if kind[0] == "pos":
        return (frozenset({kind}),)
    if kind[0] == "grid":
        return tuple(frozenset({("pos", a, 0)}) for a in range(kind[1]))
    if kind[0] == "tuple":
        return kind[1]
    return None


def combinations(items):
    combos = [()]
    for item in items:
        combos = [c + (k,) for c in combos for k in (item or {None})]
    return combos


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
