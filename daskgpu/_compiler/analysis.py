"""What a kernel writes and how many grid dimensions it uses, from Numba's typed IR.

The write set decides which arrays a launch copies back and returns. It is a
may-write analysis: every variable that can hold (a view of) an argument array
is tracked, and an argument counts as written when such a variable is stored
into, passed to an atomic or a cache-hinted store, passed to a device function
that writes that parameter, or passed to anything the analysis does not know
to be read-only.

:func:`grid_rank_hint` reads the grid rank before typing, from the bytecode:
``map_kernel`` needs it to choose the array ranks it compiles a lazy kernel for.
"""

from __future__ import annotations

import dis

from numba.cuda import types
from numba.cuda.core import ir

# Calls known not to write through their array arguments.
_READ_ONLY_BUILTINS = frozenset({len, min, max, abs, range, bool, int, float, complex,
                                 slice, enumerate, zip, print})
_READ_ONLY_METHODS = frozenset({
    "reshape", "ravel", "flatten", "view", "transpose", "copy", "sum", "prod",
    "min", "max", "mean", "item", "astype", "argmax", "argmin", "all", "any", "dot",
    "conj", "conjugate", "take", "nonzero", "cumsum", "cumprod", "var", "std",
})
_SCALAR_TYPES = (types.Number, types.Boolean, types.NoneType, types.Literal,
                 types.EnumMember, types.Function, types.Module)


def _holds_array(typ) -> bool:
    # Anything that is not plainly a scalar may hold an array (tuples, records,
    # iterators): tracking too much only over-approximates the write set.
    return typ is not None and not isinstance(typ, _SCALAR_TYPES)


def writes_first_argument(fn_type) -> bool:
    """Whether a CUDA intrinsic writes through its first argument.

    The atomics do, and so do the cache-hinted stores (``cuda.stcg``, ``stcs``,
    ``stwb``, ``stwt``); the cache-hinted loads only read.
    """
    key = getattr(fn_type, "typing_key", None)
    module = getattr(key, "__module__", "")
    name = getattr(key, "__qualname__", "")
    if module == "numba.cuda.stubs":
        return name.startswith("atomic.") or "compare_and_swap" in name
    return module == "numba.cuda.cache_hints" and name.startswith("st")


def grid_call(fn_type):
    key = getattr(fn_type, "typing_key", None)
    name = getattr(key, "__name__", getattr(key, "_name", None))
    if name in ("grid", "gridsize") and "cuda" in repr(key) + getattr(key, "__module__", ""):
        return name
    return None


_GRID_NAMES = frozenset({"grid", "gridsize"})
_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_FAST",
                    "LOAD_NAME"})


def grid_rank_hint(py_func) -> int | None:
    """The highest ``n`` of the ``cuda.grid(n)`` / ``cuda.gridsize(n)`` calls in ``py_func``.

    Read from its own bytecode, before any typing; None when it has none.

    A hint only: calls inside device functions are not seen, and the typed
    analysis (:func:`analyse`) has the last word.

    Examples
    --------
    >>> from numba import cuda
    >>> def k(x):
    ...     i = cuda.grid(1)
    >>> grid_rank_hint(k), grid_rank_hint(len)
    (1, None)
    """
    code = getattr(py_func, "__code__", None)
    if code is None:
        return None
    rank, previous = None, None
    for ins in dis.get_instructions(code):
        if (ins.opname == "LOAD_CONST" and isinstance(ins.argval, int) and previous is not None
                and previous.opname in _LOADS and previous.argval in _GRID_NAMES):
            rank = max(rank or 0, ins.argval)
        if ins.opname not in ("PUSH_NULL", "CACHE"):
            previous = ins
    return rank


class KernelAnalysis:
    """Results of analysing one typed function: written parameters and grid rank."""

    def __init__(self, written: frozenset, grid_ndim: int):
        self.written = written
        self.grid_ndim = grid_ndim

    def __repr__(self):
        return f"KernelAnalysis(written={sorted(self.written)}, grid_ndim={self.grid_ndim})"


def analyse(type_annotation, nargs: int, _depth: int = 0) -> KernelAnalysis:
    """Analyse the typed IR of a kernel or device function with ``nargs`` parameters."""
    typemap = type_annotation.typemap
    calltypes = type_annotation.calltypes
    blocks = type_annotation.blocks
    aliases: dict[str, frozenset] = {}
    consts: dict[str, object] = {}
    writes: set = set()
    grid_ndim = 0

    def of(var) -> frozenset:
        return aliases.get(var.name, frozenset())

    # Iterate to a fixed point: loops can carry a view into an earlier block.
    changed = True
    while changed:
        changed = False
        for block in blocks.values():
            for stmt in block.body:
                if isinstance(stmt, ir.Assign):
                    target, value = stmt.target.name, stmt.value
                    new = frozenset()
                    if isinstance(value, ir.Arg):
                        new = frozenset({value.index})
                    elif isinstance(value, ir.Const):
                        consts[target] = value.value
                    elif isinstance(value, ir.Var):
                        new = of(value)
                    elif isinstance(value, ir.Expr) and _holds_array(typemap.get(target)):
                        new = frozenset().union(*(of(v) for v in value.list_vars()))
                    if not _holds_array(typemap.get(target)):
                        new = frozenset()
                    if new - aliases.get(target, frozenset()):
                        aliases[target] = aliases.get(target, frozenset()) | new
                        changed = True

    for block in blocks.values():
        for stmt in block.body:
            if isinstance(stmt, (ir.SetItem, ir.StaticSetItem, ir.SetAttr)):
                writes |= of(stmt.target)
            elif isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr):
                expr = stmt.value
                if expr.op == "inplace_binop":
                    writes |= of(expr.lhs)
                elif expr.op == "call":
                    writes |= _call_writes(expr, typemap, calltypes, of, _depth)
                    fn_type = typemap.get(expr.func.name)
                    if grid_call(fn_type) and expr.args:
                        n = consts.get(expr.args[0].name, 1)
                        grid_ndim = max(grid_ndim, n if isinstance(n, int) else 1)
    written = frozenset(i for i in writes if i < nargs)
    return KernelAnalysis(written, grid_ndim)


def _call_writes(expr, typemap, calltypes, of, depth) -> set:
    arg_aliases = [of(a) for a in expr.args] + [of(v) for _, v in expr.kws]
    if expr.vararg is not None:
        arg_aliases.append(of(expr.vararg))
    touched = set().union(*arg_aliases) if arg_aliases else set()
    fn_type = typemap.get(expr.func.name)
    if isinstance(fn_type, types.BoundFunction):
        # A method's array is its receiver, which reaches the call through the
        # bound method (x.fill(v) is call(getattr(x, "fill"), v)), not the args.
        method = str(fn_type.typing_key).rpartition(".")[2]
        if method in _READ_ONLY_METHODS:
            return set()
        return touched | set(of(expr.func))
    if not touched:
        return set()
    if writes_first_argument(fn_type):
        return set(arg_aliases[0]) if arg_aliases else set()
    if isinstance(fn_type, types.Function):
        key = getattr(fn_type, "typing_key", None)
        module = getattr(key, "__module__", "") or ""
        if key in _READ_ONLY_BUILTINS or module in ("math", "cmath") or grid_call(fn_type):
            return set()
        if module.startswith("numba.cuda"):
            # The other CUDA intrinsics (syncthreads, shared.array, fp16 math,
            # cache-hinted loads, ...) read their arguments only.
            return set()
        return touched
    dispatcher = getattr(fn_type, "dispatcher", None)
    if dispatcher is not None and depth < 20 and not expr.kws and not expr.vararg:
        sig = calltypes.get(expr)
        cres = dispatcher.overloads.get(tuple(sig.args)) if sig is not None else None
        ta = getattr(cres, "type_annotation", None)
        if ta is not None:
            inner = analyse(ta, len(expr.args), depth + 1)
            return set().union(*(arg_aliases[i] for i in inner.written)) if inner.written else set()
    return touched
