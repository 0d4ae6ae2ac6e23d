"""What a ``daskgpu batch`` job writes: its output zarr arrays and the per-chunk tasks.

Outputs never overlap an input. A new output is created whole (built in a
hidden sibling, then renamed) and written by :class:`ChunkWriter`, one task
per stored chunk or per group of them (:mod:`daskgpu._dask.batch.groups`),
which records each chunk in the output's ledger
(:mod:`daskgpu._dask.batch.ledger`) with the fingerprints of its input blocks
and stored data, the region of its launch and the job instance's nonce;
:class:`ChunkCheck` tells a rerun which recorded chunks still hold, and where
each was launched. Only a zarr array that a batch job
created (it has a ledger) is ever replaced. :mod:`daskgpu._dask.batch.job`
plans and runs the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil

import numpy as np

from daskgpu._dask.batch import ledger as _ledger
from daskgpu._dask.batch.inputs import as_paths, import_zarr
from daskgpu._dask.batch.ledger import LEDGER, done_chunks
from daskgpu._dask.batch.lock import writers
from daskgpu._errors import BatchError, LedgerError

__all__ = ["ChunkCheck", "ChunkWriter", "check_no_overlap", "output_paths", "output_specs",
           "prepare_output"]


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
def prepare_output(path, dtype, shape, chunksize, job, resume):
    """Create or reopen one output; return ``(chunks its ledger has, job nonce)``.

    ``job`` is the job's identity and the new instance's ``nonce``. Resuming
    keeps the recorded instance (and its nonce) when the job, and the output's
    zarr metadata as the job created it, are unchanged. A new output is built
    in a hidden sibling directory and renamed into place, so a killed run
    leaves the old output or the new one, whole. Call it only while holding
    the output's lock.
    """
    _remove_leftovers(path)
    if os.path.exists(path):
        _check_replaceable(path)  # resuming or not: nothing else is ever touched
        if resume and os.listdir(path):
            previous = _resumable_job(path, job)
            _ledger.tidy(path, _numblocks(shape, chunksize))
            _ledger.remove_temporaries(path)
            return done_chunks(path, len(shape)), previous["nonce"]
    _create_output(path, dtype, shape, chunksize, job)
    return set(), job["nonce"]


def _numblocks(shape, chunksize) -> tuple:
    return tuple(-(-s // c) if c else 0 for s, c in zip(shape, chunksize))


_NAMES = {"inputs": "inputs (paths, shapes or dtypes)", "image": "kernel code",
          "kernel": "kernel", "scalars": "scalars", "chunks": "chunking", "shape": "shape",
          "outputs": "output dtypes", "order": "argument order", "format": "ledger format"}


def _resumable_job(path, job) -> dict:
    """The job recorded in output ``path``, checked to be ``job`` with its output intact."""
    try:
        previous = _ledger.read_job(path)
    except LedgerError as exc:
        raise BatchError(str(exc)) from None
    if previous is None:  # a ledger without its job: damaged
        raise BatchError(
            f"the batch ledger of {path!r} has no {_ledger.JOB}, so what the output holds is "
            "unknown; pass --no-resume (resume=False) to overwrite the output and start "
            "over, or choose another output")
    now = zarr_metadata(path)  # a damaged zarr.json first: it hides what the output holds
    differ = _ledger.job_differences(job, previous)
    if differ:
        raise BatchError(
            f"{path!r} holds chunks of another job (different "
            f"{', '.join(_NAMES.get(d, d) for d in differ)}), so they cannot be resumed; "
            "pass --no-resume (resume=False) to overwrite this output and start over, "
            "or choose another output")
    if now != previous.get("zarr") or not isinstance(previous.get("nonce"), str):
        recorded = previous.get("zarr") if isinstance(previous.get("zarr"), dict) else {}
        keys = sorted(k for k in now.keys() | recorded.keys() if now.get(k) != recorded.get(k))
        raise BatchError(
            f"the zarr metadata of {path!r} changed since the job created it (in "
            f"{', '.join(keys) or 'job.json'}), so its chunks cannot be trusted; pass "
            "--no-resume (resume=False) to overwrite it and start over")
    return previous


def zarr_metadata(path) -> dict:
    """The array metadata of the zarr array ``path`` (v3 or v2), without its attributes.

    Raises
    ------
    BatchError
        When the metadata file is missing, damaged or not an array's.
    """
    for name in ("zarr.json", ".zarray"):
        file = os.path.join(path, name)
        try:
            with open(file, "rb") as f:
                meta = json.loads(f.read(1 << 20).decode("utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BatchError(
                f"the zarr metadata {file!r} is damaged ({type(exc).__name__}: {exc}); pass "
                "--no-resume (resume=False) to overwrite the output and start over") from None
        if not isinstance(meta, dict) or meta.get("node_type", "array") != "array":
            raise BatchError(f"{path!r} is not a zarr array ({file} says otherwise); "
                             "choose another output")
        return {k: v for k, v in meta.items() if k != "attributes"}
    raise BatchError(f"{path!r} has no zarr metadata (zarr.json); pass --no-resume "
                     "(resume=False) to overwrite the output and start over")


def _check_replaceable(path) -> None:
    """Refuse to replace ``path`` unless it is empty or an array a batch job created.

    A batch-created array holds a ledger and no group metadata; a damaged
    ``zarr.json`` there is the job's own and may be replaced.
    """
    if not os.path.isdir(path):
        raise BatchError(f"{path!r} exists and is not a directory; daskgpu batch does not "
                         "overwrite it: remove it or choose another output")
    names = set(os.listdir(path))
    if not names:
        return
    group = ".zgroup" in names or _node_type(os.path.join(path, "zarr.json")) == "group"
    if group:
        raise BatchError(f"{path!r} is a zarr group, not an array that daskgpu batch "
                         "created; it is never deleted: choose another output (a new "
                         f"array inside it, e.g. {os.path.join(path, 'out')!r}, works)")
    if not os.path.isdir(os.path.join(path, LEDGER)):
        what = ("a zarr array that daskgpu batch did not create (it has no "
                f"{LEDGER}/{_ledger.JOB})" if names & {"zarr.json", ".zarray"}
                else "not a zarr array")
        raise BatchError(f"{path!r} exists and is {what}; daskgpu batch replaces only "
                         "outputs it created: remove it yourself or choose another output")


def _node_type(file):
    try:
        with open(file, "rb") as f:
            meta = json.loads(f.read(1 << 20).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return meta.get("node_type") if isinstance(meta, dict) else None


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

    zarr = import_zarr()
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise BatchError(f"cannot create the output {path!r}: the directory {folder!r} does "
                         "not exist")
    new = _sibling(path, "new")
    try:
        zarr.open_array(new, mode="w", shape=shape, chunks=chunksize, dtype=dtype)
        _ledger.start(new, dict(job, zarr=zarr_metadata(new)))
        for root, _dirs, files in os.walk(new):
            for f in files:
                fsync(os.path.join(root, f))
            fsync_up(root, new)
        old = None
        # Exclusive: chunk tasks still writing to the old output finish first, and
        # every later one finds the new job's nonce.
        with writers(path, exclusive=True):
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
    """The write task: store each chunk of a task's block in every output, then record it.

    Called with the output blocks, then the input blocks they were computed
    from, whose fingerprints go into the markers, then, when ``masked``, a
    bool block saying which of the block's chunks to write (the others are
    done, or left for a later run); ``block_id`` is the task's index. A block
    holds ``per_task`` stored chunks along each axis (fewer at the far
    edges): one, unless the job's launches are grouped
    (:mod:`~daskgpu._dask.batch.groups`). Each chunk is recorded on its own,
    once its data is on disk in every output, with the block's region as the
    launch that computed it. ``nonces`` are the job
    instance's, one per output: an output recreated since by another job
    (another nonce in its ``job.json``) is not written. Returns which of the
    block's chunks it wrote.
    """

    __slots__ = ("paths", "chunksize", "nonces", "per_task", "masked")

    def __init__(self, paths, chunksize, nonces, per_task=None, masked=False):
        self.paths, self.chunksize, self.nonces = tuple(paths), tuple(chunksize), tuple(nonces)
        self.per_task = tuple(per_task or (1,) * len(self.chunksize))
        self.masked = bool(masked)

    def __reduce__(self):
        return ChunkWriter, (self.paths, self.chunksize, self.nonces, self.per_task,
                             self.masked)

    def __call__(self, *blocks, block_id=None):
        # From the nonce check to the marker, no run may swap an output in: a write
        # in flight lands in the output it checked (see lock.writers).
        with contextlib.ExitStack() as held:
            for path in sorted(set(self.paths)):
                held.enter_context(writers(path))
            return self._write(blocks, block_id)

    def _write(self, blocks, block_id):
        from daskgpu._files import at_once, fsync, fsync_up

        outs = blocks[:len(self.paths)]
        ins = blocks[len(self.paths):len(blocks) - self.masked]
        chunks = _block_chunks(outs[0].shape, self.chunksize)
        wanted = (np.asarray(blocks[-1], np.bool_) if self.masked
                  else np.ones(chunks, np.bool_))
        first = tuple(b * k for b, k in zip(block_id, self.per_task))
        start = tuple(f * c for f, c in zip(first, self.chunksize))
        local = [tuple(int(i) for i in ix) for ix in np.argwhere(wanted)]
        stored = {}
        for path, nonce, block in zip(self.paths, self.nonces, outs):
            _check_owner(path, nonce, first)
            z = _open_output(path)
            if wanted.all():  # one write: zarr stores the block's chunks together
                z[tuple(slice(s, s + m) for s, m in zip(start, block.shape))] = block
            else:
                for ix in local:
                    piece = _piece(ix, self.chunksize, block.shape)
                    z[tuple(slice(s + p.start, s + p.stop) for s, p in zip(start, piece))] = (
                        block[piece])
            files = [_chunk_file(z, path, _plus(first, ix)) for ix in local]
            at_once(fsync, files)
            for folder in dict.fromkeys(os.path.dirname(f) for f in files):
                fsync_up(folder, path)  # each new directory entry too, once
            stored[path] = [_ledger.file_digest(f) for f in files]
        # Only now, with the data on disk in every output, is each chunk finished.
        inputs = [[_ledger.block_digest(b[_piece(ix, self.chunksize, b.shape)]) for b in ins]
                  for ix in local]
        launch = (start, outs[0].shape)  # the block is what the kernel saw as its chunk
        for path, nonce in zip(self.paths, self.nonces):
            _ledger.record_all(path, [(_plus(first, ix), digests, output, launch)
                                      for ix, digests, output
                                      in zip(local, inputs, stored[path])], nonce)
        return wanted


def _block_chunks(shape, chunksize) -> tuple:
    """Stored chunks along each axis of a block of ``shape``."""
    return tuple(-(-s // c) for s, c in zip(shape, chunksize))


def _piece(local, chunksize, shape) -> tuple:
    """The slices of stored chunk ``local`` (its index within the block) in a block."""
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(local, chunksize, shape))


def _plus(first, local) -> tuple:
    return tuple(f + i for f, i in zip(first, local))


def _check_owner(path, nonce, block_id) -> None:
    try:
        job = _ledger.read_job(path) or {}
    except LedgerError:
        job = {}
    if job.get("nonce") != nonce:
        raise BatchError(f"output {path!r} was recreated by another batch job while this "
                         f"one ran; chunk {tuple(block_id)} of this job is not written there")


class ChunkCheck:
    """The check task of a rerun: whether an earlier run's chunks still hold, and the
    launch each was computed in.

    Called with a task's input blocks (``per_task`` stored chunks along each
    axis, as :class:`ChunkWriter` has them); returns, for each stored chunk, an
    object array of what its markers say: None unless every output's marker
    was written by this job instance (its nonce) and records the fingerprints
    of these input blocks and of the chunk file as it is stored now; else the
    region of the launch that computed it, ``(start, shape)`` in elements
    (:func:`~daskgpu._dask.batch.ledger.launch`), the same in every output.
    Whether that launch is the one a rerun would make is for the caller, who
    knows the layout it runs.
    """

    __slots__ = ("paths", "nonces", "chunksize", "per_task")

    def __init__(self, paths, nonces, chunksize=None, per_task=None):
        self.paths, self.nonces = tuple(paths), tuple(nonces)
        self.chunksize = None if chunksize is None else tuple(chunksize)
        self.per_task = None if per_task is None else tuple(per_task)

    def __reduce__(self):
        return ChunkCheck, (self.paths, self.nonces, self.chunksize, self.per_task)

    def __call__(self, *ins, block_id=None):
        chunksize = self.chunksize or ins[0].shape  # one chunk a block
        per_task = self.per_task or (1,) * len(block_id)
        first = tuple(b * k for b, k in zip(block_id, per_task))
        launches = np.empty(_block_chunks(ins[0].shape, chunksize), object)
        for ix in np.ndindex(*launches.shape):
            piece = _piece(ix, chunksize, ins[0].shape)
            inputs = [_ledger.block_digest(b[piece]) for b in ins]
            chunk = _plus(first, ix)
            alone = (tuple(i * c for i, c in zip(chunk, chunksize)),
                     tuple(p.stop - p.start for p in piece))
            found = {self._launch(path, nonce, chunk, inputs, alone)
                     for path, nonce in zip(self.paths, self.nonces)}
            launches[ix] = found.pop() if len(found) == 1 else None
        return launches

    @staticmethod
    def _launch(path, nonce, block_id, inputs, alone):
        """The launch recorded in ``path``'s marker of ``block_id``; None unless it holds."""
        marker = _ledger.read_marker(path, block_id)
        if not marker or marker.get("job") != nonce or marker.get("inputs") != inputs:
            return None
        stored = _ledger.file_digest(_chunk_file(_open_output(path, "r"), path, block_id))
        if stored is None or stored != marker.get("output"):
            return None
        return _ledger.launch(marker, alone)
