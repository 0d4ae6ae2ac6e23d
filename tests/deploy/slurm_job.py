"""The client script that tests/deploy/test_slurm.py runs under deploy/slurm/daskgpu.sbatch.

    sbatch ... deploy/slurm/daskgpu.sbatch tests/deploy/slurm_job.py RESULT [MEET PEERS]

Connects through the scheduler file the batch script exports, maps a kernel over a
dask array with :func:`daskgpu.map_kernel`, checks the result against NumPy and
writes what it saw to the JSON file RESULT. With MEET (a directory) and PEERS (a
number of jobs), it waits, once its own cluster is up, until PEERS jobs have
written their mark there, so that those jobs' clusters provably ran at once.
Every wait has a timeout.
"""

import json
import os
import pathlib
import sys
import time

import numpy as np
from numba import cuda

import daskgpu as dg

TIMEOUT = 90  # seconds, for each wait


@dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def meet(directory, peers, me):
    """Leave a mark in ``directory``; wait until ``peers`` marks are there."""
    directory = pathlib.Path(directory)
    (directory / me).write_text(str(os.getpid()))
    deadline = time.monotonic() + TIMEOUT
    while len(list(directory.iterdir())) < peers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(directory.iterdir()))} of {peers} jobs came")
        time.sleep(0.2)


def main(argv):
    import dask.array as da
    from distributed import Client

    result = pathlib.Path(argv[0])
    with Client(scheduler_file=os.environ["DASKGPU_SCHEDULER_FILE"],
                timeout=f"{TIMEOUT}s") as client:
        client.wait_for_workers(1, timeout=TIMEOUT)
        if len(argv) > 1:
            meet(argv[1], int(argv[2]), os.environ.get("SLURM_JOB_ID", str(os.getpid())))
        x = da.arange(512, chunks=128, dtype=np.float32)  # simulated: keep it small
        y = da.ones_like(x)
        out = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, y)
        got = client.compute(out).result(timeout=TIMEOUT)
        np.testing.assert_array_equal(got, 2 * np.arange(512, dtype=np.float32) + 1)
        info = client.run(dg.device_info)
        result.write_text(json.dumps({
            "scheduler": client.scheduler.address,
            "workers": {addr: {"simulated": i["simulated"]} for addr, i in info.items()},
            "resources": [w["resources"] for w in
                          client.scheduler_info()["workers"].values()],
        }))
    print("slurm_job: map_kernel result checked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
