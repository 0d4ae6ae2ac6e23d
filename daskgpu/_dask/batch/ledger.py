"""The durable per-chunk ledger of a ``daskgpu batch`` output.

Each output zarr array holds its ledger in the directory :data:`LEDGER`
(``.daskgpu-done``): ``job.json``, which says what job the chunks belong to,
and one marker file per finished chunk, named by its block index (``3`` or
``1.2``). A marker holds the fingerprints of what the chunk was made from and
of what was stored: the sha256 of each input block read and of the output's
stored chunk file. A rerun trusts a marker only while both still match, so a
chunk whose input changed, or whose stored data went missing or was damaged,
is computed again. A marker also records the region of the launch that
computed its chunk (:func:`launch`): a kernel sees a group of chunks launched
together as one chunk, so a rerun that would launch the chunk over another
region computes it again too. Every file is written whole or not at all (a synced
temporary file, renamed, then the directory synced), so a marker exists only
for a chunk whose data is on disk. ``job.json`` and every marker carry the job
instance's nonce, drawn when the output was created: a marker with another
nonce (written late by a run whose output was since recreated) is not trusted.
Reading the ledger, matching a rerun's job against the recorded one, and
writing job and markers is all this module does; :mod:`daskgpu._dask.batch.job`
decides what to compute.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from daskgpu._errors import LedgerError
from daskgpu._files import at_once, atomic_write, fsync

__all__ = ["INSTANCE_KEYS", "JOB", "LEDGER", "LedgerError", "block_digest", "done_chunks",
           "file_digest", "forget", "job_differences", "launch", "read_job", "read_marker",
           "record", "record_all", "remove_temporaries", "start", "tidy"]

#: The ledger directory inside each output zarr array.
LEDGER = ".daskgpu-done"
JOB = "job.json"
_MARKER_RE = re.compile(r"\d+(\.\d+)*")
#: Keys of ``job.json`` that describe this instance of the job, not what it computes:
#: its nonce and the output's zarr metadata as created.
INSTANCE_KEYS = frozenset({"nonce", "zarr"})


def marker_name(block_id) -> str:
    return ".".join(map(str, block_id))


def done_chunks(path, ndim=None) -> set:
    """The chunks recorded as finished in the ledger of the output zarr array ``path``.

    Examples
    --------
    >>> import tempfile
    >>> done_chunks(tempfile.mkdtemp())
    set()
    """
    chunks = {chunk for chunk, is_file in _entries(path) if is_file}
    return chunks if ndim is None else {c for c in chunks if len(c) == ndim}


def _entries(path):
    """``(chunk, is a regular file)`` for each marker-named entry of ``path``'s ledger."""
    try:
        with os.scandir(os.path.join(os.fspath(path), LEDGER)) as it:
            entries = [(e.name, e.is_file(follow_symlinks=False)) for e in it]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [(tuple(int(p) for p in name.split(".")), is_file) for name, is_file in entries
            if _MARKER_RE.fullmatch(name)]


def tidy(path, numblocks) -> int:
    """Remove what is not a marker of the grid ``numblocks`` from ``path``'s ledger; how many.

    A stray marker (``999`` in a grid of 10 chunks) or a directory where a
    marker belongs was not written by a run: left in place it would be counted
    as done, or block the marker's write forever. Call it only while holding
    the output's lock.

    Examples
    --------
    >>> import os, tempfile
    >>> out = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(out, LEDGER, "3"))
    >>> open(os.path.join(out, LEDGER, "999"), "w").close()
    >>> tidy(out, (10,)), done_chunks(out)
    (2, set())
    """
    import shutil

    removed = 0
    for chunk, is_file in _entries(path):
        in_grid = len(chunk) == len(numblocks) and all(
            0 <= c < n for c, n in zip(chunk, numblocks))
        if in_grid and is_file:
            continue
        entry = os.path.join(os.fspath(path), LEDGER, marker_name(chunk))
        if is_file or os.path.islink(entry):
            os.unlink(entry)
        else:
            shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed


def read_job(path):
    """The job recorded in ``path``'s ledger, or None when it has none.

    Raises
    ------
    LedgerError
        When ``job.json`` is not a JSON object (damaged by hand or by a disk).
    """
    job_file = os.path.join(path, LEDGER, JOB)
    try:
        with open(job_file, encoding="utf-8") as f:
            job = json.load(f)
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, ValueError, IsADirectoryError, NotADirectoryError) as exc:
        raise LedgerError(
            f"the batch ledger file {job_file!r} is damaged ({exc}), so what the output "
            "holds is unknown; pass --no-resume (resume=False) to overwrite the output and "
            "start over, or choose another output") from None
    if not isinstance(job, dict):
        raise LedgerError(f"the batch ledger file {job_file!r} is damaged (not a JSON "
                          "object); pass --no-resume (resume=False) to overwrite the output "
                          "and start over, or choose another output")
    return job


def read_marker(path, block_id):
    """The fingerprints recorded for chunk ``block_id`` of output ``path``, or None."""
    try:
        with open(os.path.join(path, LEDGER, marker_name(block_id)), "rb") as f:
            marker = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # missing, or torn by hand: the chunk is computed again
    return marker if isinstance(marker, dict) else None


def launch(marker, alone):
    """The region of the launch that computed a marker's chunk, ``(start, shape)`` in
    elements as tuples; ``alone``, the chunk's own region, for a marker that records none
    (written by a daskgpu that launched every chunk alone); None for one that records it
    unreadably (edited by hand), whose chunk is then computed again.

    Examples
    --------
    >>> launch({"launch": {"start": [0], "shape": [300]}}, ((100,), (100,)))
    ((0,), (300,))
    >>> launch({"inputs": [], "output": "..."}, ((100,), (100,)))
    ((100,), (100,))
    >>> launch({"launch": {"start": [0]}}, ((100,), (100,))) is None
    True
    """
    if "launch" not in marker:
        return alone
    region = marker["launch"]
    if not isinstance(region, dict):
        return None
    start, shape = region.get("start"), region.get("shape")
    ndim = len(alone[0])
    if not all(isinstance(v, list) and len(v) == ndim and all(
            isinstance(i, int) and not isinstance(i, bool) for i in v) for v in (start, shape)):
        return None
    return tuple(start), tuple(shape)


def forget(path, block_id) -> None:
    """Remove chunk ``block_id``'s marker from output ``path``: it is to be computed again."""
    try:
        os.unlink(os.path.join(path, LEDGER, marker_name(block_id)))
    except FileNotFoundError:
        pass


def job_differences(job: dict, previous: dict) -> list:
    """The keys, sorted, in which ``job`` differs from the ``previous`` one.

    The instance's own keys (:data:`INSTANCE_KEYS`) are not compared.

    Examples
    --------
    >>> job_differences({"scalars": [2], "nonce": "a"}, {"scalars": [3], "nonce": "b"})
    ['scalars']
    """
    keys = (job.keys() | previous.keys()) - INSTANCE_KEYS
    return sorted(k for k in keys if job.get(k) != previous.get(k))


def start(path, job: dict) -> None:
    """Create ``path``'s ledger and record ``job`` in it."""
    ledger = os.path.join(path, LEDGER)
    os.makedirs(ledger, exist_ok=True)
    atomic_write(os.path.join(ledger, JOB), json.dumps(job, indent=1).encode())
    fsync(path)


def record(path, block_id, inputs, output, nonce, launch) -> None:
    """Mark chunk ``block_id`` of output ``path`` finished, with its fingerprints.

    ``inputs`` are the digests of the input blocks the chunk was computed
    from, ``output`` the digest of the stored chunk file, ``nonce`` the job
    instance's (from ``job.json``), ``launch`` the region the launch that
    computed it covered, ``(start, shape)`` in elements (see :func:`launch`).
    """
    record_all(path, [(block_id, inputs, output, launch)], nonce)


def record_all(path, records, nonce) -> None:
    """Mark several chunks of output ``path`` finished: ``records`` of ``(block_id, inputs,
    output, launch)``, as :func:`record` takes them.

    Each marker is written whole or not at all, several at once; the ledger
    directory is synced once, after the last, so that a group of chunks costs
    one sync of it.
    """
    ledger = os.path.join(path, LEDGER)

    def write(record):
        block_id, inputs, output, (start, shape) = record
        marker = json.dumps({"job": nonce, "inputs": list(inputs), "output": output,
                             "launch": {"start": [int(i) for i in start],
                                        "shape": [int(n) for n in shape]}}).encode()
        atomic_write(os.path.join(ledger, marker_name(block_id)), marker, sync_folder=False)

    at_once(write, records)
    fsync(ledger)


def block_digest(block) -> str:
    """The sha256 of an array's dtype, shape and C-order bytes.

    Examples
    --------
    >>> import numpy as np
    >>> block_digest(np.zeros(3)) == block_digest(np.zeros(3))
    True
    >>> block_digest(np.zeros(3)) == block_digest(np.zeros(3, np.float32))
    False
    """
    import numpy as np

    block = np.ascontiguousarray(block)
    h = hashlib.sha256(f"{block.dtype.str}{block.shape}".encode())
    h.update(block.reshape(-1).view(np.uint8) if block.size else b"")
    return h.hexdigest()


def file_digest(path):
    """The sha256 of a file's bytes, or None when there is no file there."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for piece in iter(lambda: f.read(1 << 22), b""):
                h.update(piece)
    except (FileNotFoundError, IsADirectoryError):
        return None
    return h.hexdigest()


#: Temporary files a killed run can leave: the ledger's own, and zarr's (``*.partial``).
_TEMP_RE = re.compile(r"(\..*\.tmp|.*\.[0-9a-f]{32}\.partial)")


def remove_temporaries(path) -> int:
    """Delete the temporary files a killed run left inside output ``path``; how many.

    Call it only while no other run writes this output.
    """
    removed = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if _TEMP_RE.fullmatch(name):
                try:
                    os.unlink(os.path.join(root, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed
