"""``daskgpu demo``: saxpy over a dask array on the embedded local GPU cluster.

Starts :class:`~daskgpu.LocalGPUCluster` (simulated without a GPU), maps a
saxpy kernel over the chunks of two random arrays with
:func:`~daskgpu.map_kernel`, checks the result against NumPy on the workers,
and reports the time and which worker ran each chunk.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from numba import cuda

#: Default sizes (elements): 256 MB per float32 array on a GPU, and a size the
#: CUDA simulator, which runs each GPU thread as Python, finishes in seconds.
GPU_SIZE = 1 << 26
SIMULATED_SIZE = 10_000


def _saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def _kernel():
    import daskgpu as dg

    return dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")(_saxpy)


def run(size=None, simulate=None, cluster=None, *, chunks=None, verbose=True) -> dict:
    """Run saxpy over a dask array on a local GPU cluster; return a summary.

    Parameters
    ----------
    size : int, optional
        Elements per array. Default: 2**26 (256 MB per float32 array) on a
        GPU, 10,000 when simulated.
    simulate : bool, optional
        Run kernels in Numba's CUDA simulator. Default: only without a GPU.
    cluster : distributed cluster, optional
        Run on this cluster instead of starting a
        :class:`~daskgpu.LocalGPUCluster`; it is left running.
    chunks : int, optional
        Elements per chunk. Default: four chunks per worker.
    verbose : bool
        Print the report.

    Returns
    -------
    dict
        ``ok`` (the result matched NumPy), ``size``, ``chunks``, ``simulated``,
        ``workers``, ``placement`` (chunk index to worker address),
        ``first_s`` and ``warm_s`` (wall seconds of the first and a second
        pass), ``gbps`` (GB read and written per second, warm; None when
        simulated) and
        ``max_abs_error``.

    Examples
    --------
    >>> from daskgpu._cli import demo as _demo
    >>> summary = _demo.run()  # doctest: +SKIP
    saxpy over 67,108,864 float32 elements in 8 chunks on 1 worker(s) (GPU)
    ...
    >>> summary["ok"]  # doctest: +SKIP
    True
    """
    import dask
    import dask.array as da
    from distributed import Client, get_task_stream, wait

    import daskgpu as dg
    from daskgpu._dask.cluster_facts import workers_info
    from daskgpu._runtime import backends

    say = print if verbose else (lambda *a, **k: None)
    own = cluster is None
    if own:
        # No dashboard: a demo needs none, and a taken port 8787 would warn.
        cluster = dg.LocalGPUCluster(simulate=simulate, dashboard_address=None)
    try:
        simulated = bool(getattr(cluster, "simulated", simulate if simulate is not None
                                 else backends.current().simulated))
        if simulate is not None and simulate != simulated:
            raise ValueError(
                f"simulate={simulate} but the cluster given runs "
                f"{'simulated' if simulated else 'on GPUs'}; leave simulate=None"
            )
        with Client(cluster) as client, dask.config.set({"daskgpu.simulate": simulated}):
            workers = sorted(workers_info(client))
            size = int(size or (SIMULATED_SIZE if simulated else GPU_SIZE))
            chunks = int(chunks or max(1, math.ceil(size / (4 * len(workers)))))
            rng = da.random.default_rng(42)
            x = rng.random(size, dtype=np.float32, chunks=chunks)
            y = rng.random(size, dtype=np.float32, chunks=chunks)
            x, y = client.persist([x, y])
            wait([x, y])
            a = np.float32(2.5)
            saxpy = _kernel()
            say(f"saxpy over {size:,} float32 elements in {x.numblocks[0]} chunks on "
                f"{len(workers)} worker(s) ({'simulated' if simulated else 'GPU'})")
            if not own and client.dashboard_link:  # a cluster of our own has none
                say(f"  dashboard: {client.dashboard_link}")

            times = []
            for i in range(2):  # distinct keys, so the second pass really runs
                # A prefix, as da.map_blocks' token=: a hash of the arguments follows.
                z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), a, x, y,
                                  token=f"saxpy-demo{i}")
                with get_task_stream(client) as ts:
                    t0 = time.perf_counter()
                    (z,) = client.persist([z])
                    wait(z)
                    times.append(time.perf_counter() - t0)
            placement = _placement(ts.data, z.name)
            error = float(abs(z - (a * x + y)).max().compute())
            # Both sides round in float32; a GPU may fuse the multiply-add.
            ok = error <= 8 * np.finfo(np.float32).eps and len(placement) == z.numblocks[0]
            # The simulator runs each GPU thread as Python: no bandwidth to speak of.
            gbps = None if simulated else 3 * 4 * size / times[1] / 1e9
            if z.numblocks[0] != x.numblocks[0]:
                say(f"  small chunks grouped into {z.numblocks[0]} launch(es) "
                    "(daskgpu.launch-bytes; group=False launches once per chunk)")
            for w in workers:
                mine = sorted(c for c, ww in placement.items() if ww == w)
                say(f"  {w}: launches {mine}")
            first = "first-use setup" if simulated else "linking for the GPU"
            rate = "" if gbps is None else f" ({gbps:.3g} GB/s)"
            say(f"first pass {times[0]:.3f} s (includes {first}), second {times[1]:.3f} s"
                f"{rate}; max |error| vs NumPy {error:.2e}: {'OK' if ok else 'MISMATCH'}")
    finally:
        if own:
            cluster.close()
    return {
        "ok": ok, "size": size, "chunks": chunks, "simulated": simulated,
        "workers": workers, "placement": placement, "first_s": times[0],
        "warm_s": times[1], "gbps": gbps, "max_abs_error": error,
    }


def _placement(task_stream, name) -> dict:
    """Chunk index to worker address, for the tasks of the array ``name``."""
    out = {}
    for rec in task_stream:
        key = rec.get("key")
        if isinstance(key, tuple) and key and key[0] == name:
            out[key[1]] = rec["worker"]
    return out


def main(argv=None) -> int:
    """``daskgpu demo [--size N] [--simulate | --no-simulate]``; 0 when the check passed.

    Examples
    --------
    >>> from daskgpu._cli import demo as _demo
    >>> _demo.main(["--size", "1000000"])  # doctest: +SKIP
    0
    """
    from daskgpu._cli.common import Parser, positive_int
    from daskgpu._errors import UsageError

    parser = Parser(prog="daskgpu demo", description=__doc__)
    parser.add_argument("--size", type=positive_int, metavar="N",
                        help=f"elements (float32) per array (default {GPU_SIZE:,} on a "
                             f"GPU, {SIMULATED_SIZE:,} simulated)")
    parser.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=None,
                        help="run in Numba's CUDA simulator (default: only without a GPU)")
    try:
        ns = parser.parse_args(argv)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"daskgpu demo: error: {exc}", file=sys.stderr)
        return 2
    if ns.simulate is False:
        _require_gpu()
    return 0 if run(size=ns.size, simulate=ns.simulate)["ok"] else 1


def _require_gpu() -> None:
    """``--no-simulate`` where there is no GPU: one line in the command line's own words
    (the cluster's says ``simulate=True``, for Python)."""
    from daskgpu._errors import DeviceError
    from daskgpu._runtime import backends

    found = backends.GPU.devices()
    if not found.names:
        raise DeviceError(
            f"--no-simulate, but there is no CUDA GPU here ({found.reason}). Install the "
            "NVIDIA driver and check CUDA_VISIBLE_DEVICES, or leave out --no-simulate "
            "(without a GPU the demo runs in Numba's CUDA simulator)")


if __name__ == "__main__":
    raise SystemExit(main())
