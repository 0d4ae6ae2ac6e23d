"""``daskgpu batch``: run a kernel over stored arrays, chunk by chunk, resumably.

Inputs are zarr arrays or ``.npy`` files; every output is a zarr array with
the chunks of the job, written one chunk per task. After a task has stored
its chunk in every output it records the chunk in each output's ledger, the
directory ``.daskgpu-done`` inside the zarr array: one empty marker file per
finished chunk, created by an atomic rename, plus ``job.json``, which says
what job the chunks belong to. A rerun of the same job computes only the
chunks without a marker, so an interrupted job loses no finished chunk. Failed
chunks are retried, then reported; the others are still written. Workers need
zarr and must see the paths of the inputs and outputs.

The ledger is :mod:`daskgpu._dask.ledger`; the ``daskgpu batch`` command line is
:mod:`daskgpu._cli.batch`.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import secrets
import sys
import time

import numpy as np

from daskgpu._dask import ledger as _ledger
from daskgpu._dask.ledger import LEDGER, done_chunks
from daskgpu._errors import DaskGPUError
from daskgpu._files import fsync

__all__ = ["BatchError", "BatchReport", "NpyFile", "done_chunks", "run_batch"]


class BatchError(DaskGPUError, ValueError):
    """A batch job that cannot start as given: its inputs, outputs or ledger."""


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
        Chunks finished by earlier runs, not computed again.
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

    @property
    def complete(self) -> bool:
        """Whether every chunk of the job is now written."""
        return len(self.skipped) + len(self.computed) == self.chunks

    def summary(self) -> str:
        """A few lines for people: counts, then each failed chunk."""
        done = len(self.skipped) + len(self.computed)
        lines = [f"{done}/{self.chunks} chunks written ({len(self.computed)} this run, "
                 f"{len(self.skipped)} before) in {self.seconds:.1f} s"]
        for chunk, error in sorted(self.failed.items()):
            lines.append(f"  chunk {chunk} failed after {self.retries + 1} attempt(s): {error}")
        if self.failed or self.remaining:
            lines.append(f"{self.chunks - done} chunk(s) to go: run the same job again to "
                         "compute only those")
        return "\n".join(lines)


# -- inputs ---------------------------------------------------------------------
class NpyFile:
    """A ``.npy`` file read lazily through a memory map: a small picklable array source.

    ``dask.array.from_array(NpyFile(path), chunks)`` puts the path in the
    graph, not the data; each task maps the file on its worker and copies out
    its chunk, so workers must see the same path.

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(6.0).reshape(2, 3))
    >>> f = NpyFile(path)
    >>> f.shape, f.dtype
    ((2, 3), dtype('float64'))
    >>> f[1, 1:]
    array([4., 5.])
    """

    def __init__(self, path):
        self.path = os.path.abspath(os.fspath(path))
        self._map = None
        try:
            header = np.load(self.path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise BatchError(f"cannot read {path!r} as a .npy file: {exc}") from None
        shape, dtype = header.shape, header.dtype
        if dtype.hasobject:
            raise BatchError(f"{path!r} holds Python objects; batch reads numeric arrays")
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)

    def __getitem__(self, index):
        if self._map is None:
            self._map = np.load(self.path, mmap_mode="r")
        return np.array(self._map[index])

    def __reduce__(self):
        return NpyFile, (self.path,)

    def __dask_tokenize__(self):
        return "daskgpu.NpyFile", self.path, os.stat(self.path).st_mtime_ns

    def __repr__(self):
        return f"NpyFile({self.path!r}, shape={self.shape}, dtype={self.dtype})"


def open_input(path, chunks=None):
    """A dask array reading ``path``: a zarr array (directory) or a ``.npy`` file.

    ``chunks`` defaults to the zarr array's chunks, else dask's ``"auto"``.
    """
    import dask.array as da
    from dask.base import tokenize

    path = os.fspath(path)
    if path.endswith(".npy"):
        source = NpyFile(path)
        meta = np.empty((0,) * source.ndim, source.dtype)
        return da.from_array(source, chunks=chunks or "auto", meta=meta,
                             name=f"npy-{tokenize(source, chunks)}")
    zarr = _zarr()
    if not os.path.exists(path):
        raise BatchError(f"no input at {path!r}: give a zarr array directory or a .npy file")
    try:
        z = zarr.open_array(path, mode="r")
    except Exception as exc:  # a group, or not zarr at all
        raise BatchError(f"cannot open {path!r} as a zarr array ({type(exc).__name__}: "
                         f"{exc}); give a zarr array, or a .npy file") from None
    return da.from_zarr(z, chunks=chunks)


def _zarr():
    try:
        import zarr
    except ModuleNotFoundError:
        raise BatchError("daskgpu batch stores its outputs with zarr, which is not "
                         "installed: pip install 'daskgpu[batch]'") from None
    return zarr


def _prepare_output(path, dtype, shape, chunksize, job, resume) -> set:
    """Create or reopen one output; return the chunks its ledger has."""
    zarr = _zarr()
    if resume and os.path.exists(path):
        previous = _ledger.read_job(path)
        if previous is None:
            raise BatchError(
                f"{path!r} exists but was not written by daskgpu batch (it has no "
                f"{LEDGER}/{_ledger.JOB}); remove it, choose another output, or pass "
                "--no-resume (resume=False) to overwrite it")
        if previous != job:
            differ = _ledger.job_differences(job, previous)
            raise BatchError(
                f"{path!r} holds chunks of another job (different {', '.join(differ)}), "
                "so they cannot be resumed; pass --no-resume "
                "(resume=False) to start over, or choose another output")
        return done_chunks(path, len(shape))
    if os.path.exists(path) and not _overwritable(path):
        raise BatchError(f"{path!r} exists and is not a zarr array; daskgpu batch does not "
                         "overwrite it: remove it or choose another output")
    zarr.open_array(path, mode="w", shape=shape, chunks=chunksize, dtype=dtype)
    _ledger.start(path, job)
    return set()


def _overwritable(path) -> bool:
    if not os.path.isdir(path):
        return False
    names = set(os.listdir(path))
    return not names or bool(names & {LEDGER, "zarr.json", ".zarray"})


class _ChunkWriter:
    """The per-chunk task: store one block in each output, then record it as done."""

    __slots__ = ("paths", "chunksize")

    def __init__(self, paths, chunksize):
        self.paths, self.chunksize = tuple(paths), tuple(chunksize)

    def __reduce__(self):
        return _ChunkWriter, (self.paths, self.chunksize)

    def __call__(self, *blocks, block_id=None):
        import zarr

        region = tuple(slice(i * n, i * n + s)
                       for i, n, s in zip(block_id, self.chunksize, blocks[0].shape))
        for path, block in zip(self.paths, blocks):
            z = zarr.open_array(path, mode="r+")
            z[region] = block
            meta = getattr(z, "metadata", None)  # zarr 3; zarr 2 has _chunk_key
            key = (meta.encode_chunk_key(block_id) if hasattr(meta, "encode_chunk_key")
                   else z._chunk_key(block_id))
            chunk_file = os.path.join(path, *key.split("/"))
            fsync(chunk_file)
            fsync(os.path.dirname(chunk_file))
        # Only now, with the data on disk in every output, is the chunk finished.
        _ledger.record(self.paths, block_id)
        return np.ones((1,) * len(block_id), np.bool_)


# -- running --------------------------------------------------------------------
def run_batch(kernel, inputs, outputs, *, scalars=(), chunks=None, client=None,
              simulate=None, retries=2, progress=True, resume=True, max_chunks=None):
    """Run ``kernel`` over stored arrays, writing its outputs to zarr chunk by chunk.

    The kernel is called per chunk as ``kernel(*outputs, *scalars, *inputs)``
    through :func:`~daskgpu.map_kernel`. Each finished chunk is recorded in the
    outputs' ledgers, so running the same job again computes only the chunks
    that are missing: after an interruption, a failure, or ``max_chunks``.

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        A kernel from :func:`daskgpu.jit` or :func:`daskgpu.load`.
    inputs : sequence of path
        Zarr arrays or ``.npy`` files, all of one shape. The job's chunks are
        ``chunks``, else the first zarr input's, else dask's ``"auto"``.
    outputs : sequence of path or (path, dtype)
        Zarr arrays to write, each the shape of the inputs and chunked like
        the job; the dtype defaults to the first input's. Each holds its
        ledger in ``.daskgpu-done``. Workers must see the same paths.
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
        When an input cannot be read, shapes disagree, an output exists but
        holds another job, or the kernel does not fit the arguments.

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

    if operator.index(retries) < 0:
        raise ValueError(f"retries must be 0 or more, got {retries!r}")
    plan = None
    try:
        with ExitStack() as stack:
            if client is None:
                client = _current_client()
            if client is None:
                client = _local_client(stack, simulate=simulate)
            elif simulate is not None:
                stack.enter_context(dask.config.set({"daskgpu.simulate": bool(simulate)}))
            stack.enter_context(client.as_current())  # map_kernel asks it for GPUs
            plan = _plan(kernel, inputs, outputs, scalars, chunks, resume)
            return _execute(plan, client, retries, progress, max_chunks)
    except KeyboardInterrupt as exc:
        if plan is not None:  # counted once a local cluster has finished its chunks
            exc.add_note(f"daskgpu batch interrupted: {plan.written()}/{len(plan.grid)} "
                         "chunks written; run the same job again to compute only the rest")
        raise


def _local_client(stack, devices=None, simulate=None):
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

    @property
    def grid(self) -> list:
        return list(np.ndindex(*self.first.numblocks))

    def written(self) -> int:
        return len(done_chunks(self.outputs[0], self.first.ndim))


def _open_inputs(inputs, chunks) -> list:
    """The inputs as dask arrays of one shape and one chunking."""
    arrays = [open_input(p, chunks) for p in inputs]
    first = arrays[0]
    for path, a in zip(inputs, arrays):
        if a.shape != first.shape:
            raise BatchError(f"input {os.fspath(path)!r} has shape {a.shape}, but "
                             f"{os.fspath(inputs[0])!r} has {first.shape}; batch inputs "
                             "share one shape")
    # By default the first zarr input's chunks, so that it is read as stored.
    target = next((a.chunks for p, a in zip(inputs, arrays)
                   if chunks is None and not os.fspath(p).endswith(".npy")), first.chunks)
    return [a if a.chunks == target else open_input(p, target)
            for p, a in zip(inputs, arrays)]


def _plan(kernel, inputs, outputs, scalars, chunks, resume) -> _Plan:
    import dask.array as da

    from daskgpu import _config
    from daskgpu._dask.mapping import Out, map_kernel
    from daskgpu._runtime.launch import PTXKernel

    if (isinstance(kernel, PTXKernel) and _config.simulating()
            and all(im.py_func is None for im in kernel.images)):
        raise BatchError(
            f"kernel {kernel.__name__!r} is PTX only (a bundle), which the CUDA simulator "
            "cannot run; run it on GPUs, or give the kernel as MODULE:FUNCTION to simulate")
    if not inputs:
        raise BatchError("a batch needs at least one input array")
    if not outputs:
        raise BatchError("a batch needs at least one output: (path, dtype)")
    arrays = _open_inputs(inputs, chunks)
    first = arrays[0]
    if any(len(set(c[:-1])) > 1 or (len(c) > 1 and c[-1] > c[0]) for c in first.chunks):
        raise BatchError(f"the job's chunks {first.chunks} are irregular; zarr needs one "
                         "chunk shape: pass chunks=")
    chunksize = tuple(c[0] if c else 0 for c in first.chunks)
    outs = [(os.path.abspath(os.fspath(o)), first.dtype) if isinstance(o, (str, os.PathLike))
            else (os.path.abspath(os.fspath(o[0])), np.dtype(o[1])) for o in outputs]
    if len({p for p, _ in outs}) != len(outs):
        raise BatchError(f"an output path appears twice in {[p for p, _ in outs]}")

    scalars = tuple(scalars)
    try:
        results = map_kernel(kernel, *(Out(dt, like=first) for _, dt in outs), *scalars,
                             *arrays)
        examples = ([np.empty((1,) * first.ndim, dt) for _, dt in outs] + list(scalars)
                    + [np.empty((1,) * a.ndim, a.dtype) for a in arrays])
        image = kernel._select(examples)
    except TypeError as exc:
        raise BatchError(
            f"kernel {getattr(kernel, '__name__', kernel)!r} does not fit this batch, which "
            f"calls it as (outputs, scalars, inputs) = ({len(outs)}, {len(scalars)}, "
            f"{len(arrays)}) arrays/values:\n{exc}") from None
    results = (results,) if not isinstance(results, tuple) else results
    results = results[:len(outs)]  # inputs the kernel writes are not stored

    job = {
        "kernel": kernel.__name__, "image": image.hash,
        "inputs": [[os.path.abspath(os.fspath(p)), list(a.shape), a.dtype.str]
                   for p, a in zip(inputs, arrays)],
        "scalars": [repr(s) for s in scalars],
        "outputs": [dt.str for _, dt in outs],
        "shape": list(first.shape), "chunks": list(chunksize),
    }
    done = None
    for index, (path, dt) in enumerate(outs):
        have = _prepare_output(path, dt, first.shape, chunksize, dict(job, output=index),
                               resume)
        done = have if done is None else done & have

    writer = _ChunkWriter([p for p, _ in outs], chunksize)
    status = da.map_blocks(writer, *results, name=f"batch-write-{secrets.token_hex(8)}",
                           chunks=tuple((1,) * n for n in first.numblocks),
                           meta=np.empty((0,) * first.ndim, np.bool_))
    return _Plan(kernel.__name__, tuple(p for p, _ in outs), first, frozenset(done), status)


def _execute(plan, client, retries, progress, max_chunks) -> BatchReport:
    from distributed import as_completed

    from daskgpu import _config
    from daskgpu._dask.mapping import workers_info

    start = time.perf_counter()
    grid = plan.grid
    skipped = tuple(c for c in grid if c in plan.done)
    todo = [c for c in grid if c not in plan.done]
    now, later = (todo, []) if max_chunks is None else (todo[:max_chunks], todo[max_chunks:])
    bar = _Progress(len(grid), len(skipped), enabled=progress)
    if progress:
        workers = len(workers_info(client))
        where = f"{workers} worker{'s' * (workers != 1)}" + (
            " (simulated)" if _config.simulating() else "")
        bar.start(plan.kernel_name, plan.first, where, len(now), len(later))
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
            bar.update(len(computed), len(failed))
    finally:
        client.cancel(futures)  # releases results and errors on the cluster
        bar.close(len(computed), len(failed))
    order = {c: i for i, c in enumerate(grid)}
    return BatchReport(
        outputs=plan.outputs, chunks=len(grid), skipped=skipped,
        computed=tuple(sorted(computed, key=order.get)), failed=failed,
        remaining=tuple(later), retries=int(retries),
        seconds=time.perf_counter() - start,
    )


def _describe(future) -> str:
    try:
        exc = future.exception()
    except Exception as e:  # cancelled, or the cluster lost it
        exc = e
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


class _Progress:
    """A one-line bar on stderr: redrawn in place on a terminal, every 10 % elsewhere."""

    WIDTH = 30

    def __init__(self, total, before, enabled=True, stream=None):
        self.total, self.before, self.enabled = total, before, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.shown = None  # (tenth, done, failed) last drawn

    def start(self, kernel_name, first, where, now, later):
        if self.enabled:
            chunk = "x".join(str(c[0]) for c in first.chunks)
            self.stream.write(
                f"batch {kernel_name}: {self.total} chunks of {chunk} over "
                f"{'x'.join(map(str, first.shape))} on {where}; {self.before} already "
                f"written, {now} to compute"
                + (f", {later} left for later runs" if later else "") + "\n")
            self.update(0, 0)

    def update(self, computed, failed, last=False):
        if not self.enabled:
            return
        done = self.before + computed
        state = (10 * done // max(self.total, 1), done, failed)
        if self.shown is not None and (state == self.shown or not (
                self.tty or last or state[0] != self.shown[0])):
            return
        self.shown = state
        filled = self.WIDTH * done // max(self.total, 1)
        text = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total} chunks"
                + (f", {failed} failed" if failed else "")
                + f"  {time.perf_counter() - self.t0:.1f} s")
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        self.stream.flush()

    def close(self, computed, failed):
        self.update(computed, failed, last=True)
        if self.enabled and self.tty:
            self.stream.write("\n")
