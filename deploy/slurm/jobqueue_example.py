"""daskgpu on SLURM through dask-jobqueue: one GPU per job, one worker per GPU.

dask-jobqueue submits one SLURM job per worker. Each job asks for a GPU
(``--gres=gpu:1``), its worker offers the resource ``GPU=1`` so that daskgpu's
chunk tasks go to GPU workers, and ``client.register_plugin`` installs
:class:`daskgpu.GPUWorkerPlugin` on every worker, also those that join later.

    pip install dask-jobqueue daskgpu
    python deploy/slurm/jobqueue_example.py --jobs 4
"""

import argparse

import numpy as np


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="SLURM jobs (GPUs) to start")
    parser.add_argument("--queue", default="gpu", help="SLURM partition")
    parser.add_argument("--dry-run", action="store_true", help="print the job script and exit")
    args = parser.parse_args(argv)

    cluster = make_cluster(queue=args.queue)
    if args.dry_run:
        print(cluster.job_script())
        return 0

    import dask.array as da
    from distributed import Client
    from numba import cuda

    import daskgpu as dg

    @dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
    def saxpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    cluster.scale(jobs=args.jobs)
    with Client(cluster) as client:
        client.register_plugin(dg.GPUWorkerPlugin())
        client.wait_for_workers(1)
        print(client.run(dg.device_info))
        x = da.random.random(50_000_000, chunks=5_000_000).astype(np.float32)
        y = da.ones_like(x)
        out = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, y)
        print("sum:", float(out.sum().compute()))
    cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
