"""``daskgpu batch``: run a kernel over stored arrays, chunk by chunk, resumably.

Inputs are zarr arrays or ``.npy`` files; every output is a zarr array with
the chunks of the job, written by tasks that each read, launch over and write
one chunk or, where the chunks are small, a group of neighbouring ones
(:mod:`daskgpu._dask.batch.groups`). After a task has stored a chunk in every
output it records the chunk in each output's ledger, the
directory ``.daskgpu-done`` inside the zarr array: one marker file per
finished chunk, created by an atomic rename, plus ``job.json``, which says
what job the chunks belong to. A marker holds the job instance's nonce, the
fingerprints of the input blocks the chunk was computed from and of the chunk
as stored, and the region of the launch that computed it. A rerun of the same
job keeps only the chunks whose marker still matches all four, so an
interrupted job loses no finished chunk, and a chunk whose input changed,
whose stored data went missing or was damaged, that another job instance
wrote, or that the rerun would launch in another group, is computed again.
One run at a time writes an output (:mod:`daskgpu._dask.batch.lock`); an
output never overlaps an input. Failed chunks are retried, then reported; the
others are still written. Workers need zarr and must see the paths of the
inputs and outputs.

The job is planned (:mod:`daskgpu._dask.batch.plan`) and the chunks already
written are checked before any cluster starts: a rerun with nothing left to
compute starts none. The inputs are :mod:`daskgpu._dask.batch.inputs`, the
outputs and per-chunk tasks :mod:`daskgpu._dask.batch.store`, the ledger
:mod:`daskgpu._dask.batch.ledger`; the ``daskgpu batch`` command line is
:mod:`daskgpu._cli.batch`.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import secrets
import time
from contextlib import ExitStack

import numpy as np

from daskgpu._dask.batch import ledger as _ledger
from daskgpu._dask.batch.groups import Layout, check_group, plan_layout
from daskgpu._dask.batch.inputs import resolve_inputs
from daskgpu._dask.batch.plan import PlannedJob, argument_order, misfit_error, plan_job
from daskgpu._dask.batch.progress import BatchStart, as_progress
from daskgpu._dask.batch.report import BatchReport, describe_failure
from daskgpu._dask.batch.stopping import WORKER_PRELOAD, held_signals, spawned_without_sigint
from daskgpu._dask.batch.store import ChunkCheck, ChunkWriter, check_no_overlap, output_paths
from daskgpu._errors import BatchError, CompileError
from daskgpu._runtime import backends

__all__ = ["BatchReport", "batch_kernel", "local_client", "run_batch"]


# -- running --------------------------------------------------------------------
def run_batch(kernel, inputs, outputs, *, scalars=(), order=None, chunks=None, client=None,
              devices=None, simulate=None, retries=2, progress=True, resume=True,
              max_chunks=None, group=None):
    """Run ``kernel`` over stored arrays, writing its outputs to zarr chunk by chunk.

    The kernel is called per chunk as ``kernel(*outputs, *scalars, *inputs)``
    (or in the ``order`` given) through :func:`~daskgpu.map_kernel`. Each
    finished chunk is recorded in the outputs' ledgers with the fingerprints
    of its input blocks and its stored data, so running the same job again
    computes only the chunks that are missing (after an interruption, a
    failure, or ``max_chunks``) or stale (an input changed, the stored chunk
    is missing or damaged, or it was launched in another group than this run
    launches it in: see ``group``). One run at a time may write an output.

    Parameters
    ----------
    kernel : Kernel, PTXKernel, function, numba.cuda.jit dispatcher or path
        What ``daskgpu batch`` takes: a kernel from :func:`daskgpu.jit` or
        :func:`daskgpu.load`, a plain function in Numba's CUDA dialect
        (compiled for the inputs' dtypes), a ``numba.cuda.jit`` dispatcher,
        or the path of a kernel bundle (``.dgk``).
    inputs : sequence of path
        Zarr arrays or ``.npy`` files, all of one shape, in this machine's
        byte order, resolved against this process's working directory. The
        job's chunks are ``chunks``, else the first zarr input's, else dask's
        ``"auto"``.
    outputs : sequence of path or (path, dtype)
        Zarr arrays to write, each the shape of the inputs and chunked like
        the job; the dtype defaults to the first input's. Each holds its
        ledger in ``.daskgpu-done``. Workers must see the same paths. An
        output may not be, contain or lie inside an input. Only an output
        that a batch job created is ever replaced.
    scalars : sequence
        Values passed between the outputs and the inputs.
    order : str or sequence of str, optional
        The kernel's parameters in order, one word per parameter: ``"out"``
        (the next output), ``"in"`` (the next input) or ``"scalar"`` (the next
        scalar), e.g. ``"out,in,scalar"`` for ``kernel(out, x, a)``. Default:
        every output, then every scalar, then every input.
    chunks : optional
        Chunk shape, as dask takes it (e.g. ``1000`` or ``(256, 256)``).
    client : distributed.Client, optional
        Default: the current client, else a :class:`~daskgpu.LocalGPUCluster`
        started for this run, once there is a chunk to compute.
    devices : optional
        The GPUs of that local cluster (default: all).
    simulate : bool, optional
        Run kernels in Numba's CUDA simulator (see
        :class:`~daskgpu.LocalGPUCluster`). Default: only without a GPU.
    retries : int
        Attempts to make again for each failing chunk.
    progress : bool, str or BatchProgress
        How to show progress on stderr: True (a bar on a terminal, else lines
        every 10% or 30 s), ``"bar"``, ``"lines"``, False (nothing), or a
        :class:`~daskgpu._dask.batch.progress.BatchProgress` that receives the
        run's events (its start, each chunk done or failed, its end): subclass
        it for a callback. This function itself writes nothing.
    resume : bool
        Keep the chunks that earlier runs of the same job finished. False
        overwrites the outputs and computes everything.
    max_chunks : int, optional
        Compute at most this many chunks in this run, then stop.
    group : bool or int or str, optional
        Launches sized for the GPU rather than for the storage, as
        :func:`~daskgpu.map_kernel`'s ``group=``: where a stored chunk needs
        less than a quarter of ``daskgpu.launch-bytes`` (32 MiB by default; at
        most a quarter of a worker's ``GPU-memory``) of device memory, its
        inputs and outputs together, one task reads a group of neighbouring
        chunks that needs about that much, launches the kernel once over it,
        and writes and records every chunk of it, each on its own in the
        ledger, so resuming still goes chunk by chunk. The kernel then sees
        the group as one chunk: a kernel whose result depends on where the
        chunks begin (chunk-local indices) needs ``group=False``. A chunk's
        record names the launch it was computed in, and a resumed job
        computes again each chunk that it would launch otherwise (resumed
        with another ``group``). A group that fails is run again one task a
        chunk, so that only its failing chunks fail (a later run launches
        them as their group again). None or True: the setting; False: one
        task a chunk; a size (bytes, or a string such as ``"64 MiB"``): that
        target.

    Returns
    -------
    BatchReport

    Raises
    ------
    BatchError
        When an input cannot be read, shapes disagree, an output overlaps an
        input, holds another job or was not created by a batch job, or the
        kernel does not fit the arguments: nothing is written then. Also when
        another run is writing an output; then its ``__cause__`` is a
        :class:`BlockingIOError`.

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
    import dask.config

    from daskgpu import _config
    from daskgpu._dask.cluster_facts import ClusterFacts, cluster_facts

    progress = as_progress(progress)
    kernel = batch_kernel(kernel)
    group = check_group(group)
    for name, value, low in (("retries", retries, 0), ("max_chunks", max_chunks, 0)):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Integral) or value < low):
            raise BatchError(f"{name} must be a whole number of {low} or more, got {value!r}")
    _config.check()
    scalars = tuple(scalars)
    inputs = resolve_inputs(inputs)
    if not inputs:
        raise BatchError("a batch needs at least one input array")
    # Before a cluster starts or anything is written.
    check_no_overlap(inputs, output_paths(outputs))
    order = argument_order(order, len(output_paths(outputs)), len(scalars), len(inputs))
    if client is None:
        client = _current_client()
    given = client  # a cluster of someone else's, whose scheduler can go away
    job = None
    try:
        with ExitStack() as stack:
            if client is not None and simulate is not None:
                stack.enter_context(dask.config.set({"daskgpu.simulate": bool(simulate)}))
            job = plan_job(stack, kernel, inputs, outputs, scalars, order, chunks, resume,
                           _simulated(client, simulate))
            hazards = _hazards(job)
            # The settings' own layout: no worker's GPU memory caps its groups.
            layout = _layout(job, group, ClusterFacts(), hazards)
            job, launches = _verified(job, client, layout)
            # A local cluster starts only for chunks to compute. Before it exists, done
            # chunks all launched in the settings' layout need none.
            if client is None and max_chunks != 0 and (
                    job.todo or _launched_elsewhere(job, launches, layout, hazards)):
                client = local_client(stack, devices, simulate)
            if client is not None:
                stack.enter_context(client.as_current())  # map_kernel asks it for GPUs
                # The one layout of the run: the chunks are written in it, and a done
                # chunk that an earlier run launched over another region is stale.
                layout = _layout(job, group, cluster_facts(), hazards, warn=True)
            job = _relaid(job, launches, layout, hazards)
            return _execute(job, client, retries, progress, max_chunks, layout)
    except Exception:
        if given is not None:
            _check_connected(given)  # a lost scheduler, whatever the call that noticed
        raise
    except KeyboardInterrupt as exc:
        if job is not None:  # counted once a local cluster has finished its chunks
            exc.add_note(f"daskgpu batch interrupted: {job.written()}/{len(job.grid)} "
                         "chunks written; run the same job again to compute only the rest")
        else:
            exc.add_note("daskgpu batch interrupted while planning the job, before any "
                         "chunk was computed; run it again to start it")
        raise


def batch_kernel(kernel):
    """A daskgpu kernel from what ``daskgpu batch`` takes: a kernel, a plain function
    (compiled lazily, for the inputs' dtypes), a ``numba.cuda.jit`` dispatcher, or the
    path of a kernel bundle.

    Examples
    --------
    >>> from numba import cuda
    >>> def double(out, x):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = 2 * x[i]
    >>> batch_kernel(double)
    <daskgpu.Kernel double signatures=[]>
    """
    from daskgpu._compiler.as_kernel import as_kernel
    from daskgpu._runtime.kernel_kinds import KernelKind, kind_of

    if kind_of(kernel) in (KernelKind.LAUNCH, KernelKind.OTHER):
        raise BatchError(
            f"run_batch takes a kernel: one made by dg.jit or dg.kernel or loaded by "
            f"dg.load, a plain Python function in Numba's CUDA dialect, a numba.cuda.jit "
            f"dispatcher, or the path of a .dgk bundle; got {_shown(kernel)}")
    return as_kernel(kernel)


def _shown(value) -> str:
    """``value`` as an error names it: short, with its type."""
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} (of type {type(value).__name__})"


def local_client(stack, devices=None, simulate=None):
    """A client of a new :class:`~daskgpu.LocalGPUCluster`, closed with ``stack``.

    The cluster is this run's alone: it admits only clients holding its
    temporary TLS credentials, and serves HTTP on the loopback address only,
    so that no other user of the machine can run code on its workers or read
    its pages.
    """
    from distributed import Client

    from daskgpu._dask.cluster import LocalGPUCluster

    # Ctrl-C reaches the whole process group: the workers ignore it (their
    # preload), and are closed by this process, which reports. One that comes
    # while they start is acted on once the cluster is up, to close it properly.
    with held_signals(), spawned_without_sigint():
        cluster = stack.enter_context(LocalGPUCluster(
            devices=devices, simulate=simulate, security=True,
            dashboard_address="127.0.0.1:0", preload=[WORKER_PRELOAD],
            silence_logs=logging.CRITICAL))  # the report names failed chunks
    # The scheduler runs in this process, and distributed silences it only while the
    # cluster starts: stopped by a signal, its comms to the workers close mid-send and
    # it logged a traceback before the run's one line.
    logging.getLogger("distributed.batched").setLevel(logging.CRITICAL)
    return stack.enter_context(Client(cluster))


def _current_client():
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        return None


def _simulated(client, simulate) -> bool:
    """Whether the chunks will run in the simulator: on ``client``, or on a local cluster."""
    if client is not None or simulate is not None:
        return bool(simulate) if simulate is not None else backends.current().simulated
    return backends.current().simulated or not backends.GPU.devices().names


def _verified(job, client, layout) -> tuple:
    """``job`` with only the recorded chunks that still hold as done, in grid order, and
    ``{chunk: (start, shape)}``: the region of the launch that computed each of them.

    Checked on ``client``, or, without one, in this process, so that a
    rerun with nothing left to compute starts no cluster. The check reads
    the inputs in the groups of ``layout`` (the settings' own, without the
    workers' GPU memory): it launches nothing. Whether each
    chunk's launch is the one this run would make is :func:`_relaid`'s to
    say, once the run's layout is known.
    """
    import dask.array as da
    from dask.threaded import get as threaded_get

    if not job.done:
        return job, {}
    check = da.map_blocks(ChunkCheck(job.outputs, job.nonces, job.chunksize, layout.per_task),
                          *job.read_in(layout), name=f"batch-check-{secrets.token_hex(8)}",
                          chunks=layout.block_chunks(),
                          meta=np.empty((0,) * layout.ndim, object))
    members = layout.members(sorted(job.done))
    keys = [(check.name, *t) for t in members]
    graph = _needed(check, keys)
    results = client.get(graph, keys) if client is not None else threaded_get(dict(graph),
                                                                                keys)
    launches = {}
    for chunks, found in zip(members.values(), results):
        launches.update((c, found[layout.within(c)]) for c in chunks
                        if found[layout.within(c)] is not None)
    return _stale(job, [c for c in sorted(job.done) if c not in launches]), launches


def _launched_elsewhere(job, launches, layout, hazards) -> list:
    """The done chunks of ``job`` whose recorded launch (``launches``) is not the one
    ``layout`` makes for them, in grid order; none where the kernel's results cannot
    depend on its launch's region (no ``hazards``).

    A kernel sees its launch as one chunk: one whose result depends on where
    that begins or ends (chunk-local indices) computes such a chunk otherwise.
    """
    if not hazards:
        return []
    return [c for c in sorted(job.done) if launches[c] != layout.launch_of(c)]


def _relaid(job, launches, layout, hazards) -> PlannedJob:
    """``job`` with the done chunks launched otherwise than ``layout`` launches them stale
    (where that can change them)."""
    return _stale(job, _launched_elsewhere(job, launches, layout, hazards))


def _hazards(job) -> tuple:
    """Why launching a group of ``job``'s chunks as one could change what its kernel
    computes: ``map_kernel``'s rule (:func:`~daskgpu._dask.launch_layout.grouping_hazards`)
    for the job's arguments."""
    from daskgpu._dask.map_kernel.api import graph_layer
    from daskgpu._dask.map_kernel.plan import plan_map

    try:
        return plan_map(job.kernel, _map_arguments(job, job.arrays), group=False,
                        layer=graph_layer()).hazards
    except (TypeError, CompileError) as exc:
        raise misfit_error(job.kernel, job.order, job.arguments, exc) from None


def _map_arguments(job, arrays) -> list:
    """The job's kernel arguments for ``map_kernel`` over ``arrays``: outputs as ``Out``."""
    from daskgpu._dask.map_kernel.api import Out

    return [Out(a, like=arrays[0]) if isinstance(a, np.dtype) else a
            for a in job.arguments_with(arrays)]


def _stale(job, chunks) -> PlannedJob:
    """``job`` with ``chunks``, done until now, to be computed again."""
    if not chunks:
        return job
    for chunk in chunks:  # computed again; a crash before then must not trust them
        for path in job.outputs:
            _ledger.forget(path, chunk)
    return dataclasses.replace(job, done=job.done - frozenset(chunks),
                               stale=tuple(sorted({*job.stale, *chunks})))


def _layout(job, group, cluster, hazards, warn=False) -> Layout:
    """How ``job``'s chunks are gathered into tasks (:mod:`.groups`): by default, grouped
    only where its kernel's results cannot depend on where a launch begins or ends (no
    ``hazards``); ``warn``: say so where grouping would have cut the tasks fourfold."""
    dtypes = [a.dtype for a in job.arrays] + [a for a in job.arguments
                                              if isinstance(a, np.dtype)]
    layout = plan_layout(job.first.shape, job.chunksize, dtypes, group, cluster)
    if group is not None or not hazards or not layout.grouped:
        return layout
    alone = layout.alone()
    if warn and alone.tasks >= 4 * layout.tasks:
        from daskgpu._dask.map_kernel.plan import warn_per_chunk

        warn_per_chunk(getattr(job.kernel, "__name__", "kernel"), hazards, alone.tasks,
                       layout.tasks, fix="pass group=True (daskgpu batch --group SIZE)")
    return alone


def _write_tasks(job, layout, mask=None):
    """The write tasks, one per task of ``layout``, as a dask array of its grid of tasks.

    ``mask`` (a bool array over the stored chunks) says which chunks to write
    where a task holds some that are not to be; None: every chunk of a task.
    """
    import dask.array as da

    from daskgpu._dask.map_kernel.api import map_kernel

    arrays = job.read_in(layout)
    arguments = _map_arguments(job, arrays)
    try:
        # The tasks are grouped here, where the inputs are read: map_kernel must
        # keep them, since a write task and the ledger go by the layout's tasks.
        results = map_kernel(job.kernel, *arguments, group=False)
    except (TypeError, CompileError) as exc:
        raise misfit_error(job.kernel, job.order, job.arguments, exc) from None
    results = (results,) if not isinstance(results, tuple) else results
    results = results[:len(job.outputs)]  # inputs the kernel writes are not stored
    masks = () if mask is None else (da.from_array(mask, chunks=layout.block_chunks()),)
    writer = ChunkWriter(job.outputs, job.chunksize, job.nonces, layout.per_task,
                         masked=mask is not None)
    return da.map_blocks(writer, *results, *arrays, *masks,
                         name=f"batch-write-{secrets.token_hex(8)}",
                         chunks=layout.block_chunks(),
                         meta=np.empty((0,) * layout.ndim, np.bool_))


# -- executing ------------------------------------------------------------------
def _execute(job, client, retries, progress, max_chunks, layout) -> BatchReport:
    """Compute the chunks left in ``layout``, telling ``progress`` of each; the report."""
    from distributed import as_completed

    start = time.perf_counter()
    grid = job.grid
    skipped = tuple(c for c in grid if c in job.done)
    todo = job.todo
    now, later = (todo, []) if max_chunks is None else (todo[:max_chunks], todo[max_chunks:])
    progress.start(_plan(job, client, len(skipped), len(now), len(later),
                         layout if now else None))
    computed, failed = [], {}
    futures, members = [], {}
    report = None
    try:
        if now:
            futures = _submit(job, client, layout, now, retries, members)
        found = as_completed(futures) if futures else ()  # no client: nothing to compute
        for fut in found:
            chunks = members.pop(fut.key)
            if fut.status == "finished":
                computed += chunks
                for chunk in chunks:
                    progress.chunk_done(chunk)
                continue
            _check_connected(client)
            if len(chunks) > 1:  # a group: its chunks again, one task each, to find the bad
                more = _submit(job, client, layout.alone(), chunks, retries, members)
                futures += more
                found.update(more)
                continue
            failed[chunks[0]] = describe_failure(fut)
            progress.chunk_failed(chunks[0], failed[chunks[0]])
        order = {c: i for i, c in enumerate(grid)}
        report = BatchReport(
            outputs=job.outputs, chunks=len(grid), skipped=skipped,
            computed=tuple(sorted(computed, key=order.get)), failed=failed,
            remaining=tuple(later), retries=int(retries),
            seconds=time.perf_counter() - start, stale=job.stale,
        )
    finally:
        if futures and client.status == "running":
            client.cancel(futures)  # releases results and errors on the cluster
        progress.end(report)
    return report


def _submit(job, client, layout, chunks, retries, members) -> list:
    """Start the write tasks of ``layout`` that hold ``chunks``, recording in ``members``
    which chunks each one's key writes; their futures."""
    tasks = layout.members(chunks)
    mask = None
    if any(len(held) != layout.size_of(t) for t, held in tasks.items()):
        mask = np.zeros(layout.numblocks, np.bool_)
        mask[tuple(np.array(chunks).T)] = True
    status = _write_tasks(job, layout, mask)
    keys = [(status.name, *t) for t in tasks]
    members.update(zip(keys, tasks.values()))
    # Dask retries a failing task (the read, the launch or the write) itself.
    return client.get(_needed(status, keys), keys, sync=False, retries=retries)


def _needed(array, keys):
    """The part of ``array``'s graph that ``keys`` need.

    A job resumed or limited by ``max_chunks`` asks for a few of its tasks:
    sending the whole graph would have the scheduler take in every chunk's
    tasks only to cull them (at 20,000 chunks, three quarters of the time of
    writing 100). A HighLevelGraph culls layer by layer without building the
    tasks; array expressions give a dict of tasks.
    """
    from dask.optimization import cull

    graph = array.__dask_graph__()
    if hasattr(graph, "cull"):
        return graph.cull(set(keys))
    return cull(graph, keys)[0]


def _plan(job, client, skipped, now, later, layout) -> BatchStart:
    """The start event: the job, where it runs, and what is left."""
    from daskgpu._dask.cluster_facts import workers_info

    return BatchStart(
        kernel=job.kernel.__name__, chunks=len(job.grid),
        chunk_shape=tuple(c[0] for c in job.first.chunks), shape=tuple(job.first.shape),
        skipped=skipped, now=now, later=later, stale=len(job.stale),
        workers=None if client is None else len(workers_info(client)),  # None: not needed
        simulated=backends.current().simulated,
        per_task=1 if layout is None else layout.chunks_per_task)


def _check_connected(client) -> None:
    """Raise a one-line error when the scheduler is gone: the chunks did not fail."""
    if client.status in ("running", "newly-created"):
        return
    address = getattr(client.scheduler, "address", None) or "its address"
    # An OSError cause: the run failed, the job as given was fine (exit 1, not 2).
    raise BatchError(f"lost the scheduler at {address}; the chunks written so far are kept: "
                     "rerun the same job to resume") from ConnectionError(address)
