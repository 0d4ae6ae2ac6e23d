"""The sections ``cold`` and ``first-task``: how long until a kernel's first result.

``cold`` times a fresh process from its first import to a first result;
``first-task`` the first task of a new kernel on a started Dask worker, where
daskgpu links PTX and Numba compiles.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
import time

from daskgpu._cli.bench.common import BenchCluster, ratio
from daskgpu._cli.bench.fresh import cold_start_command


def run_fresh_process(program: str, blob: bytes, env=None) -> float:
    """Seconds that :mod:`~daskgpu._cli.bench.fresh`'s ``program`` reports for ``blob``.

    ``blob`` goes to the process in a temporary file, removed afterwards; a
    failed process raises :class:`RuntimeError` with its standard error.
    """
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        f.write(blob)
    try:
        out = subprocess.run(
            [*cold_start_command(program), f.name], capture_output=True, text=True,
            env=env, check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench subprocess failed:\n{out.stderr}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)


def bytecode_cached_env(cache_dir: str) -> dict:
    """This process's environment for a child that caches bytecode in ``cache_dir``.

    A cold start is a fresh process of an installed package, and pip compiles
    bytecode when it installs one. An environment that forbids writing it
    (``PYTHONDONTWRITEBYTECODE``, as many containers set, or a read-only tree)
    makes every child compile each module it imports from source, and not
    alike: on the H200 machine, which sets ``PYTHONDONTWRITEBYTECODE`` and
    whose Numba was installed without bytecode, Numba's child took 1.91 s
    without a cache and 1.19 s with one, daskgpu's 0.54 s and 0.52 s. With a
    cache of their own, written by one untimed run, both children read
    bytecode, as a user's processes do.

    Examples
    --------
    >>> env = bytecode_cached_env("/tmp/pyc")
    >>> env["PYTHONPYCACHEPREFIX"], "PYTHONDONTWRITEBYTECODE" in env
    ('/tmp/pyc', False)
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def bench_cold(repeat: int = 3) -> list:
    """Fresh process to first result: a pickled daskgpu launch vs a pickled Numba dispatcher.

    Both children read bytecode cached by an untimed first run of each
    (:func:`bytecode_cached_env`). A second row sets daskgpu's time against
    the floor of any CUDA process in Python: importing numpy and making the
    GPU's primary context current, with nothing of daskgpu's.
    """
    import cloudpickle
    from numba.cuda import cloudpickle as numba_cloudpickle

    from daskgpu._cli.bench import kernels as k

    launch_blob = pickle.dumps(k.add.forall(1 << 20))
    # The dispatcher's function by value, as from a user's script: by reference,
    # the child would import the bench's kernels module and time its dg.jit
    # compiles as part of Numba's start. (Numba pickles the function with its
    # own copy of cloudpickle.)

    numba_cloudpickle.register_pickle_by_value(k)
    try:
        numba_blob = cloudpickle.dumps(k.numba_add)
    finally:
        numba_cloudpickle.unregister_pickle_by_value(k)
    # numba is importable in the daskgpu child, but must not be imported there.
    with tempfile.TemporaryDirectory(prefix="daskgpu-bench-pyc-") as cache:
        env = bytecode_cached_env(cache)
        run_fresh_process("daskgpu_first_result", launch_blob, env)  # untimed: writes the cache
        run_fresh_process("numba_first_result", numba_blob, env)
        dg, nb, floor = [], [], []
        for _ in range(repeat):  # interleaved, so drift on the machine hits all alike
            dg.append(run_fresh_process("daskgpu_first_result", launch_blob, env))
            nb.append(run_fresh_process("numba_first_result", numba_blob, env))
            floor.append(run_fresh_process("cuda_context_floor", b"", env))
    return [
        ratio("cold start, fresh process to first result", dg, nb, "s",
              "numba pickled dispatcher", goal=0.25),
        ratio("  the same", dg, floor, "s", "numpy + the GPU's context, nothing else"),
    ]


def first_task_run(kernel, size: int) -> float:
    """On a worker: launch ``kernel`` on new CuPy arrays of ``size`` float32; ``out[0]``."""
    import cupy as cp

    x = cp.ones(size, cp.float32)
    out = cp.empty_like(x)
    kernel[(size + 255) // 256, 256](out, x, x)
    return float(out[0])  # copies back, so the launch has finished


def prepare_worker(size: int) -> None:
    """On a started worker: what a user's first task finds ready on both sides.

    The worker plugin has imported daskgpu's runtime and made the GPU current;
    here Numba's CUDA target and CuPy get the same, so that the first timed
    task measures linking (daskgpu) against compiling (Numba) alone.
    """
    import cupy as cp
    from numba import cuda

    cuda.current_context()
    cp.empty_like(cp.ones(size, cp.float32))
    cp.cuda.Device().synchronize()


def bench_first_task(cluster: BenchCluster, repeat: int = 3, size: int = 1024) -> list:
    """First task of a kernel on a started worker: daskgpu links PTX, Numba compiles.

    The first row starts a cluster of its own for each kernel, with
    ``cluster``'s threads per worker; the second runs on ``cluster``.
    """
    import itertools
    import random

    from numba import cuda

    import daskgpu as dg
    from daskgpu._cli.bench import kernels as k

    # Every kernel bakes in its own constant, so its PTX, image hash and
    # dispatcher are new: no module cache, disk cache (cache-dir, were it on)
    # or Numba dispatcher can serve it. The random start keeps a disk cache
    # left by an earlier run from matching too.
    constants = itertools.count(random.randrange(1 << 20))

    def ours():
        c = float(next(constants))  # integers below 2**24 add exactly in float32
        return dg.jit(k.ADD_SIG)(k.add_constant(c)), c  # compiled here, untimed

    def numba():
        c = float(next(constants))
        return cuda.jit(k.add_constant(c)), c  # compiles on the worker, on first call

    def first_task(client, kernel, c):
        t0 = time.perf_counter()
        value = client.submit(first_task_run, kernel, size, pure=False).result(timeout=300)
        seconds = time.perf_counter() - t0
        assert value == 2.0 + c, (value, c)
        return seconds

    def on_new_cluster(kernel, c):
        # A new cluster, not client.restart(): its workers are as fresh, and
        # its cost stays out of the timing either way.
        from distributed import Client

        from daskgpu._dask.cluster import LocalGPUCluster

        with LocalGPUCluster(threads_per_worker=cluster.options.threads_per_worker,
                             dashboard_address=None) as new, \
                Client(new, set_as_default=False) as fresh:
            fresh.run(prepare_worker, size)
            return first_task(fresh, kernel, c)

    # On a started worker: its first link against Numba's first compile.
    cold_dg, cold_nb = [], []
    for _ in range(repeat):
        cold_dg.append(on_new_cluster(*ours()))
        cold_nb.append(on_new_cluster(*numba()))
    # On workers that have linked and compiled before: each further new kernel.
    client = cluster.client
    client.run(prepare_worker, size)
    client.run(first_task_run, ours()[0], size)
    client.run(first_task_run, numba()[0], size)
    dg_t, nb_t = [], []
    for _ in range(repeat):  # interleaved, so drift on the worker hits both alike
        dg_t.append(first_task(client, *ours()))
        nb_t.append(first_task(client, *numba()))
    return [
        ratio(f"first task on a started worker ({size} float32)", cold_dg, cold_nb, "ms",
              "the first task of a Numba dispatcher there (compiles)", goal=0.05, scale=1e3),
        ratio("  then: first task of each further new kernel", dg_t, nb_t, "ms",
              "a new Numba dispatcher, compiled in that task", scale=1e3),
    ]
