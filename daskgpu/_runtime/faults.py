"""What a worker does when CUDA reports an error that poisons its context.

After an illegal address (and the other sticky errors in
:data:`~daskgpu._runtime._cuda.STICKY_ERRORS`) every later CUDA call in the
process fails. The task that hit it fails with the original error; the Dask
worker process is then closed so that its nanny starts a fresh one, and later
tasks (and retries, with ``retries=``) run on a working context. Outside a Dask
worker the error is only raised.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("daskgpu")

# Seconds the worker keeps running after the failure, so that the task's
# error reaches the scheduler before the process goes.
_GRACE = 0.5


def replace_worker_process(error) -> bool:
    """Have this process's Dask worker replaced by its nanny; False outside a worker."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return False
    logger.error("daskgpu: %s; closing worker %s so its nanny restarts it", error, worker.address)
    worker.loop.call_later(_GRACE, _close, worker)
    return True


def _close(worker):
    import asyncio

    # nanny=False: the nanny sees its worker process exit and starts a new one.
    asyncio.ensure_future(
        worker.close(nanny=False, executor_wait=False, reason="daskgpu: CUDA context lost")
    )
