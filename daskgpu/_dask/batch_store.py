"""What a ``daskgpu batch`` job reads and writes: its inputs, outputs and chunk tasks.

Inputs are zarr arrays or ``.npy`` files, checked before anything runs (shape,
dtype, byte order, chunking). Outputs are zarr arrays that never overlap an
input, created whole (built in a hidden sibling, then renamed) and written one
chunk per task by :class:`ChunkWriter`, which records each chunk in the
outputs' ledgers (:mod:`daskgpu._dask.ledger`) with the fingerprints of its
input blocks and stored data; :class:`ChunkCheck` tells a rerun which
recorded chunks still hold. :mod:`daskgpu._dask.batch` plans and runs the job.
"""

from __future__ import annotations

import numbers
import os
import re
import secrets
import shutil

import numpy as np

from daskgpu._dask import ledger as _ledger
from daskgpu._dask.ledger import LEDGER, done_chunks
from daskgpu._errors import BatchError, LedgerError

__all__ = ["BatchError", "ChunkCheck", "ChunkWriter", "NpyFile", "as_paths", "check_no_overlap",
           "open_input", "open_inputs", "output_paths", "output_specs", "prepare_output"]

_NPY_MAGIC = b"\x93NUMPY"



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


def as_paths(value, what):
    """A sequence of ``inputs`` / ``outputs``, never a lone path iterated by character."""
    if isinstance(value, str | bytes | os.PathLike):
        raise BatchError(f"{what} is a list of paths, got the single path {value!r}; write "
                         f"{what}=[{os.fspath(value)!r}]")
    try:
        return list(value)
    except TypeError:
        raise BatchError(f"{what} is a list of paths, got {value!r}") from None


def output_paths(outputs) -> list:
    """The path of each output, given as a path or a ``(path, dtype)`` pair."""
    paths = []
    for o in as_paths(outputs, "outputs"):
        if isinstance(o, str | os.PathLike):
            paths.append(os.fspath(o))
        elif (isinstance(o, tuple | list) and len(o) == 2
              and isinstance(o[0], str | os.PathLike)):
            paths.append(os.fspath(o[0]))
        else:
            raise BatchError(f"an output is a path or a (path, dtype) pair, got {o!r}")
    return paths


def output_specs(outputs, default_dtype) -> list:
    """``[(absolute path, dtype)]`` from paths or ``(path, dtype)`` pairs, checked."""
    specs = []
    for o, path in zip(as_paths(outputs, "outputs"), output_paths(outputs)):
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
    >>> check_no_overlap(["/d/x.zarr"], ["/d/x.zarr/out.zarr"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskgpu._errors.BatchError: output '/d/x.zarr/out.zarr' lies inside the input '/d/x.zarr'; ...
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
def prepare_output(path, dtype, shape, chunksize, job, resume) -> set:
    """Create or reopen one output; return the chunks its ledger has.

    A new output is built in a hidden sibling directory and renamed into
    place, so a killed run leaves the old output or the new one, whole.
    """
    _remove_leftovers(path)
    if resume and os.path.exists(path):
        try:
            previous = _ledger.read_job(path)
        except LedgerError as exc:
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


class ChunkWriter:
    """The per-chunk task: store one block in each output, then record it as done.

    Called with the output blocks, then the input blocks they were computed
    from, whose fingerprints go into the markers.
    """

    __slots__ = ("paths", "chunksize")

    def __init__(self, paths, chunksize):
        self.paths, self.chunksize = tuple(paths), tuple(chunksize)

    def __reduce__(self):
        return ChunkWriter, (self.paths, self.chunksize)

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


class ChunkCheck:
    """The per-chunk check of a rerun: whether an earlier run's chunk still holds.

    True when every output's marker records the fingerprints of these input
    blocks and of the chunk file as it is stored now.
    """

    __slots__ = ("paths",)

    def __init__(self, paths):
        self.paths = tuple(paths)

    def __reduce__(self):
        return ChunkCheck, (self.paths,)

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


def open_inputs(inputs, chunks) -> list:
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
