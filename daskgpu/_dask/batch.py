"""``daskgpu batch``: run a kernel over stored arrays, chunk by chunk, resumably.

Inputs are zarr arrays or ``.npy`` files; every output is a zarr array with
the chunks of the job, written one chunk per task. After a task has stored
its chunk in every output it records the chunk in each output's ledger, the
directory ``.daskgpu-done`` inside the zarr array: one marker file per
finished chunk, created by an atomic rename, plus ``job.json``, which says
what job the chunks belong to. A marker holds the fingerprints of the input
blocks the chunk was computed from and of the chunk as stored. A rerun of the
same job keeps only the chunks whose marker still matches both, so an
interrupted job loses no finished chunk, and a chunk whose input changed, or
whose stored data went missing or was damaged, is computed again. An output
never overlaps an input. Failed chunks are retried, then reported; the others
are still written. Workers need zarr and must see the paths of the inputs and
outputs.

Inputs, outputs and the per-chunk tasks are :mod:`daskgpu._dask.batch_store`;
the ledger is :mod:`daskgpu._dask.ledger`; the ``daskgpu batch`` command line
is :mod:`daskgpu._cli.batch`.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import secrets
import sys
import time

import numpy as np

from daskgpu._dask import ledger as _ledger
from daskgpu._dask.batch_store import (
    ChunkCheck,
    ChunkWriter,
    NpyFile,
    as_paths,
    check_no_overlap,
    open_inputs,
    output_paths,
    output_specs,
    prepare_output,
)
from daskgpu._dask.ledger import done_chunks
from daskgpu._errors import BatchError
from daskgpu._runtime import backend as backends

__all__ = ["BatchError", "BatchReport", "NpyFile", "done_chunks", "local_client", "run_batch"]


@dataclasses.dataclass(frozen=True)
class BatchReport:
    """What one :func:`run_batch` call did. Chunks are block indices, e.g. ``(3,)``.

    Attributes
    ----------
    outputs : tuple of str
        The output zarr arrays.
    chunks : int
        Chunks in the job.
    skipped : tuple
        Chunks finished by earlier runs, checked and not computed again.
    computed : tuple
        Chunks computed and written by this run.
    failed : dict
        Chunk to error text (``"IndexError: ..."``), for chunks that failed
        every attempt.
    remaining : tuple
        Chunks not attempted (``max_chunks`` reached).
    retries : int
        Attempts made again for a failing task before its chunk failed.
    seconds : float
        Wall time spent computing chunks.
    stale : tuple
        Chunks an earlier run had written whose inputs changed since, or
        whose stored data was missing or damaged: computed again (or to be).

    Examples
    --------
    >>> r = BatchReport(outputs=("z.zarr",), chunks=4, skipped=((0,),), computed=((1,),),
    ...                 failed={(2,): "IndexError: index 99 is out of bounds"},
    ...                 remaining=((3,),), retries=2)
    >>> r.complete
    False
    >>> print(r.summary().replace(" in 0.0 s", ""))
    2/4 chunks written (1 this run, 1 before)
      chunk (2,) failed after 3 attempt(s): IndexError: index 99 is out of bounds
    2 chunk(s) to go: run the same job again to compute only those
    """

    outputs: tuple
    chunks: int
    skipped: tuple = ()
    computed: tuple = ()
    failed: dict = dataclasses.field(default_factory=dict)
    remaining: tuple = ()
    retries: int = 0
    seconds: float = 0.0
    stale: tuple = ()

    @property
    def complete(self) -> bool:
        """Whether every chunk of the job is now written."""
        return len(self.skipped) + len(self.computed) == self.chunks

    def summary(self) -> str:
        """A few lines for people: counts, then each failed chunk."""
        done = len(self.skipped) + len(self.computed)
        lines = [f"{done}/{self.chunks} chunks written ({len(self.computed)} this run, "
                 f"{len(self.skipped)} before) in {self.seconds:.1f} s"]
        if self.stale:
            lines.append(f"  {len(self.stale)} chunk(s) written before were stale (an input "
                         "changed, or the stored chunk was missing or damaged): computed "
                         "again")
        for chunk, error in sorted(self.failed.items()):
            lines.append(f"  chunk {chunk} failed after {self.retries + 1} attempt(s): {error}")
        if self.failed or self.remaining:
            lines.append(f"{self.chunks - done} chunk(s) to go: run the same job again to "
                         "compute only those")
        return "\n".join(lines)

# -- running --------------------------------------------------------------------
def run_batch(kernel, inputs, outputs, *, scalars=(), chunks=None, client=None,
              simulate=None, retries=2, progress=True, resume=True, max_chunks=None):
    """Run ``kernel`` over stored arrays, writing its outputs to zarr chunk by chunk.

    The kernel is called per chunk as ``kernel(*outputs, *scalars, *inputs)``
    through :func:`~daskgpu.map_kernel`. Each finished chunk is recorded in the
    outputs' ledgers with the fingerprints of its input blocks and its stored
    data, so running the same job again computes only the chunks that are
    missing (after an interruption, a failure, or ``max_chunks``) or stale
    (an input changed, or the stored chunk is missing or damaged).

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        A kernel from :func:`daskgpu.jit` or :func:`daskgpu.load`.
    inputs : sequence of path
        Zarr arrays or ``.npy`` files, all of one shape, in this machine's
        byte order. The job's chunks are ``chunks``, else the first zarr
        input's, else dask's ``"auto"``.
    outputs : sequence of path or (path, dtype)
        Zarr arrays to write, each the shape of the inputs and chunked like
        the job; the dtype defaults to the first input's. Each holds its
        ledger in ``.daskgpu-done``. Workers must see the same paths. An
        output may not be, contain or lie inside an input.
    scalars : sequence
        Values passed between the outputs and the inputs.
    chunks : optional
        Chunk shape, as dask takes it (e.g. ``1000`` or ``(256, 256)``).
    client : distributed.Client, optional
        Default: the current client, else a :class:`~daskgpu.LocalGPUCluster`
        started for this run.
    simulate : bool, optional
        Run kernels in Numba's CUDA simulator (see
        :class:`~daskgpu.LocalGPUCluster`). Default: only without a GPU.
    retries : int
        Attempts to make again for each failing chunk.
    progress : bool
        Show a progress bar on stderr.
    resume : bool
        Keep the chunks that earlier runs of the same job finished. False
        overwrites the outputs and computes everything.
    max_chunks : int, optional
        Compute at most this many chunks in this run, then stop.

    Returns
    -------
    BatchReport

    Raises
    ------
    BatchError
        When an input cannot be read, shapes disagree, an output overlaps an
        input or holds another job, or the kernel does not fit the arguments.
        Nothing is written then.

    Examples
    --------
    >>> import numpy as np, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
    ... def saxpy(out, a, x, y):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = a * x[i] + y[i]
    >>> report = run_batch(saxpy, ["x.zarr", "y.npy"], [("z.zarr", np.float32)],
    ...                    scalars=[np.float32(2)])  # doctest: +SKIP
    >>> report.complete, len(report.computed)  # doctest: +SKIP
    (True, 40)
    """
    from contextlib import ExitStack

    import dask.config

    from daskgpu import _config

    for name, value, low in (("retries", retries, 0), ("max_chunks", max_chunks, 0)):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Integral) or value < low):
            raise BatchError(f"{name} must be a whole number of {low} or more, got {value!r}")
    _config.check()
    inputs = as_paths(inputs, "inputs")
    if not inputs:
        raise BatchError("a batch needs at least one input array")
    # Before a cluster starts or anything is written.
    check_no_overlap(inputs, output_paths(outputs))
    plan = None
    try:
        with ExitStack() as stack:
            if client is None:
                client = _current_client()
            if client is None:
                client = local_client(stack, simulate=simulate)
            elif simulate is not None:
                stack.enter_context(dask.config.set({"daskgpu.simulate": bool(simulate)}))
            stack.enter_context(client.as_current())  # map_kernel asks it for GPUs
            plan = _plan(kernel, inputs, outputs, scalars, chunks, resume, client)
            return _execute(plan, client, retries, progress, max_chunks)
    except KeyboardInterrupt as exc:
        if plan is not None:  # counted once a local cluster has finished its chunks
            exc.add_note(f"daskgpu batch interrupted: {plan.written()}/{len(plan.grid)} "
                         "chunks written; run the same job again to compute only the rest")
        raise


def local_client(stack, devices=None, simulate=None):
    """A client of a new :class:`~daskgpu.LocalGPUCluster`, closed with ``stack``."""
    import signal
    import threading

    from distributed import Client

    from daskgpu._dask.cluster import LocalGPUCluster

    # Ctrl-C reaches the whole process group; the workers started now ignore it
    # (they inherit the setting) and are closed by this process, which reports.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        cluster = stack.enter_context(LocalGPUCluster(
            devices=devices, simulate=simulate, dashboard_address=":0",
            silence_logs=logging.CRITICAL))  # the report names failed chunks
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    return stack.enter_context(Client(cluster))


def _current_client():
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A job ready to run: its outputs, chunks, what is done, and the write tasks."""

    kernel_name: str
    outputs: tuple
    first: object  # the first input, as a dask array
    done: frozenset
    status: object  # one write task per chunk, as a dask array of chunks (1, ...)
    stale: tuple = ()

    @property
    def grid(self) -> list:
        return list(np.ndindex(*self.first.numblocks))

    def written(self) -> int:
        return len(done_chunks(self.outputs[0], self.first.ndim))

def _scalar_identity(s):
    if isinstance(s, np.generic):
        return [np.dtype(type(s)).str, s.tobytes().hex()]
    return [type(s).__name__, repr(s)]


def _plan(kernel, inputs, outputs, scalars, chunks, resume, client) -> _Plan:
    import dask.array as da

    from daskgpu._dask.mapping import Out, map_kernel
    from daskgpu._runtime.ptx_kernel import PTXKernel

    # Images without their Python function (a bundle's) run on GPUs only.
    if (isinstance(kernel, PTXKernel) and backends.current().simulated
            and all(im.py_func is None for im in kernel.images)):
        raise BatchError(
            f"kernel {kernel.__name__!r} is PTX only (a bundle), which the CUDA simulator "
            "cannot run; run it on GPUs, or give the kernel as MODULE:FUNCTION to simulate")
    arrays = open_inputs(inputs, chunks)
    first = arrays[0]
    outs = output_specs(outputs, first.dtype)
    if not outs:
        raise BatchError("a batch needs at least one output: (path, dtype)")
    check_no_overlap(inputs, [p for p, _ in outs])
    if any(len(set(c[:-1])) > 1 or (len(c) > 1 and c[-1] > c[0]) for c in first.chunks):
        raise BatchError(f"the job's chunks {first.chunks} are irregular; zarr needs one "
                         "chunk shape: pass chunks=")
    chunksize = tuple(c[0] if c else 0 for c in first.chunks)

    scalars = tuple(scalars)
    try:
        results = map_kernel(kernel, *(Out(dt, like=first) for _, dt in outs), *scalars,
                             *arrays)
        examples = ([np.empty((1,) * first.ndim, dt) for _, dt in outs] + list(scalars)
                    + [np.empty((1,) * a.ndim, a.dtype) for a in arrays])
        image = kernel.select_image(examples)
    except TypeError as exc:
        raise BatchError(
            f"kernel {getattr(kernel, '__name__', kernel)!r} does not fit this batch, which "
            f"calls it as (outputs, scalars, inputs) = ({len(outs)}, {len(scalars)}, "
            f"{len(arrays)}) arrays/values:\n{exc}") from None
    results = (results,) if not isinstance(results, tuple) else results
    results = results[:len(outs)]  # inputs the kernel writes are not stored

    # What the chunks depend on besides their input blocks, whose fingerprints
    # each chunk's marker holds.
    job = {
        "format": "daskgpu-batch-2",
        "kernel": kernel.__name__, "image": image.hash,
        "inputs": [[os.path.abspath(os.fspath(p)), list(a.shape), a.dtype.str]
                   for p, a in zip(inputs, arrays)],
        "scalars": [_scalar_identity(s) for s in scalars],
        "outputs": [dt.str for _, dt in outs],
        "shape": list(first.shape), "chunks": list(chunksize),
    }
    done = None
    for index, (path, dt) in enumerate(outs):
        have = prepare_output(path, dt, first.shape, chunksize, dict(job, output=index),
                               resume)
        done = have if done is None else done & have
    paths = [p for p, _ in outs]
    done, stale = _verified(done, paths, arrays, client)
    for chunk in stale:  # computed again below; a crash before then must not trust them
        for path in paths:
            _ledger.forget(path, chunk)

    writer = ChunkWriter(paths, chunksize)
    status = da.map_blocks(writer, *results, *arrays, name=f"batch-write-{secrets.token_hex(8)}",
                           chunks=tuple((1,) * n for n in first.numblocks),
                           meta=np.empty((0,) * first.ndim, np.bool_))
    return _Plan(kernel.__name__, tuple(paths), first, frozenset(done), status, tuple(stale))


def _verified(done, paths, arrays, client):
    """``(still good, stale)``: the recorded chunks checked on the cluster, in grid order."""
    import dask.array as da

    if not done:
        return set(), ()
    first = arrays[0]
    check = da.map_blocks(ChunkCheck(paths), *arrays,
                          name=f"batch-check-{secrets.token_hex(8)}",
                          chunks=tuple((1,) * n for n in first.numblocks),
                          meta=np.empty((0,) * first.ndim, np.bool_))
    chunks = sorted(done)
    results = client.get(check.__dask_graph__(), [(check.name, *c) for c in chunks])
    good = {c for c, r in zip(chunks, results) if bool(np.asarray(r).all())}
    return good, tuple(c for c in chunks if c not in good)


def _execute(plan, client, retries, progress, max_chunks) -> BatchReport:
    from distributed import as_completed

    from daskgpu._dask.mapping import workers_info

    start = time.perf_counter()
    grid = plan.grid
    skipped = tuple(c for c in grid if c in plan.done)
    todo = [c for c in grid if c not in plan.done]
    now, later = (todo, []) if max_chunks is None else (todo[:max_chunks], todo[max_chunks:])
    if progress:
        workers = len(workers_info(client))
        where = f"{workers} worker{'s' * (workers != 1)}" + (
            " (simulated)" if backends.current().simulated else "")
        chunk = "x".join(str(c[0]) for c in plan.first.chunks)
        sys.stderr.write(
            f"batch {plan.kernel_name}: {len(grid)} chunks of {chunk} over "
            f"{'x'.join(map(str, plan.first.shape))} on {where}; {len(skipped)} already "
            f"written, {len(now)} to compute"
            + (f" ({len(plan.stale)} stale)" if plan.stale else "")
            + (f", {len(later)} left for later runs" if later else "") + "\n")
    bar = _progress_bar(len(grid), len(skipped), progress)
    computed, failed = [], {}
    # Dask retries a failing task (the read, the launch or the write) itself.
    futures = client.get(plan.status.__dask_graph__(), [(plan.status.name, *c) for c in now],
                         sync=False, retries=retries) if now else []
    try:
        for fut in as_completed(futures):
            if fut.status == "finished":
                computed.append(fut.key[1:])
            else:
                failed[fut.key[1:]] = _describe(fut)
                bar.set_postfix_str(f"{len(failed)} failed", refresh=False)
            bar.update(1)
    finally:
        client.cancel(futures)  # releases results and errors on the cluster
        bar.close()
    order = {c: i for i, c in enumerate(grid)}
    return BatchReport(
        outputs=plan.outputs, chunks=len(grid), skipped=skipped,
        computed=tuple(sorted(computed, key=order.get)), failed=failed,
        remaining=tuple(later), retries=int(retries),
        seconds=time.perf_counter() - start, stale=plan.stale,
    )


def _progress_bar(total, before, enabled):
    """A tqdm bar on stderr over the job's chunks, starting at those written before."""
    from tqdm import tqdm

    # Off a terminal, redraw at most every few seconds rather than per chunk.
    tty = enabled and sys.stderr.isatty()
    return tqdm(total=total, initial=before, unit="chunk", file=sys.stderr,
                disable=not enabled, mininterval=0.1 if tty else 5.0, dynamic_ncols=tty,
                desc="chunks written")


def _describe(future) -> str:
    try:
        exc = future.exception()
    except Exception as e:  # cancelled, or the cluster lost it
        exc = e
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
