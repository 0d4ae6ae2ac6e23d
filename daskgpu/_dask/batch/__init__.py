"""Batch jobs: a kernel run over stored arrays into zarr outputs, chunk by chunk, resumably.

``run_batch`` (:mod:`~daskgpu._dask.batch.job`) runs a job that
:mod:`~daskgpu._dask.batch.plan` has checked and prepared. Its inputs
(:mod:`~daskgpu._dask.batch.inputs`), outputs and write tasks
(:mod:`~daskgpu._dask.batch.store`), how small chunks are grouped into tasks
(:mod:`~daskgpu._dask.batch.groups`), the durable record of finished chunks
(:mod:`~daskgpu._dask.batch.ledger`), the one-writer lock
(:mod:`~daskgpu._dask.batch.lock`), the report
(:mod:`~daskgpu._dask.batch.report`), the progress displays
(:mod:`~daskgpu._dask.batch.progress`) and how a run stops on signals
(:mod:`~daskgpu._dask.batch.stopping`) each have their module.
"""

from daskgpu._dask.batch.inputs import NpyFile
from daskgpu._dask.batch.job import local_client, run_batch
from daskgpu._dask.batch.ledger import done_chunks
from daskgpu._dask.batch.plan import argument_order
from daskgpu._dask.batch.progress import BarProgress, BatchProgress, BatchStart, LineProgress
from daskgpu._dask.batch.report import BatchReport
from daskgpu._errors import BatchError

__all__ = ["BarProgress", "BatchError", "BatchProgress", "BatchReport", "BatchStart",
           "LineProgress", "NpyFile", "argument_order", "done_chunks", "local_client",
           "run_batch"]
