"""Planning a ``daskgpu batch`` job: everything checked, the outputs locked and created
or reopened, and what is recorded as done, before any cluster is needed.

The kernel's argument order is settled here too (:func:`argument_order`): by
default every output, then every scalar, then every input; a kernel that does
not take its arguments in the order given is refused in one line that names
the order and the way to state another.
"""

from __future__ import annotations

import dataclasses
import re
import secrets

import numpy as np

from daskgpu._dask.batch import ledger as _ledger
from daskgpu._dask.batch.inputs import open_input, open_inputs
from daskgpu._dask.batch.lock import OutputLock
from daskgpu._dask.batch.store import output_specs, prepare_output
from daskgpu._errors import BatchError, CompileError

__all__ = ["ORDER_WORDS", "PlannedJob", "argument_order", "misfit_error", "plan_job"]

#: The words of an argument order, each naming the next argument of its kind.
ORDER_WORDS = ("out", "scalar", "in")


def argument_order(order, outputs, scalars, inputs) -> tuple:
    """The kernel's parameters as ``("out", "scalar", "in", ...)``, checked against the counts.

    Examples
    --------
    >>> argument_order(None, 1, 1, 2)
    ('out', 'scalar', 'in', 'in')
    >>> argument_order("out,in,scalar", 1, 1, 1)
    ('out', 'in', 'scalar')
    >>> argument_order("out,in", 1, 1, 1)
    Traceback (most recent call last):
    ...
    daskgpu._errors.BatchError: order 'out,in' names 1 out, 1 in and 0 scalar, but the job \
has 1 output(s), 1 input(s) and 1 scalar(s); give one word per kernel parameter
    """
    if order is None:
        return ("out",) * outputs + ("scalar",) * scalars + ("in",) * inputs
    words = order.split(",") if isinstance(order, str) else list(order)
    words = tuple(str(w).strip() for w in words)
    text = order if isinstance(order, str) else ",".join(words)
    bad = [w for w in words if w not in ORDER_WORDS]
    if bad:
        raise BatchError(f"order {text!r}: {bad[0]!r} is not out, in or scalar; give one word "
                         "per kernel parameter, e.g. out,in,scalar for kernel(out, x, a)")
    have = {w: words.count(w) for w in ORDER_WORDS}
    if (have["out"], have["in"], have["scalar"]) != (outputs, inputs, scalars):
        raise BatchError(
            f"order {text!r} names {have['out']} out, {have['in']} in and {have['scalar']} "
            f"scalar, but the job has {outputs} output(s), {inputs} input(s) and {scalars} "
            "scalar(s); give one word per kernel parameter")
    return words


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """A job ready to run: its kernel and arguments, outputs, and what is done.

    Attributes
    ----------
    arguments : tuple
        The kernel's arguments in its order; outputs as their dtypes.
    nonces : tuple
        The job instance of each output, as its ``job.json`` records it.
    done : frozenset
        The chunks recorded as finished (checked by the caller).
    stale : tuple
        Recorded chunks found not to hold: computed again.
    inputs : tuple
        The inputs' absolute paths, in the order of ``arrays``.
    """

    kernel: object
    arguments: tuple  # in the kernel's order; outputs as their dtypes
    order: tuple
    arrays: tuple  # the inputs, as dask arrays
    outputs: tuple  # their paths
    nonces: tuple  # the job instance of each output
    chunksize: tuple
    done: frozenset
    stale: tuple = ()
    inputs: tuple = ()

    @property
    def first(self):
        return self.arrays[0]

    @property
    def grid(self) -> list:
        return list(np.ndindex(*self.first.numblocks))

    @property
    def todo(self) -> list:
        return [c for c in self.grid if c not in self.done]

    def written(self) -> int:
        return len(_ledger.done_chunks(self.outputs[0], self.first.ndim))

    def read_in(self, layout) -> tuple:
        """The inputs as dask arrays that read one task's block of ``layout`` (a
        :class:`~daskgpu._dask.batch.groups.Layout`) in one piece: ``arrays`` unless its
        tasks hold several stored chunks."""
        if not layout.grouped:
            return self.arrays
        chunks = layout.element_chunks()
        return tuple(open_input(p, chunks) for p in self.inputs)

    def arguments_with(self, arrays) -> tuple:
        """``arguments`` with ``arrays`` in place of the inputs."""
        swap = {id(a): b for a, b in zip(self.arrays, arrays)}
        return tuple(swap.get(id(a), a) for a in self.arguments)


def _scalar_identity(s):
    if isinstance(s, np.generic):
        return [np.dtype(type(s)).str, s.tobytes().hex()]
    return [type(s).__name__, repr(s)]


def _arrange(order, outs, scalars, ins) -> tuple:
    """The arguments in the kernel's ``order``, each kind taken in its own order."""
    pools = {"out": iter(outs), "scalar": iter(scalars), "in": iter(ins)}
    return tuple(next(pools[word]) for word in order)


def plan_job(stack, kernel, inputs, outputs, scalars, order, chunks, resume,
             simulated) -> PlannedJob:
    """Check everything, then lock (held until ``stack`` closes) and create or reopen
    the outputs; no cluster needed. ``simulated``: whether the chunks will run in the
    simulator."""
    from daskgpu._runtime.ptx_kernel import PTXKernel

    # Images without their Python function (a bundle's) run on GPUs only.
    if (isinstance(kernel, PTXKernel) and simulated
            and all(im.py_func is None for im in kernel.images)):
        raise BatchError(
            f"kernel {kernel.__name__!r} is PTX only (a bundle), which the CUDA simulator "
            "cannot run; run it on GPUs, or give the kernel as MODULE:FUNCTION to simulate")
    arrays = open_inputs(inputs, chunks)
    first = arrays[0]
    outs = output_specs(outputs, first.dtype)
    if not outs:
        raise BatchError("a batch needs at least one output: (path, dtype)")
    if any(len(set(c[:-1])) > 1 or (len(c) > 1 and c[-1] > c[0]) for c in first.chunks):
        raise BatchError(f"the job's chunks {first.chunks} are irregular; zarr needs one "
                         "chunk shape: pass chunks=")
    chunksize = tuple(c[0] if c else 0 for c in first.chunks)
    image = _select_image(kernel, order, outs, scalars, arrays)

    # What the chunks depend on besides their input blocks, whose fingerprints
    # each chunk's marker holds; "nonce" names this instance of the job.
    job = {
        "format": "daskgpu-batch-3",
        "kernel": kernel.__name__, "image": image.hash, "order": list(order),
        "inputs": [[p, list(a.shape), a.dtype.str] for p, a in zip(inputs, arrays)],
        "scalars": [_scalar_identity(s) for s in scalars],
        "outputs": [dt.str for _, dt in outs],
        "shape": list(first.shape), "chunks": list(chunksize),
        "nonce": secrets.token_hex(16),
    }
    for path, _ in sorted(outs):  # one order for every run: no deadlock between two
        stack.enter_context(OutputLock(path, job["nonce"]))
    done, nonces = None, []
    for index, (path, dt) in enumerate(outs):
        have, nonce = prepare_output(path, dt, first.shape, chunksize,
                                     dict(job, output=index), resume)
        done = have if done is None else done & have
        nonces.append(nonce)
    arguments = _arrange(order, [dt for _, dt in outs], scalars, arrays)
    return PlannedJob(kernel, arguments, order, tuple(arrays), tuple(p for p, _ in outs),
                      tuple(nonces), chunksize, frozenset(done), inputs=tuple(inputs))


def _select_image(kernel, order, outs, scalars, arrays):
    """The image the chunks run: compiled here when the kernel is lazy; else a usage error."""
    ndim = arrays[0].ndim
    examples = _arrange(order, [np.empty((1,) * ndim, dt) for _, dt in outs], scalars,
                        [np.empty((1,) * a.ndim, a.dtype) for a in arrays])
    try:
        return kernel.select_image(list(examples))
    except (TypeError, CompileError) as exc:
        raise misfit_error(kernel, order, examples, exc) from None


def misfit_error(kernel, order, examples, exc) -> BatchError:
    """The one-line error for a kernel that does not compile for, or take, the arguments
    in the order given: the compiler's reason, and ``--order`` advised only where
    another order could help (the arguments are not all of one type, and the reason is
    not one that no order changes, such as a name the kernel does not define)."""
    import inspect

    name = getattr(kernel, "__name__", str(kernel))
    py_func = getattr(kernel, "py_func", None)
    params = inspect.signature(py_func).parameters if py_func is not None else None
    shown = f"{name}{inspect.signature(py_func)}" if py_func is not None else None
    kinds = ", ".join(f"{w}: {_kind(e)}" for w, e in zip(order, examples))
    calls = f"this batch calls it as ({', '.join(order)}) = ({kinds})"
    if params is not None and _takes_fixed(params) and len(params) != len(examples):
        counts = {word: list(order).count(word) for word in ORDER_WORDS}
        return BatchError(
            f"kernel {name!r} takes {len(params)} parameters, {shown}, but {calls}: "
            f"{counts['out']} output(s), {counts['scalar']} scalar(s) and {counts['in']} "
            f"input(s); give one output, scalar or input per parameter (--output, --scalar "
            "and --input; outputs=, scalars= and inputs= in run_batch)")
    reason = compiler_reason(exc)
    if _UNTYPED.search(reason):
        return BatchError(f"kernel {name!r} does not compile, whatever its arguments: "
                          f"{reason}; fix the kernel ({calls})")
    hint = ""
    if len({_type_key(e) for e in examples}) > 1:
        hint = (" If its parameters come in another order, give it with --order (order= in "
                "run_batch), one word per parameter, e.g. --order out,in,scalar for "
                "kernel(out, x, a)")
    params_text = f"; its parameters are {shown}" if shown else ""
    return BatchError(f"kernel {name!r} does not fit this batch: {calls}{params_text}, and "
                      f"compiling it for them failed: {reason}.{hint}")


#: Compiler reasons that no order of the arguments changes: the kernel itself is wrong.
_UNTYPED = re.compile(r"\bNameError\b|is not defined|SyntaxError|IndentationError")


def compiler_reason(exc) -> str:
    """The reason in a compile error: its first line that says what is wrong, without
    Numba's colours, its pipeline banners or daskgpu's own "compiling ... failed:" head.

    Examples
    --------
    >>> compiler_reason(TypeError("compiling f for (int64) failed:\\nFailed in cuda mode "
    ...                           "pipeline\\nNameError: name 'y' is not defined"))
    "NameError: name 'y' is not defined"
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not (
        (line.startswith("compiling ") and line.endswith("failed:"))
        or line.startswith(("Failed in ", "During: ")))]
    if not lines:
        return type(exc).__name__
    reason = lines[0]
    if reason.endswith(":") and len(lines) > 1:  # "no implementation ... for signature:"
        reason = f"{reason} {lines[1]}"
    reason = reason.rstrip(".")
    return reason if len(reason) <= 400 else reason[:397] + "..."


def _takes_fixed(params) -> bool:
    import inspect

    return all(p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                          inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params.values())


def _type_key(example):
    """What the compiler sees of an argument: an array's dtype and rank, a scalar's type."""
    if isinstance(example, np.ndarray):
        return ("array", example.dtype, example.ndim)
    return ("scalar", type(example))


def _kind(example) -> str:
    if isinstance(example, np.ndarray):
        return f"{example.dtype} array"
    return f"{type(example).__name__} {example!r}"
