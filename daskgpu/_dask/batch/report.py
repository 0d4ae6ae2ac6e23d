"""What a ``daskgpu batch`` run reports: :class:`BatchReport` and its one-line descriptions
of failed chunks. How progress is shown while it runs is :mod:`daskgpu._dask.batch.progress`."""

from __future__ import annotations

import dataclasses

from daskgpu._dask.batch.progress import plural

__all__ = ["BatchReport", "describe_failure"]


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
        Chunks an earlier run had written whose inputs changed since, whose
        stored data was missing or damaged, or that were launched over another
        region than this run launches them in (grouped otherwise): computed
        again (or to be).

    Examples
    --------
    >>> r = BatchReport(outputs=("z.zarr",), chunks=4, skipped=((0,),), computed=((1,),),
    ...                 failed={(2,): "IndexError: index 99 is out of bounds"},
    ...                 remaining=((3,),), retries=2)
    >>> r.complete
    False
    >>> print(r.summary().replace(" in 0.0 s", ""))
    2/4 chunks written (1 this run, 1 before)
      chunk (2,) failed after 3 attempts: IndexError: index 99 is out of bounds
    2 chunks to go: run the same job again to compute only those
    >>> print(BatchReport(outputs=("z.zarr",), chunks=1, computed=((0,),)).summary())
    1/1 chunk written (1 this run, 0 before) in 0.0 s
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
        lines = [f"{done}/{plural(self.chunks, 'chunk')} written ({len(self.computed)} this "
                 f"run, {len(self.skipped)} before) in {self.seconds:.1f} s"]
        if self.stale:
            were = "was" if len(self.stale) == 1 else "were"
            lines.append(f"  {plural(len(self.stale), 'chunk')} written before {were} stale "
                         "(an input changed, the stored chunk was missing or damaged, or it "
                         "was launched in another grouping): computed again")
        attempts = plural(self.retries + 1, "attempt")
        for chunk, error in sorted(self.failed.items()):
            lines.append(f"  chunk {chunk} failed after {attempts}: {error}")
        if self.failed or self.remaining:
            lines.append(f"{plural(self.chunks - done, 'chunk')} to go: run the same job "
                         "again to compute only those")
        return "\n".join(lines)


def describe_failure(future) -> str:
    """``"IndexError: first line"`` for a future that did not finish."""
    try:
        exc = future.exception()
    except Exception as e:  # cancelled, or the cluster lost it
        exc = e
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
