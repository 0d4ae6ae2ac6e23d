"""What ``daskgpu bench`` runs in processes of their own.

The cold-start programs time a fresh Python from before its first import to a
first result. :func:`cold_start_command` runs one through ``python -c``, which
starts the clock and then imports this module: ``python -m`` would import
daskgpu before any line of the module ran, and keep that import out of the
figure. Each prints its seconds on its last line.

Numba's random states run as ``python -m daskgpu._cli.bench.fresh N SEED START
JUMPS`` and print :func:`numba_states` as JSON; they time from after their
imports.

This module imports nothing but the standard library at its top, and never
numba in the daskgpu program: numba is importable there, but a daskgpu launch
must not need it.
"""

import pickle
import sys
import time

_COLD_START = ("import sys, time; t0 = time.perf_counter(); "
               "from daskgpu._cli.bench.fresh import {0}; {0}(t0, *sys.argv[1:])")


def cold_start_command(program: str) -> list:
    """The command line that runs ``program(t0, *ARGS)`` of this module in a fresh Python.

    ``t0`` is the time just before the program's first import; append the
    program's arguments.

    Examples
    --------
    >>> command = cold_start_command("daskgpu_first_result")
    >>> command[1], command[2].split("; ")[-1]
    ('-c', 'daskgpu_first_result(t0, *sys.argv[1:])')
    """
    return [sys.executable, "-c", _COLD_START.format(program)]


def daskgpu_first_result(t0: float, path: str) -> None:
    """Unpickle the daskgpu launch in file ``path``, run it on 2**20 ones; print the
    seconds."""
    import numpy as np

    with open(path, "rb") as f:
        launch = pickle.loads(f.read())
    x = np.ones(1 << 20, np.float32)
    out = launch(np.empty_like(x), x, x)
    assert out[0] == 2.0
    print(time.perf_counter() - t0)


def cuda_context_floor(t0: float, path: str) -> None:
    """Import numpy and make the GPU's primary context current, as any CUDA process must
    before its first kernel; print the seconds. (``path`` is not read.)"""
    import numpy as np  # noqa: F401
    from cuda.bindings import driver

    assert driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS
    err, device = driver.cuDeviceGet(0)
    err, context = driver.cuDevicePrimaryCtxRetain(device)
    assert driver.cuCtxSetCurrent(context)[0] == driver.CUresult.CUDA_SUCCESS
    print(time.perf_counter() - t0)


def numba_first_result(t0: float, path: str) -> None:
    """Unpickle the Numba dispatcher in file ``path``, launch it on 2**20 ones; print the
    seconds."""
    import numpy as np

    with open(path, "rb") as f:
        kernel = pickle.loads(f.read())
    x = np.ones(1 << 20, np.float32)
    out = np.empty_like(x)
    kernel[(x.size + 255) // 256, 256](out, x, x)
    assert out[0] == 2.0
    print(time.perf_counter() - t0)


def numba_states(n: int, seed: int, start: int, jumps: int) -> dict:
    """Numba's ``create_xoroshiro128p_states(n, seed, subsequence_start=start)``, timed.

    Returns
    -------
    dict
        ``seconds`` to build the states on the GPU, ``per_jump``: seconds of one
        host jump, measured over ``jumps`` of them, and ``ends``: the first and
        last state as ``[s0, s1]`` pairs.
    """
    import numpy as np
    from numba import cuda
    from numba.cuda.random import (
        create_xoroshiro128p_states,
        init_xoroshiro128p_states_cpu,
        xoroshiro128p_dtype,
    )

    init_xoroshiro128p_states_cpu(np.empty(2, xoroshiro128p_dtype), 1, 1)  # compiled before timing
    cuda.current_context()
    t0 = time.perf_counter()
    states = create_xoroshiro128p_states(n, seed, subsequence_start=start)
    cuda.synchronize()
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    init_xoroshiro128p_states_cpu(np.empty(1, xoroshiro128p_dtype), seed, jumps)
    per_jump = (time.perf_counter() - t0) / jumps
    ends = states.copy_to_host()[[0, -1]]
    return {"seconds": seconds, "per_jump": per_jump,
            "ends": [[int(e["s0"]), int(e["s1"])] for e in ends]}


if __name__ == "__main__":
    import json

    print(json.dumps(numba_states(*map(int, sys.argv[1:5]))))
