"""daskgpu on SLURM through dask-jobqueue: one GPU per job, one worker per GPU.

dask-jobqueue submits one SLURM job per worker. Each job asks for a GPU
(``--gres=gpu:1``), its worker offers the resource ``GPU=1`` so that daskgpu's
chunk tasks go to GPU workers, and ``client.register_plugin`` installs
:class:`daskgpu.GPUWorkerPlugin` on every worker, also those that join later.
Every wait has a timeout: a job that cannot start (a full queue, a wrong
partition, a node without the software) ends the script with a message that
says where to look, instead of a hang.

    pip install dask-jobqueue daskgpu
    python deploy/slurm/jobqueue_example.py --jobs 4
"""

import argparse
import asyncio
import sys

import dask.array as da
import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg

# What a timed-out wait raises (asyncio's differs from the builtin before Python 3.11).
TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


# Kernels belong at module level, where `cuda` is a global: simulated
# (daskgpu.simulate on), a kernel travels with its Python function, and one
# defined inside a function would carry `cuda` as a closure variable, which the
# simulator cannot run.
@dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def make_cluster(queue="gpu", account=None, walltime="01:00:00"):
    """A SLURMCluster whose jobs each hold one GPU and run one single-threaded worker."""
    from dask_jobqueue import SLURMCluster

    return SLURMCluster(
        queue=queue,
        account=account,
        cores=1,                     # one thread per worker: one GPU, one stream of launches
        processes=1,
        job_cpu=8,                   # CPU cores reserved per job (copies, compression)
        memory="32GB",
        walltime=walltime,
        job_extra_directives=["--gres=gpu:1"],
        worker_extra_args=["--resources", "GPU=1"],
        # job_script_prologue=["source /path/to/venv/bin/activate"],
    )


def saxpy_sum(client, x, timeout=600):
    """``sum(2 x + 1)`` over the float32 dask array ``x``, by :func:`daskgpu.map_kernel`.

    Raises ``TimeoutError`` when the result takes longer than ``timeout`` seconds.
    """
    y = da.ones_like(x)
    out = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, y)
    return float(client.compute(out.sum()).result(timeout=timeout))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="SLURM jobs (GPUs) to start")
    parser.add_argument("--queue", default="gpu", help="SLURM partition")
    parser.add_argument("--start-timeout", type=float, default=600, metavar="SECONDS",
                        help="how long to wait for the first worker (queueing included)")
    parser.add_argument("--timeout", type=float, default=600, metavar="SECONDS",
                        help="how long to wait for the result")
    parser.add_argument("--size", type=int, default=50_000_000, help="array elements")
    parser.add_argument("--dry-run", action="store_true", help="print the job script and exit")
    args = parser.parse_args(argv)

    cluster = make_cluster(queue=args.queue)
    try:
        if args.dry_run:
            print(cluster.job_script())
            return 0
        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            client.register_plugin(dg.GPUWorkerPlugin())
            try:
                client.wait_for_workers(1, timeout=args.start_timeout)
            except TIMEOUTS:
                print(f"no worker joined in {args.start_timeout:g} s: the SLURM jobs are "
                      "still queued or failed to start. See `squeue --me` and the jobs' "
                      "output files (slurm-JOBID.out); raise --start-timeout to wait longer.",
                      file=sys.stderr)
                return 1
            print(client.run(dg.device_info))
            try:
                x = da.random.random(args.size, chunks=max(args.size // 10, 1))
                total = saxpy_sum(client, x.astype(np.float32), args.timeout)
            except TIMEOUTS:
                print(f"no result in {args.timeout:g} s; the dashboard ({client.dashboard_link})"
                      " shows where the tasks are; raise --timeout to wait longer.",
                      file=sys.stderr)
                return 1
            print("sum:", total)
    finally:
        try:
            cluster.close()
        except AssertionError:
            # Jobs that sbatch refused stay "created", which SpecCluster.close
            # asserts against (dask/distributed#6183) after it has closed the
            # scheduler and cancelled every job: nothing is left to shut down,
            # also not at exit.
            cluster.shutdown_on_close = False
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
