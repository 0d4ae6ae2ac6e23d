"""Faults during a map_kernel job: a worker process dies, the result is still whole."""

import threading
import time

import numpy as np
from numba import cuda

import daskgpu as dg


@dg.jit("void(float32[::1], float32[::1], int64)")
def slow_double(out, x, start):
    # start (dg.offset) keeps each chunk's work tied to its place in the array.
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i] + (start + i) * 0


def test_worker_killed_mid_job_result_is_complete():
    import dask.array as da
    from distributed import Client

    xn = np.arange(24000, dtype=np.float32)
    with dg.LocalGPUCluster(simulate=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        x = da.from_array(xn, chunks=1000)  # 24 chunks, each ~0.15 s simulated
        out = dg.map_kernel(slow_double, dg.Out(np.float32, like=x), x, dg.offset)
        future = client.compute(out)

        killed = []

        def kill_one_worker_once_busy():
            deadline = time.time() + 60
            while time.time() < deadline:
                processing = client.processing()
                busy = [w for w, keys in processing.items() if keys]
                if busy:
                    # The nanny sees its worker process die and starts another;
                    # the scheduler reruns what was lost.
                    client.run(
                        lambda: __import__("threading").Timer(
                            0.05, __import__("os")._exit, (1,)).start(),
                        workers=[busy[0]],
                    )
                    killed.append(busy[0])
                    return
                time.sleep(0.05)

        killer = threading.Thread(target=kill_one_worker_once_busy)
        killer.start()
        result = future.result(timeout=240)
        killer.join()
        assert killed, "no worker was busy to be killed"
        deadline = time.time() + 30
        while killed[0] in client.scheduler_info()["workers"] and time.time() < deadline:
            time.sleep(0.2)
        assert killed[0] not in client.scheduler_info()["workers"]
    np.testing.assert_array_equal(result, 2 * xn)
