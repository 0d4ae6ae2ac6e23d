"""daskgpu on dask-cuda's ``LocalCUDACluster``: NumPy and CuPy chunks, spilling.

    python examples/dask_cuda.py                 # needs GPUs, CuPy and dask-cuda
    python examples/dask_cuda.py --gib 4 --device-memory-limit 1GB

dask-cuda starts one worker per GPU and brings what daskgpu's own
``LocalGPUCluster`` leaves out: RMM memory pools, UCX, and spilling device
memory to host. ``client.register_plugin(dg.GPUWorkerPlugin())`` sets its
workers up for daskgpu (the runtime imported, the GPU current). Then

- ``client.submit(kernel.forall(n), ...)`` runs a launch on host arrays;
- ``map_kernel`` over NumPy chunks copies each chunk in and the output back;
- ``map_kernel`` over CuPy chunks keeps the outputs on the device, where
  ``device_memory_limit`` spills them to host memory once they exceed it.
"""

from __future__ import annotations

import argparse

import dask.array as da
import numpy as np
from distributed import Client
from numba import cuda

import daskgpu as dg


@dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def spilled(dask_worker) -> dict:
    """Keys a dask-cuda worker holds on the device and spilled to host or disk."""
    data = dask_worker.data
    return {where: len(getattr(data, where, None) or ())
            for where in ("device", "host", "disk")}


def main(gib=1.0, device_memory_limit="512MB", cluster=None):
    """Run the three cases; return ``{"spilled": {worker: counts}, "sum": float}``."""
    import cupy as cp
    from dask_cuda import LocalCUDACluster

    own = cluster is None
    if own:
        cluster = LocalCUDACluster(device_memory_limit=device_memory_limit,
                                   dashboard_address=None)
    try:
        with Client(cluster) as client:
            client.register_plugin(dg.GPUWorkerPlugin())
            a = np.float32(2)

            # One launch on host arrays: the arrays the kernel wrote come back.
            x = np.arange(1 << 20, dtype=np.float32)
            out = client.submit(saxpy.forall(x.size), np.empty_like(x), a, x, x).result()
            np.testing.assert_array_equal(out, 3 * x)

            # NumPy chunks: copied in, launched, copied back per chunk.
            xh = da.arange(1 << 22, dtype=np.float32, chunks=1 << 20)
            zh = dg.map_kernel(saxpy, dg.Out(np.float32, like=xh), a, xh, xh)
            np.testing.assert_array_equal(zh.compute(), 3 * np.arange(1 << 22, dtype=np.float32))

            # CuPy chunks: the outputs stay on the device, and spill past the limit.
            n = int(gib * 2**30) // 4
            xd = da.ones(n, dtype=np.float32, chunks=1 << 24).map_blocks(cp.asarray)
            zd = dg.map_kernel(saxpy, dg.Out(np.float32, like=xd), a, xd, xd)
            zd = client.persist(zd)
            total = float(zd.sum(dtype=np.float64).compute())
            assert total == 3.0 * n, (total, 3.0 * n)
            counts = client.run(spilled)
            print(f"dask-cuda: submit, NumPy and CuPy chunks OK; {gib:g} GiB of CuPy outputs "
                  f"under device_memory_limit={device_memory_limit}, keys per worker "
                  f"(device/host/disk): "
                  + ", ".join(f"{c['device']}/{c['host']}/{c['disk']}" for c in counts.values()))
            return {"spilled": counts, "sum": total}
    finally:
        if own:
            cluster.close()


if __name__ == "__main__":  # workers re-import this file: start the cluster only here
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0,
                        help="GiB of CuPy map_kernel outputs to persist (default 1)")
    parser.add_argument("--device-memory-limit", default="512MB",
                        help="dask-cuda's spill threshold per GPU (default 512MB)")
    args = parser.parse_args()
    main(args.gib, args.device_memory_limit)
