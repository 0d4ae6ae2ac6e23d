"""How a kernel uses its thread's position, from Numba's typed IR: what decides whether
grouping chunks into one launch can change what the kernel computes.

``map_kernel`` may merge neighbouring chunks into one launch. The kernel then sees
the group as one chunk: its thread index ``cuda.grid(n)`` counts from the group's
start, its arrays' ``size`` and ``shape`` are the group's. A kernel's results are the
same in every launch layout when every use of the position is one of these:

- an index at the position into an array the map takes chunks of (``x[i]``,
  ``out[i, j]``; ``x[i - 1]`` within a halo at least that deep);
- a bound check against such an array's extent (``i < x.size``, ``j < x.shape[1]``;
  ``1 <= i < x.size - 1`` within a halo at least one deep);
- added to ``dg.offset`` (a global coordinate, the same in every layout);
- a grid-stride loop (``range(i, x.size, cuda.gridsize(1))``);
- passed to a device function that uses it in these ways (the ``numba.cuda.random``
  functions among them).

:func:`position_uses` records, once per compiled signature, every use of the position,
the extents and the parameters that the layout could reach, as plain tuples
(:mod:`daskgpu._image.position_uses`) stored in the kernel image. Which of them are
harmless depends on what each parameter is in a map (a chunk, an array passed whole,
``dg.offset``, a number); :mod:`daskgpu._dask.launch_layout` decides that when a map is
planned.

The analysis is flow-insensitive and conservative: a use it does not recognise
counts against grouping, which then costs speed, never a result.
"""

from __future__ import annotations

import operator

from numba.cuda import types
from numba.cuda.core import ir

from daskgpu._compiler.analysis import grid_call, writes_first_argument
from daskgpu._compiler.position_kinds import (
    combinations,
    combined,
    index_items,
    is_int,
    widened,
)
from daskgpu._image.position_uses import COUNT_MAX

# CUDA's own coordinates: the block and the thread within it move with a launch's start.
_COORDINATES = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "laneid"})
_AXES = {"x": 0, "y": 1, "z": 2}
_COMPARE = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
            operator.eq: "==", operator.ne: "!="}
_SWAPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_MAX_DEPTH = 20  # device functions calling device functions


def position_uses(type_annotation, nargs: int) -> tuple:
    """Every use of the thread's position, of the arrays' extents and of the parameters
    that a launch layout could reach, in the typed function ``type_annotation``.

    Returns a sorted tuple of records (:mod:`daskgpu._image.position_uses`), each
    ending with where in the source it is (``file:line``: no source travels with an
    image).

    Examples
    --------
    >>> from numba import cuda
    >>> from numba.cuda import types
    >>> from numba.cuda.compiler import compile_cuda
    >>> from daskgpu._compiler.target import compiling_for
    >>> def scale(out, x, a):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = a * x[i]
    >>> arr = types.float32[::1]
    >>> with compiling_for((7, 5)):
    ...     cres = compile_cuda(scale, None, (arr, arr, types.float32), cc=(7, 5))
    >>> sorted({use[:-1] for use in position_uses(cres.type_annotation, 3)})
    [('at', 0, 1, 0, 0, 0), ('at', 1, 1, 0, 0, 0), ('bound', 0, 0, 0), ('value', 2)]
    """
    walk = _Walk(type_annotation, {i: _params(type_annotation, i) for i in range(nargs)})
    walk.run()
    return tuple(sorted(walk.uses, key=repr))


def _params(type_annotation, index):
    """The kinds a parameter starts with: an array (or anything holding one) or a number."""
    for block in type_annotation.blocks.values():
        for stmt in block.body:
            if (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Arg)
                    and stmt.value.index == index):
                typ = type_annotation.typemap.get(stmt.target.name)
                if isinstance(typ, (types.Number, types.Boolean, types.EnumMember)):
                    return frozenset({("sarg", index)})
                return frozenset({("arr", index)})
    return frozenset()


class _Walk:
    """One typed function walked: the kinds each variable may hold, then the uses.

    A kind is a small tuple: ``("arr", p)`` an array parameter, ``("sarg", p)`` a
    number parameter, ``("pos", axis, c)`` the position plus a constant, ``("grid", n)``
    ``cuda.grid(n)``'s tuple, ``("ext", p, axis, c)`` an extent plus a constant,
    ``("shape", p)``, ``("gsize", axis)`` / ``("gsizes", n)`` the grid's size,
    ``("range", axis)`` / ``("iter", axis)`` / ``("pair", axis)`` a grid-stride loop,
    ``("const", v)`` an integer constant, ``("tuple", items)`` a built tuple,
    ``("guard",)`` a comparison, ``("int",)`` and ``("top",)`` what a loop widened (see
    :func:`~daskgpu._compiler.position_kinds.widened`). A variable of none of them is plain data.
    """

    def __init__(self, type_annotation, param_kinds, depth=0, called=None):
        self.ta = type_annotation
        self.typemap = type_annotation.typemap
        self.calltypes = type_annotation.calltypes
        self.param_kinds = param_kinds
        self.depth = depth
        # Device functions walked, by their typed function and the kinds passed in:
        # the outer walk asks again on each of its passes, and nested calls would
        # multiply those passes, level by level.
        self.called = {} if called is None else called
        self.kinds: dict[str, frozenset] = {}
        self.uses: set = set()
        self.returns: frozenset = frozenset()
        self._recording = False
        self._loc = None

    # -- driving -----------------------------------------------------------------

    def run(self):
        # Kinds to a fixed point (a loop carries a value into an earlier block), then
        # one more pass that records the uses.
        changed = True
        while changed:
            changed = False
            for block in self.ta.blocks.values():
                for stmt in block.body:
                    if isinstance(stmt, ir.Assign):
                        new = widened(
                            self.kinds.get(stmt.target.name, frozenset()) | self._assigned(stmt))
                        if new != self.kinds.get(stmt.target.name, frozenset()):
                            self.kinds[stmt.target.name] = new
                            changed = True
        self._recording = True
        for block in self.ta.blocks.values():
            for stmt in block.body:
                self._loc = stmt.loc
                self._statement(stmt)
        return self

    def of(self, var) -> frozenset:
        return self.kinds.get(var.name, frozenset()) if isinstance(var, ir.Var) else frozenset()

    def use(self, *record):
        if self._recording:
            loc = self._loc
            # A count past what a record holds (``i < 1 << 40``) tells apart as many
            # elements as any launch has.
            record = tuple(max(-COUNT_MAX, min(COUNT_MAX, f)) if is_int(f) else f
                           for f in record)
            self.uses.add(record + (f"{loc.filename}:{loc.line}" if loc is not None else "?",))

    # -- what a variable holds -------------------------------------------------

    def _assigned(self, stmt) -> frozenset:
        self._loc = stmt.loc
        value = stmt.value
        if isinstance(value, ir.Arg):
            return self.param_kinds.get(value.index, frozenset())
        if isinstance(value, (ir.Const, ir.Global, ir.FreeVar)):
            v = value.value
            if getattr(v, "__module__", None) == "numba.cuda.stubs" and \
                    getattr(v, "__name__", None) in _COORDINATES:  # from numba.cuda import ...
                return frozenset({("dim3", v.__name__)})
            return frozenset({("const", v)}) if is_int(v) else frozenset()
        if isinstance(value, ir.Var):
            return self.of(value)
        if isinstance(value, ir.Expr):
            return self._expr(value, stmt.target)
        return frozenset()

    def _expr(self, expr, target) -> frozenset:
        op = expr.op
        if op == "binop":
            return self._binop(expr.fn, expr.lhs, expr.rhs)
        if op == "inplace_binop":  # i += 1: the operator's value, stored back
            return self._binop(expr.immutable_fn, expr.lhs, expr.rhs)
        if op == "unary":
            self.plain(expr.value)
            return frozenset()
        if op == "getattr":
            return self._getattr(expr.value, expr.attr)
        if op in ("getitem", "static_getitem", "typed_getitem"):
            return self._getitem(expr.value, expr.index, op == "static_getitem")
        if op == "build_tuple":
            return frozenset({("tuple", tuple(self.of(v) for v in expr.items))})
        if op in ("exhaust_iter", "cast"):
            return self.of(expr.value)
        if op == "getiter":
            return self._step(expr.value, "range", "iter")
        if op == "iternext":
            return self._step(expr.value, "iter", "pair")
        if op == "pair_first":
            return frozenset({("pos", k[1], 0) for k in self.of(expr.value) if k[0] == "pair"}
                             ) or self._plain_result(expr)
        if op == "pair_second":
            if any(k[0] == "pair" for k in self.of(expr.value)):
                return frozenset({("guard",)})
            return self._plain_result(expr)
        if op == "call":
            return self._call(expr)
        if op == "phi":
            return frozenset().union(*(self.of(v) for v in expr.incoming_values))
        return self._plain_result(expr)

    def _plain_result(self, expr) -> frozenset:
        for v in expr.list_vars():
            self.plain(v)
        return frozenset()

    def _step(self, var, before, after) -> frozenset:
        kinds = self.of(var)
        stepped = frozenset({(after, k[1]) for k in kinds if k[0] == before})
        for k in kinds - {k for k in kinds if k[0] == before}:
            self._plain_kind(k)
        return stepped

    # -- the uses --------------------------------------------------------------

    def plain(self, var):
        """``var`` used as a plain value: whatever it holds is used as data."""
        for k in self.of(var):
            self._plain_kind(k)

    def _plain_kind(self, k):
        tag = k[0]
        if tag == "arr":
            self.use("whole", k[1])
        elif tag == "sarg":
            self.use("value", k[1])
        elif tag in ("ext", "shape"):
            self.use("size", k[1])
        elif tag == "tuple":
            for item in k[1]:
                for kk in item:
                    self._plain_kind(kk)
        elif tag == "lin":
            self._resolve(dict(k[1]))
        elif tag in _COORDINATES or tag in ("dim3", "start"):
            name = k[1] if tag == "dim3" else tag if tag != "start" else "blockIdx * blockDim"
            self.use("never", f"uses cuda.{name}, which moves with a launch's start, other "
                              "than in blockIdx * blockDim + threadIdx")
        elif tag in ("pos", "grid", "gsize", "gsizes", "range", "iter", "pair"):
            self.use("never", "uses the thread's position as a value")
        elif tag == "top":
            self.use("never", "changes a value made from the thread's position in a loop")

    def _resolve(self, terms):
        """A sum of positions and number parameters used as a value: harmless where each
        position is added to a parameter of the same weight (``dg.offset``'s, which the
        map checks), since their sum is a global coordinate."""
        numbers = {sym[1]: w for sym, w in terms.items() if sym[0] == "sarg" and w}
        for sym, w in sorted(terms.items()):
            if sym[0] != "pos" or not w:
                continue
            partners = [p for p, pw in numbers.items() if pw == w]
            if len(partners) != 1:
                self.use("never", "uses the thread's position as a value")
                continue
            self.use("plus", partners[0], sym[1])
            del numbers[partners[0]]
        for p in numbers:
            self.use("value", p)

    def _binop(self, fn, lhs, rhs) -> frozenset:
        if fn in _COMPARE:
            return self._compare(_COMPARE[fn], lhs, rhs)
        if fn not in (operator.add, operator.sub, operator.mul):
            self.plain(lhs)
            self.plain(rhs)
            return frozenset()
        out = set()
        for a in self.of(lhs) or {None}:
            for b in self.of(rhs) or {None}:
                kind = combined(fn, a, b)
                if kind is not None:
                    if kind[0] != "lin" or kind[1]:
                        out.add(kind)
                    continue
                for k in (a, b):
                    if k is not None and k[0] != "const":
                        self._plain_kind(k)
        return frozenset(out)

    def _compare(self, op, lhs, rhs) -> frozenset:
        left, right = self.of(lhs), self.of(rhs)
        handled = set()
        for a in left:
            for b in right:
                if a[0] == "pos" and b[0] in ("ext", "const"):
                    self._bound(a, op, b)
                    handled.update({a, b})
                elif b[0] == "pos" and a[0] in ("ext", "const"):
                    self._bound(b, _SWAPPED[op], a)
                    handled.update({a, b})
        for k in (left | right) - handled:
            if k[0] != "const":
                self._plain_kind(k)
        return frozenset({("guard",)})

    def _bound(self, pos, op, other):
        """``pos op other``: which elements of the axis the comparison tells apart."""
        _, axis, c = pos
        inclusive = op in ("<=", ">")  # i <= n is i < n + 1
        if other[0] == "ext":
            _, p, ext_axis, c2 = other
            if ext_axis != axis:
                self.use("never", f"compares the position along axis {axis} with an "
                                  f"extent along axis {ext_axis}")
                return
            # i + c < n + c2 is i < n - (c - c2): the last c - c2 elements differ.
            self.use("bound", p, axis, max(0, c - c2 - (1 if inclusive else 0)))
            return
        # i + c < k is i < k - c: the first k - c elements differ (i == k - c: that many,
        # and the one after).
        first = other[1] - c + (1 if inclusive or op in ("==", "!=") else 0)
        self.use("first", axis, max(0, first))

    def _getattr(self, var, attr) -> frozenset:
        kinds = self.of(var)
        out = set()
        for k in kinds:
            if k[0] == "arr":
                typ = self.typemap.get(var.name)
                ndim = getattr(typ, "ndim", None)
                if attr == "size" and ndim == 1:
                    out.add(("ext", k[1], 0, 0))
                elif attr == "size":
                    self.use("size", k[1])
                elif attr == "shape":
                    out.add(("shape", k[1]))
                elif attr not in ("ndim", "dtype", "itemsize", "nbytes", "strides", "layout"):
                    self.use("whole", k[1])
            elif k[0] == "dim3" and attr in _AXES:
                out.add((k[1], _AXES[attr]))
            else:
                self._plain_kind(k)
        if attr in _COORDINATES and _is_cuda_module(self.typemap.get(var.name)):
            out.add(("dim3", attr))
        return frozenset(out)

    def _getitem(self, var, index, static) -> frozenset:
        kinds = self.of(var)
        out = set()
        index_kinds = frozenset({("const", index)}) if static and is_int(index) else (
            self.of(index) if isinstance(index, ir.Var) else frozenset())
        for k in kinds:
            if k[0] == "arr":
                self._indexed(k[1], index_kinds)
            elif k[0] == "shape" and static and is_int(index):
                out.add(("ext", k[1], index, 0))
            elif k[0] == "grid" and static and is_int(index):
                out.add(("pos", index, 0))
            elif k[0] == "gsizes" and static and is_int(index):
                out.add(("gsize", index))
            elif k[0] == "tuple" and static and is_int(index) and index < len(k[1]):
                out.update(k[1][index])
            else:
                self._plain_kind(k)
        if not static and isinstance(index, ir.Var) and not any(k[0] == "arr" for k in kinds):
            self.plain(index)
        return frozenset(out)

    def _indexed(self, p, index_kinds):
        """Parameter ``p`` indexed by a value of ``index_kinds``."""
        if not index_kinds:
            self.use("fixed", p)
            return
        for ik in index_kinds:
            items = index_items(ik)
            if items is None:
                self.use("fixed", p)
                continue
            for combo in combinations(items):
                if not all(kk is not None and kk[0] == "pos" for kk in combo):
                    self.use("fixed", p)
                    for kk in combo:
                        if kk is not None and kk[0] != "const":
                            self._plain_kind(kk)
                    continue
                for k, (_, axis, c) in enumerate(combo):
                    self.use("at", p, len(combo), k, axis, c)

    def _call(self, expr) -> frozenset:
        fn_type = self.typemap.get(expr.func.name)
        args = list(expr.args)
        grid = grid_call(fn_type)
        if grid is not None:
            n = next((k[1] for k in self.of(args[0]) if k[0] == "const"), 1) if args else 1
            if grid == "grid":
                return frozenset({("pos", 0, 0)} if n == 1 else {("grid", n)})
            return frozenset({("gsize", 0)} if n == 1 else {("gsizes", n)})
        if writes_first_argument(fn_type) or _cache_hinted_load(fn_type):
            # cuda.atomic.add(out, i, v), cuda.ldcg(x, i): an index into the first argument.
            if args:
                for k in self.of(args[0]):
                    if k[0] == "arr":
                        self._indexed(k[1], self.of(args[1]) if len(args) > 1 else frozenset())
                    else:
                        self._plain_kind(k)
                for a in args[2:]:
                    self.plain(a)
            return frozenset()
        if _is_range(fn_type):
            return self._range(args)
        if _is_len(fn_type) and len(args) == 1:
            return self._getattr(args[0], "size")
        if _is_cast(fn_type) and len(args) == 1 and not expr.kws:
            return self.of(args[0])
        dispatcher = getattr(fn_type, "dispatcher", None)
        if dispatcher is not None and self.depth < _MAX_DEPTH and not expr.kws \
                and expr.vararg is None:
            sig = self.calltypes.get(expr)
            cres = dispatcher.overloads.get(tuple(sig.args)) if sig is not None else None
            ta = getattr(cres, "type_annotation", None)
            if ta is not None:
                kinds = tuple(self.of(a) for a in args)
                key = (id(ta), kinds)
                if key not in self.called:
                    inner = _Walk(ta, dict(enumerate(kinds)), self.depth + 1, self.called)
                    inner.run()
                    self.called[key] = (ta, frozenset(inner.uses), inner.returns)
                _, uses, returns = self.called[key]
                if self._recording:
                    self.uses |= uses
                return returns
        if isinstance(fn_type, types.Function) and _reads_only(fn_type):
            for a in args:
                self.plain(a)
            return frozenset()
        for v in expr.list_vars():
            if v is not expr.func:
                self.plain(v)
        return frozenset()

    def _range(self, args) -> frozenset:
        """``range(i, x.size, cuda.gridsize(1))``: a grid-stride loop over the chunk."""
        if len(args) == 3:
            start, stop, step = (self.of(a) for a in args)
            loops = set()
            for s in start:
                for e in stop:
                    for g in step:
                        if (s[0] == "pos" and s[2] == 0 and e[0] == "ext" and g[0] == "gsize"
                                and s[1] == e[2] == g[1]):
                            self._bound(s, "<", e)
                            loops.add(("range", s[1]))
            if loops:
                return frozenset(loops)
        for a in args:
            self.plain(a)
        return frozenset()

    # -- statements --------------------------------------------------------------

    def _statement(self, stmt):
        if isinstance(stmt, ir.Assign):
            self._assigned(stmt)
            if isinstance(stmt.value, ir.Expr) and stmt.value.op == "cast":
                self.returns = self.returns | self.of(stmt.value.value)
        elif isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            static = isinstance(stmt, ir.StaticSetItem)
            self._getitem(stmt.target, stmt.index, static)
            self.plain(stmt.value)
        elif isinstance(stmt, ir.Branch):
            for k in self.of(stmt.cond):
                if k[0] not in ("guard", "const"):
                    self._plain_kind(k)
        elif isinstance(stmt, (ir.Del, ir.Jump, ir.Return)):
            pass
        else:
            for v in stmt.list_vars():
                self.plain(v)


def _is_cuda_module(typ) -> bool:
    return isinstance(typ, types.Module) and getattr(typ.pymod, "__name__", "") == "numba.cuda"


def _cache_hinted_load(fn_type) -> bool:
    key = getattr(fn_type, "typing_key", None)
    return (getattr(key, "__module__", "") == "numba.cuda.cache_hints"
            and getattr(key, "__qualname__", "").startswith("ld"))


def _is_range(fn_type) -> bool:
    return isinstance(fn_type, types.Function) and getattr(fn_type, "typing_key", None) is range


def _is_len(fn_type) -> bool:
    return isinstance(fn_type, types.Function) and getattr(fn_type, "typing_key", None) is len


def _is_cast(fn_type) -> bool:
    """``int(i)``, ``numba.int64(i)``, ``bool(c)``: the same value in another type."""
    if isinstance(fn_type, types.NumberClass):
        return True
    key = getattr(fn_type, "typing_key", None)
    return isinstance(fn_type, types.Function) and key in (int, bool)


def _reads_only(fn_type) -> bool:
    key = getattr(fn_type, "typing_key", None)
    module = getattr(key, "__module__", "") or ""
    return module in ("math", "cmath") or module.startswith("numba.cuda") or key in (
        min, max, abs, float, complex)
