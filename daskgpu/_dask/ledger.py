"""The durable per-chunk ledger of a ``daskgpu batch`` output.

Each output zarr array holds its ledger in the directory :data:`LEDGER`
(``.daskgpu-done``): ``job.json``, which says what job the chunks belong to,
and one empty marker file per finished chunk, named by its block index
(``3`` or ``1.2``). Every file is written whole or not at all (a synced
temporary file, renamed, then the directory synced), so a marker exists only
for a chunk whose data is on disk. Reading the ledger, matching a rerun's job
against the recorded one, and writing job and markers is all this module does;
:mod:`daskgpu._dask.batch` decides what to compute.
"""

from __future__ import annotations

import json
import os
import re

from daskgpu._files import atomic_write

#: The ledger directory inside each output zarr array.
LEDGER = ".daskgpu-done"
JOB = "job.json"
_MARKER_RE = re.compile(r"\d+(\.\d+)*")


def done_chunks(path, ndim=None) -> set:
    """The chunks recorded as finished in the ledger of the output zarr array ``path``.

    Examples
    --------
    >>> import tempfile
    >>> done_chunks(tempfile.mkdtemp())
    set()
    """
    try:
        names = os.listdir(os.path.join(os.fspath(path), LEDGER))
    except FileNotFoundError:
        return set()
    chunks = {tuple(int(p) for p in n.split(".")) for n in names if _MARKER_RE.fullmatch(n)}
    return chunks if ndim is None else {c for c in chunks if len(c) == ndim}


def read_job(path):
    """The job recorded in ``path``'s ledger, or None when it has none."""
    try:
        with open(os.path.join(path, LEDGER, JOB), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def job_differences(job: dict, previous: dict) -> list:
    """The keys, sorted, in which ``job`` differs from the ``previous`` one."""
    return sorted(k for k in job.keys() | previous.keys() if job.get(k) != previous.get(k))


def start(path, job: dict) -> None:
    """Create ``path``'s ledger and record ``job`` in it."""
    ledger = os.path.join(path, LEDGER)
    os.makedirs(ledger, exist_ok=True)
    atomic_write(os.path.join(ledger, JOB), json.dumps(job, indent=1).encode())


def record(paths, block_id) -> None:
    """Mark chunk ``block_id`` finished in the ledger of each output in ``paths``."""
    marker = ".".join(map(str, block_id))
    for path in paths:
        atomic_write(os.path.join(path, LEDGER, marker))
