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

The ledger is :mod:`daskgpu._dask.ledger`; the ``daskgpu batch`` command line
is :mod:`daskgpu._cli.batch`.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import re
import secrets
import shutil
import sys
import time

import numpy as np

from daskgpu._dask import ledger as _ledger
from daskgpu._dask.ledger import LEDGER, done_chunks
from daskgpu._errors import DaskGPUError

__all__ = ["BatchError", "BatchReport", "NpyFile", "done_chunks", "run_batch"]

_NPY_MAGIC = b"\x93NUMPY"


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


# -- inputs ---------------------------------------------------------------------
def _npy_header(path):
    """``(shape, dtype)`` from a ``.npy`` file's header, reading nothing else."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise BatchError(
                    f"{path!r} is not a .npy file (it lacks the .npy header); give an "
                    "array written by numpy.save, or a zarr array directory")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except IsADirectoryError:
        raise BatchError(f"{path!r} is a directory, not a .npy file; a zarr input is a "
                         "directory without the .npy suffix") from None
    except FileNotFoundError:
        raise BatchError(f"no input at {path!r}: the file does not exist") from None
    except (OSError, ValueError) as exc:
        raise BatchError(f"cannot read {path!r} as a .npy file ({exc}); give an array "
                         "written by numpy.save") from None
    if dtype.hasobject:
        raise BatchError(f"{path!r} holds Python objects; batch reads numeric arrays only "
                         "(save them with a numeric dtype)")
    return tuple(shape), dtype


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
        self.shape, self.dtype = _npy_header(self.path)
        self.ndim = len(self.shape)

    def __getitem__(self, index):
        if self._map is None:
            self._map = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return np.array(self._map[index])

    def __reduce__(self):
        return NpyFile, (self.path,)

    def __dask_tokenize__(self):
        st = os.stat(self.path)
        return "daskgpu.NpyFile", self.path, st.st_mtime_ns, st.st_size

    def __repr__(self):
        return f"NpyFile({self.path!r}, shape={self.shape}, dtype={self.dtype})"


def _open_source(path):
    """``(source, kind)``: an :class:`NpyFile` or a zarr array, checked, unchunked."""
    path = os.fspath(path)
    if path.endswith(".npy") or (os.path.isfile(path) and _is_npy(path)):
        return NpyFile(path), "npy"
    if not os.path.exists(path):
        raise BatchError(f"no input at {path!r}: give a zarr array directory or a .npy file")
    if os.path.isfile(path):
        raise BatchError(f"{path!r} is a file but neither a .npy file nor a zarr array "
                         "(a directory); give an array written by numpy.save, or a zarr "
                         "array")
    zarr = _zarr()
    try:
        return zarr.open_array(path, mode="r"), "zarr"
    except Exception as exc:  # a group, or not zarr at all
        raise BatchError(f"cannot open {path!r} as a zarr array ({type(exc).__name__}: "
                         f"{exc}); give a zarr array, or a .npy file") from None


def _is_npy(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
    except OSError:
        return False


def open_input(path, chunks=None):
    """A dask array reading ``path``: a zarr array (directory) or a ``.npy`` file.

    ``chunks`` defaults to the zarr array's chunks, else dask's ``"auto"``.
    """
    import dask.array as da
    from dask.base import tokenize

    source, kind = _open_source(path)
    _check_dtype(path, source.dtype)
    if kind == "npy":
        meta = np.empty((0,) * source.ndim, source.dtype)
        return da.from_array(source, chunks=chunks or "auto", meta=meta,
                             name=f"npy-{tokenize(source, chunks)}")
    return da.from_zarr(source, chunks=chunks)


def _check_dtype(path, dtype):
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.kind not in "biufc":
        raise BatchError(f"input {os.fspath(path)!r} has dtype {dtype}; batch reads numeric "
                         "arrays (bool, integer, float or complex)")
    if not dtype.isnative:
        order = {">": "big-endian", "<": "little-endian"}[dtype.byteorder]
        raise BatchError(
            f"input {os.fspath(path)!r} is {order} ({dtype.str}), but kernels take this "
            f"machine's byte order ({dtype.newbyteorder('=').str}); convert it first, e.g. "
            f"numpy.save(path, a.astype({dtype.newbyteorder('=').str!r}))")


def _zarr():
    try:
        import zarr
    except ModuleNotFoundError:
        raise BatchError("daskgpu batch stores its outputs with zarr, which is not "
                         "installed: pip install 'daskgpu[batch]'") from None
    return zarr


def _check_chunks(chunks, ndim):
    """``chunks`` as dask takes it, refused here when dask would fail obscurely."""
    if chunks is None or chunks == "auto":
        return chunks
    parts = chunks if isinstance(chunks, tuple | list) else (chunks,)
    if isinstance(chunks, tuple | list) and len(parts) != ndim:
        raise BatchError(f"chunks={tuple(chunks)!r} has {len(parts)} dimension(s), but the "
                         f"inputs have {ndim}; give one size per dimension, or one number")
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 1:
            raise BatchError(f"chunks={chunks!r}: each chunk size must be a whole number of "
                             "at least 1, e.g. chunks=1000 or chunks=(256, 256)")
    return tuple(int(p) for p in parts) if isinstance(chunks, tuple | list) else int(chunks)


def _paths(value, what):
    """A sequence of ``inputs`` / ``outputs``, never a lone path iterated by character."""
    if isinstance(value, str | bytes | os.PathLike):
        raise BatchError(f"{what} is a list of paths, got the single path {value!r}; write "
                         f"{what}=[{os.fspath(value)!r}]")
    try:
        return list(value)
    except TypeError:
        raise BatchError(f"{what} is a list of paths, got {value!r}") from None


def _output_paths(outputs) -> list:
    """The path of each output, given as a path or a ``(path, dtype)`` pair."""
    paths = []
    for o in _paths(outputs, "outputs"):
        if isinstance(o, str | os.PathLike):
            paths.append(os.fspath(o))
        elif (isinstance(o, tuple | list) and len(o) == 2
              and isinstance(o[0], str | os.PathLike)):
            paths.append(os.fspath(o[0]))
        else:
            raise BatchError(f"an output is a path or a (path, dtype) pair, got {o!r}")
    return paths


def _output_specs(outputs, default_dtype) -> list:
    """``[(absolute path, dtype)]`` from paths or ``(path, dtype)`` pairs, checked."""
    specs = []
    for o, path in zip(_paths(outputs, "outputs"), _output_paths(outputs)):
        dtype = default_dtype
        if not isinstance(o, str | os.PathLike) and o[1] is not None:
            dtype = o[1]
            try:
                dtype = np.dtype(dtype)
            except (TypeError, ValueError):
                raise BatchError(f"output {o!r}: {dtype!r} is not a dtype; write e.g. "
                                 f"({os.fspath(path)!r}, 'float32')") from None
        if path.endswith(".npy"):
            raise BatchError(
                f"output {path!r} ends in .npy, but batch writes zarr arrays (chunk by chunk, "
                "resumable); name it e.g. "
                f"{path[:-4] + '.zarr'!r}, and convert afterwards if you need a .npy: "
                "numpy.save(path, zarr.open_array(output)[...])")
        if dtype is not None and (dtype.hasobject or dtype.kind not in "biufc"
                                  or not dtype.isnative):
            raise BatchError(f"output {path!r}: dtype {dtype.str} cannot be written; give a "
                             "numeric dtype in this machine's byte order, e.g. float32")
        specs.append((os.path.abspath(path), dtype))
    if len({p for p, _ in specs}) != len(specs):
        raise BatchError(f"an output path appears twice in {[p for p, _ in specs]}")
    return specs


def _inside(path, folder) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_no_overlap(inputs, outputs) -> None:
    """Refuse outputs that are, contain, or lie inside an input (or another output).

    Runs before anything is written, resuming or not: writing an output that
    is an input destroys the input.

    Examples
    --------
    >>> check_no_overlap(["/d/x.zarr"], ["/d/z.zarr"])
    >>> check_no_overlap(["/d/x.zarr"], ["/d/x.zarr/out.zarr"])
    Traceback (most recent call last):
    ...
    daskgpu._dask.batch.BatchError: output '/d/x.zarr/out.zarr' lies inside the input '/d/x.zarr'; writing it would change the input: choose an output path outside every input
    """
    real_in = [(os.fspath(p), os.path.realpath(os.fspath(p))) for p in inputs]
    real_out = [(os.fspath(p), os.path.realpath(os.fspath(p))) for p in outputs]
    for out, r_out in real_out:
        for inp, r_in in real_in:
            if r_out == r_in:
                how = "is the input"
            elif _inside(r_out, r_in):
                how = "lies inside the input"
            elif _inside(r_in, r_out):
                how = "contains the input"
            else:
                continue
            raise BatchError(f"output {out!r} {how} {inp!r}; writing it would change the "
                             "input: choose an output path outside every input")
        for other, r_other in real_out:
            if other != out and _inside(r_out, r_other):
                raise BatchError(f"output {out!r} lies inside the output {other!r}; choose "
                                 "outputs apart from each other")


# -- outputs --------------------------------------------------------------------
def _prepare_output(path, dtype, shape, chunksize, job, resume) -> set:
    """Create or reopen one output; return the chunks its ledger has.

    A new output is built in a hidden sibling directory and renamed into
    place, so a killed run leaves the old output or the new one, whole.
    """
    _remove_leftovers(path)
    if resume and os.path.exists(path):
        try:
            previous = _ledger.read_job(path)
        except _ledger.LedgerError as exc:
            raise BatchError(str(exc)) from None
        if previous is None:
            raise BatchError(
                f"{path!r} exists but was not written by daskgpu batch (it has no "
                f"{LEDGER}/{_ledger.JOB}); remove it, choose another output, or pass "
                "--no-resume (resume=False) to overwrite it")
        if previous != job:
            differ = _ledger.job_differences(job, previous)
            names = {"inputs": "inputs (paths, shapes or dtypes)", "image": "kernel code",
                     "kernel": "kernel", "scalars": "scalars", "chunks": "chunking",
                     "shape": "shape", "outputs": "output dtypes"}
            raise BatchError(
                f"{path!r} holds chunks of another job (different "
                f"{', '.join(names.get(d, d) for d in differ)}), so they cannot be resumed; "
                "pass --no-resume (resume=False) to overwrite this output and start over, "
                "or choose another output")
        _ledger.remove_temporaries(path)
        return done_chunks(path, len(shape))
    if os.path.exists(path) and not _overwritable(path):
        raise BatchError(f"{path!r} exists and is not a zarr array; daskgpu batch does not "
                         "overwrite it: remove it or choose another output")
    _create_output(path, dtype, shape, chunksize, job)
    return set()


def _sibling(path, what) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.daskgpu-{what}-{secrets.token_hex(4)}")


def _remove_leftovers(path) -> None:
    """Remove the half-built or half-removed siblings of a killed run's output."""
    folder, name = os.path.split(path)
    pattern = re.compile(re.escape(f".{name}.daskgpu-") + r"(new|old)-[0-9a-f]{8}")
    try:
        names = os.listdir(folder or ".")
    except FileNotFoundError:
        return
    for n in names:
        if pattern.fullmatch(n):
            shutil.rmtree(os.path.join(folder, n), ignore_errors=True)


def _create_output(path, dtype, shape, chunksize, job) -> None:
    from daskgpu._files import fsync, fsync_up

    zarr = _zarr()
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise BatchError(f"cannot create the output {path!r}: the directory {folder!r} does "
                         "not exist")
    new = _sibling(path, "new")
    try:
        zarr.open_array(new, mode="w", shape=shape, chunks=chunksize, dtype=dtype)
        _ledger.start(new, job)
        for root, _dirs, files in os.walk(new):
            for f in files:
                fsync(os.path.join(root, f))
            fsync_up(root, new)
        old = None
        if os.path.exists(path):
            old = _sibling(path, "old")
            os.rename(path, old)
        os.rename(new, path)
        fsync(folder)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _overwritable(path) -> bool:
    if not os.path.isdir(path):
        return False
    names = set(os.listdir(path))
    return not names or bool(names & {LEDGER, "zarr.json", ".zarray"})


def _open_output(path, mode="r+"):
    """The output zarr array, storing every chunk it is given, fill values too.

    A chunk left out because it is all fill value would be indistinguishable
    from a chunk that went missing.
    """
    import zarr

    z = zarr.open_array(path, mode=mode)
    if hasattr(z, "with_config"):  # zarr 3
        return z.with_config({"write_empty_chunks": True})
    return zarr.open_array(path, mode=mode, write_empty_chunks=True)  # zarr 2


def _chunk_file(z, path, block_id) -> str:
    meta = getattr(z, "metadata", None)  # zarr 3; zarr 2 has _chunk_key
    key = (meta.encode_chunk_key(block_id) if hasattr(meta, "encode_chunk_key")
           else z._chunk_key(block_id))
    return os.path.join(path, *key.split("/"))


class _ChunkWriter:
    """The per-chunk task: store one block in each output, then record it as done.

    Called with the output blocks, then the input blocks they were computed
    from, whose fingerprints go into the markers.
    """

    __slots__ = ("paths", "chunksize")

    def __init__(self, paths, chunksize):
        self.paths, self.chunksize = tuple(paths), tuple(chunksize)

    def __reduce__(self):
        return _ChunkWriter, (self.paths, self.chunksize)

    def __call__(self, *blocks, block_id=None):
        from daskgpu._files import fsync_up

        outs, ins = blocks[:len(self.paths)], blocks[len(self.paths):]
        region = tuple(slice(i * n, i * n + s)
                       for i, n, s in zip(block_id, self.chunksize, outs[0].shape))
        stored = []
        for path, block in zip(self.paths, outs):
            z = _open_output(path)
            z[region] = block
            chunk_file = _chunk_file(z, path, block_id)
            fsync_up(chunk_file, path)
            stored.append(_ledger.file_digest(chunk_file))
        inputs = [_ledger.block_digest(b) for b in ins]
        # Only now, with the data on disk in every output, is the chunk finished.
        for path, digest in zip(self.paths, stored):
            _ledger.record(path, block_id, inputs, digest)
        return np.ones((1,) * len(block_id), np.bool_)


class _ChunkCheck:
    """The per-chunk check of a rerun: whether an earlier run's chunk still holds.

    True when every output's marker records the fingerprints of these input
    blocks and of the chunk file as it is stored now.
    """

    __slots__ = ("paths",)

    def __init__(self, paths):
        self.paths = tuple(paths)

    def __reduce__(self):
        return _ChunkCheck, (self.paths,)

    def __call__(self, *ins, block_id=None):
        inputs = [_ledger.block_digest(b) for b in ins]
        ok = True
        for path in self.paths:
            marker = _ledger.read_marker(path, block_id)
            if not marker or marker.get("inputs") != inputs:
                ok = False
                break
            stored = _ledger.file_digest(_chunk_file(_open_output(path, "r"), path, block_id))
            if stored is None or stored != marker.get("output"):
                ok = False
                break
        return np.full((1,) * len(block_id), ok, np.bool_)


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
    inputs = _paths(inputs, "inputs")
    if not inputs:
        raise BatchError("a batch needs at least one input array")
    # Before a cluster starts or anything is written.
    check_no_overlap(inputs, _output_paths(outputs))
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
            plan = _plan(kernel, inputs, outputs, scalars, chunks, resume, client)
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
    stale: tuple = ()

    @property
    def grid(self) -> list:
        return list(np.ndindex(*self.first.numblocks))

    def written(self) -> int:
        return len(done_chunks(self.outputs[0], self.first.ndim))


def _open_inputs(inputs, chunks) -> list:
    """The inputs as dask arrays of one shape and one chunking."""
    sources = [_open_source(p)[0] for p in inputs]
    first = sources[0]
    for path, s in zip(inputs, sources):
        _check_dtype(path, s.dtype)
        if tuple(s.shape) != tuple(first.shape):
            raise BatchError(f"input {os.fspath(path)!r} has shape {tuple(s.shape)}, but "
                             f"{os.fspath(inputs[0])!r} has {tuple(first.shape)}; batch "
                             "inputs share one shape")
    if not first.shape:
        raise BatchError(f"input {os.fspath(inputs[0])!r} is a 0-d array; batch runs over "
                         "arrays of at least one dimension")
    chunks = _check_chunks(chunks, len(first.shape))
    arrays = [open_input(p, chunks) for p in inputs]
    # By default the first zarr input's chunks, so that it is read as stored.
    target = next((a.chunks for p, a in zip(inputs, arrays)
                   if chunks is None and not isinstance(_open_source(p)[0], NpyFile)),
                  arrays[0].chunks)
    return [a if a.chunks == target else open_input(p, target)
            for p, a in zip(inputs, arrays)]


def _scalar_identity(s):
    if isinstance(s, np.generic):
        return [np.dtype(type(s)).str, s.tobytes().hex()]
    return [type(s).__name__, repr(s)]


def _plan(kernel, inputs, outputs, scalars, chunks, resume, client) -> _Plan:
    import dask.array as da

    from daskgpu import _config
    from daskgpu._dask.mapping import Out, map_kernel
    from daskgpu._runtime.launch import PTXKernel

    if (isinstance(kernel, PTXKernel) and _config.simulating()
            and all(im.py_func is None for im in kernel.images)):
        raise BatchError(
            f"kernel {kernel.__name__!r} is PTX only (a bundle), which the CUDA simulator "
            "cannot run; run it on GPUs, or give the kernel as MODULE:FUNCTION to simulate")
    arrays = _open_inputs(inputs, chunks)
    first = arrays[0]
    outs = _output_specs(outputs, first.dtype)
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
        image = kernel._select(examples)
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
        have = _prepare_output(path, dt, first.shape, chunksize, dict(job, output=index),
                               resume)
        done = have if done is None else done & have
    paths = [p for p, _ in outs]
    done, stale = _verified(done, paths, arrays, client)
    for chunk in stale:  # computed again below; a crash before then must not trust them
        for path in paths:
            _ledger.forget(path, chunk)

    writer = _ChunkWriter(paths, chunksize)
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
    check = da.map_blocks(_ChunkCheck(paths), *arrays,
                          name=f"batch-check-{secrets.token_hex(8)}",
                          chunks=tuple((1,) * n for n in first.numblocks),
                          meta=np.empty((0,) * first.ndim, np.bool_))
    chunks = sorted(done)
    results = client.get(check.__dask_graph__(), [(check.name, *c) for c in chunks])
    good = {c for c, r in zip(chunks, results) if bool(np.asarray(r).all())}
    return good, tuple(c for c in chunks if c not in good)


def _execute(plan, client, retries, progress, max_chunks) -> BatchReport:
    from distributed import as_completed

    from daskgpu import _config
    from daskgpu._dask.mapping import workers_info

    start = time.perf_counter()
    grid = plan.grid
    skipped = tuple(c for c in grid if c in plan.done)
    todo = [c for c in grid if c not in plan.done]
    now, later = (todo, []) if max_chunks is None else (todo[:max_chunks], todo[max_chunks:])
    if progress:
        workers = len(workers_info(client))
        where = f"{workers} worker{'s' * (workers != 1)}" + (
            " (simulated)" if _config.simulating() else "")
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
