"""On a GPU, both of Dask's array graph layers give the same results and the same placement.

Dask picks its layer once per process (``array.query-planning``), so each
layer runs the same script in a process of its own: a map, a reduction and a
halo map on a ``LocalGPUCluster`` that also has a plain CPU worker, which no
launch may reach.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent('''
    import json, subprocess, sys, time
    import dask, dask.array as da, numpy as np
    from distributed import Client, get_task_stream
    from numba import cuda
    import daskgpu as dg
    from daskgpu._dask.map_kernel.api import expressions_enabled
    from daskgpu._dask.launch_core.walk import runs_launch

    @dg.jit
    def scale(out, a, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i]

    @dg.jit
    def hist(counts, x):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(counts, x[i] % 8, 1)

    @dg.jit
    def smooth(out, x):
        i = cuda.grid(1)
        if 1 <= i < x.size - 1:
            out[i] = x[i - 1] + x[i] + x[i + 1]

    def launching_keys(arr):
        opt = arr.optimize() if expressions_enabled() else arr
        graph = dict(opt.__dask_optimize__(opt.__dask_graph__(), opt.__dask_keys__()))
        return {k for k, t in graph.items() if runs_launch(t)}

    if __name__ == "__main__":
        with dg.LocalGPUCluster(devices=[0], dashboard_address=None) as cluster, \\
                Client(cluster) as client:
            plain = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                      cluster.scheduler_address, "--name", "plain-cpu",
                                      "--nthreads", "2", "--no-dashboard"])
            try:
                client.wait_for_workers(2, timeout=120)
                info = client.scheduler_info(n_workers=-1)["workers"]
                (cpu,) = [a for a, w in info.items() if w["name"] == "plain-cpu"]
                x = da.arange(1 << 16, chunks=1 << 12, dtype=np.float32)
                ints = da.arange(1 << 16, chunks=1 << 12, dtype=np.int64)
                arrays = {
                    "map": dg.map_kernel(scale, dg.Out(np.float32, like=x), 2.0, x),
                    "reduction": dg.map_kernel(
                        hist, dg.Out(np.int64, per_chunk=8, combine="sum"), ints),
                    "halo": dg.map_kernel(smooth, dg.Out(np.float32, like=x), x, depth=1,
                                          boundary=0),
                }
                out, on_cpu = {}, 0
                for name, arr in arrays.items():
                    keys = launching_keys(arr)
                    assert keys, name
                    with get_task_stream(client) as stream:
                        out[name] = np.asarray(arr.compute()).tolist()
                    on_cpu += sum(1 for r in stream.data
                                  if r["key"] in keys and r["worker"] == cpu)
                print(json.dumps({"expressions": expressions_enabled(), "results": out,
                                  "on_cpu": on_cpu}))
            finally:
                plain.terminate()
                plain.wait(30)
''')


def _run(tmp_path, query_planning: bool) -> dict:
    script = tmp_path / f"layers_{query_planning}.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING=str(query_planning),
               DASK_DASKGPU__SIMULATE="0")
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_both_graph_layers_give_the_same_results_on_gpu_workers_only(tmp_path):
    hlg, expr = _run(tmp_path, False), _run(tmp_path, True)
    assert (hlg["expressions"], expr["expressions"]) == (False, True)
    assert hlg["results"] == expr["results"]
    x = np.arange(1 << 16, dtype=np.float32)
    np.testing.assert_array_equal(expr["results"]["map"], 2 * x)
    np.testing.assert_array_equal(expr["results"]["reduction"],
                                  np.bincount(np.arange(1 << 16) % 8, minlength=8))
    padded = np.concatenate([[0], x, [0]])
    np.testing.assert_array_equal(expr["results"]["halo"][1:-1],
                                  (padded[:-2] + padded[1:-1] + padded[2:])[1:-1])
    assert hlg["on_cpu"] == expr["on_cpu"] == 0
