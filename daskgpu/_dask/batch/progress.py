"""How a batch run shows its progress: events from the job, displays that draw them.

:func:`~daskgpu.run_batch` reports four events to a :class:`BatchProgress`:
:meth:`~BatchProgress.start` with the plan (:class:`BatchStart`), one
:meth:`~BatchProgress.chunk_done` or :meth:`~BatchProgress.chunk_failed` per
chunk, and :meth:`~BatchProgress.end` with the report. The job itself never
writes to a terminal; only the displays here do:

- :class:`BarProgress`: a tqdm bar, for a terminal;
- :class:`LineProgress`: plain lines every few percent or seconds, for a log
  file (SLURM, CI): no carriage returns;
- :class:`BatchProgress` itself: nothing at all.

Subclass :class:`BatchProgress` to receive the events yourself (a callback, a
metric); :func:`as_progress` turns ``run_batch``'s ``progress=`` argument into
one of these.
"""

from __future__ import annotations

import dataclasses
import sys
import time

__all__ = ["BarProgress", "BatchProgress", "BatchStart", "LineProgress", "as_progress",
           "plural"]

#: The words ``progress=`` and ``daskgpu batch --progress`` take.
MODES = ("auto", "bar", "lines", "none")


def plural(count, noun) -> str:
    """``"1 chunk"``, ``"2 chunks"``.

    Examples
    --------
    >>> plural(1, "chunk"), plural(0, "worker")
    ('1 chunk', '0 workers')
    """
    return f"{count} {noun}{'s' * (count != 1)}"


@dataclasses.dataclass(frozen=True)
class BatchStart:
    """What a run is about to do: the event :meth:`BatchProgress.start` receives.

    Attributes
    ----------
    kernel : str
        The kernel's name.
    chunks : int
        Chunks in the job.
    chunk_shape, shape : tuple of int
        The shape of a chunk, and of the whole array.
    skipped : int
        Chunks written by earlier runs, checked and kept.
    now : int
        Chunks this run computes.
    later : int
        Chunks left for later runs (``max_chunks``).
    stale : int
        Chunks an earlier run wrote that are computed again.
    workers : int or None
        Workers of the cluster that runs the chunks; None when no cluster was
        needed (nothing to compute).
    simulated : bool
        Whether the chunks run in Numba's CUDA simulator.
    per_task : int
        The most chunks one task reads, launches over and writes: more than
        one where small chunks are grouped (``run_batch``'s ``group=``).

    Examples
    --------
    >>> s = BatchStart("saxpy", chunks=40, chunk_shape=(25000,), shape=(1000000,),
    ...                skipped=0, now=40, workers=4)
    >>> s.headline()
    'batch saxpy: 40 chunks of 25000 over 1000000 on 4 workers; 0 already written, 40 to compute'
    """

    kernel: str
    chunks: int
    chunk_shape: tuple
    shape: tuple
    skipped: int = 0
    now: int = 0
    later: int = 0
    stale: int = 0
    workers: int | None = None
    simulated: bool = False
    per_task: int = 1

    def headline(self) -> str:
        """The line a display prints first: the job, where it runs, and what is left."""
        what = (f"batch {self.kernel}: {plural(self.chunks, 'chunk')} of "
                f"{'x'.join(map(str, self.chunk_shape))} over "
                f"{'x'.join(map(str, self.shape))}")
        later = f", {self.later} left for later runs" if self.later else ""
        if self.workers is None:
            return (f"{what}: {self.skipped} written before and checked; nothing to "
                    f"compute now{later}")
        where = plural(self.workers, "worker") + (" (simulated)" if self.simulated else "")
        if self.per_task > 1:
            where += f", up to {self.per_task} chunks a task"
        stale = f" ({self.stale} stale)" if self.stale else ""
        return (f"{what} on {where}; {self.skipped} already written, {self.now} to "
                f"compute{stale}{later}")


class BatchProgress:
    """The events of a batch run; this base class shows nothing.

    Subclass it and override the events you need; :func:`~daskgpu.run_batch`
    calls them in the thread that called it, in this order: :meth:`start`
    once, then :meth:`chunk_done` or :meth:`chunk_failed` once per chunk
    computed now, as each finishes, then :meth:`end` once, also when the run
    stops early. An event should return quickly: the next chunk's result waits.

    Examples
    --------
    >>> class Count(BatchProgress):
    ...     def __init__(self):
    ...         self.done = 0
    ...     def chunk_done(self, chunk):
    ...         self.done += 1
    >>> count = Count()
    >>> report = run_batch(kernel, inputs, outputs, progress=count)  # doctest: +SKIP
    >>> count.chunk_done((0,)); count.done
    1
    """

    def start(self, plan: BatchStart) -> None:
        """The run begins: ``plan`` says what it will do, and where."""

    def chunk_done(self, chunk: tuple) -> None:
        """``chunk`` (a block index, e.g. ``(3,)``) is written and recorded."""

    def chunk_failed(self, chunk: tuple, error: str) -> None:
        """``chunk`` failed every attempt; ``error`` is one line, e.g. ``"IndexError: ..."``."""

    def end(self, report) -> None:
        """The run is over: ``report`` is its :class:`~daskgpu.BatchReport`, or None when
        it stopped early (interrupted, or its scheduler lost)."""


class BarProgress(BatchProgress):
    """A tqdm bar over the job's chunks, for a terminal, after the plan's headline.

    Parameters
    ----------
    file : file, optional
        Where to draw (default: ``sys.stderr`` when the run starts).

    Examples
    --------
    >>> import io
    >>> bar = BarProgress(io.StringIO())
    >>> bar.start(BatchStart("k", chunks=2, chunk_shape=(5,), shape=(10,), now=2, workers=1))
    >>> bar.chunk_done((0,)); bar.chunk_failed((1,), "ValueError: no"); bar.end(None)
    >>> print(bar.file.getvalue().splitlines()[0])
    batch k: 2 chunks of 5 over 10 on 1 worker; 0 already written, 2 to compute
    """

    def __init__(self, file=None):
        self.file = file
        self._bar = None
        self._failed = 0

    def start(self, plan):
        from tqdm import tqdm

        self.file = self.file or sys.stderr
        self.file.write(plan.headline() + "\n")
        self._bar = tqdm(total=plan.chunks, initial=plan.skipped, unit="chunk",
                         file=self.file, mininterval=0.1, dynamic_ncols=True,
                         desc="chunks written")

    def chunk_done(self, chunk):
        self._bar.update(1)

    def chunk_failed(self, chunk, error):
        self._failed += 1
        self._bar.set_postfix_str(f"{self._failed} failed", refresh=False)
        self._bar.update(1)

    def end(self, report):
        if self._bar is not None:
            self._bar.close()


class LineProgress(BatchProgress):
    """Progress as plain lines, for a log file: no carriage returns, no redraws.

    After the plan's headline, one line each time another ``percent`` of the
    chunks to compute has finished, or ``seconds`` after the last line when
    any chunk finished since, and one at the end.

    Parameters
    ----------
    file : file, optional
        Where to write (default: ``sys.stderr`` when the run starts).
    percent : float
        A line per this share of the chunks computed now (default 10).
    seconds : float
        At most this long between lines while chunks finish (default 30).

    Examples
    --------
    >>> import io
    >>> from daskgpu import BatchReport
    >>> log = LineProgress(io.StringIO(), percent=50)
    >>> log.start(BatchStart("k", chunks=4, chunk_shape=(5,), shape=(20,), skipped=1,
    ...                      now=3, workers=2))
    >>> for c in (1, 2, 3):
    ...     log.chunk_done((c,))
    >>> log.end(BatchReport(outputs=("z.zarr",), chunks=4, computed=((1,), (2,), (3,))))
    >>> print(log.file.getvalue().replace("\\r", "<CR>"))  # doctest: +ELLIPSIS
    batch k: 4 chunks of 5 over 20 on 2 workers; 1 already written, 3 to compute
    chunks written: 3/4 (75%), 2 this run
    chunks written: 4/4 (100%), 3 this run in ... s
    <BLANKLINE>
    """

    def __init__(self, file=None, percent=10.0, seconds=30.0):
        self.file, self.percent, self.seconds = file, float(percent), float(seconds)
        self._plan = None
        self._done = self._failed = self._shown = 0
        self._started = self._last = 0.0

    def start(self, plan):
        self.file = self.file or sys.stderr
        self._plan = plan
        self._started = self._last = time.monotonic()
        self._write(plan.headline())

    def chunk_done(self, chunk):
        self._done += 1
        self._maybe_write()

    def chunk_failed(self, chunk, error):
        self._failed += 1
        self._maybe_write()

    def end(self, report):
        if self._plan is not None and report is not None and self._plan.now:
            self._write(self._line() + f" in {time.monotonic() - self._started:.1f} s")

    def _maybe_write(self):
        now, finished = time.monotonic(), self._done + self._failed
        step = max(1.0, self._plan.now * self.percent / 100)
        if finished == self._plan.now:
            return  # the end's line says it
        if finished - self._shown >= step or now - self._last >= self.seconds:
            self._write(self._line())
            self._shown, self._last = finished, now

    def _line(self) -> str:
        plan = self._plan
        written = plan.skipped + self._done
        line = (f"chunks written: {written}/{plan.chunks} ({100 * written // plan.chunks}%), "
                f"{self._done} this run")
        return line + (f", {self._failed} failed" if self._failed else "")

    def _write(self, line):
        self.file.write(line + "\n")
        self.file.flush()


def as_progress(progress) -> BatchProgress:
    """The display for ``run_batch``'s ``progress=``: a :class:`BatchProgress` as given;
    ``True`` or ``"auto"``: a bar when stderr is a terminal, else lines; ``"bar"``,
    ``"lines"``; ``False``, None or ``"none"``: nothing.

    Examples
    --------
    >>> type(as_progress("lines")).__name__, type(as_progress(False)).__name__
    ('LineProgress', 'BatchProgress')
    """
    if isinstance(progress, BatchProgress):
        return progress
    if progress is True or progress == "auto":
        progress = "bar" if sys.stderr.isatty() else "lines"
    if progress is False or progress is None or progress == "none":
        return BatchProgress()
    if progress == "bar":
        return BarProgress()
    if progress == "lines":
        return LineProgress()
    raise TypeError(f"progress must be True, False, one of {', '.join(map(repr, MODES))} or "
                    f"a daskgpu BatchProgress (subclass it for a callback), got {progress!r}")
