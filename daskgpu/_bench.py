"""``daskgpu bench``: daskgpu against what a user would write by hand, side by side.

Every figure is measured in the same run as its baseline, on the same data, and
reported as a ratio; absolute times mean something only on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

_COLD_DASKGPU = """
import pickle, sys, time
t0 = time.perf_counter()
import numpy as np
launch = pickle.loads(open(sys.argv[1], "rb").read())
x = np.ones(1 << 20, np.float32)
out = launch(np.empty_like(x), x, x)
assert out[0] == 2.0
print(time.perf_counter() - t0)
"""

_COLD_NUMBA = """
import pickle, sys, time
t0 = time.perf_counter()
import numpy as np
kernel = pickle.loads(open(sys.argv[1], "rb").read())
x = np.ones(1 << 20, np.float32)
out = np.empty_like(x)
kernel[(x.size + 255) // 256, 256](out, x, x)
assert out[0] == 2.0
print(time.perf_counter() - t0)
"""


def _fresh_process(script: str, blob: bytes, env=None) -> float:
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        f.write(blob)
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, f.name], capture_output=True, text=True,
            env=env, check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench subprocess failed:\n{out.stderr}")
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)


def bench_cold(repeat: int = 3) -> dict:
    """Fresh process to first result: a pickled daskgpu launch vs a pickled Numba dispatcher."""
    import cloudpickle

    from daskgpu import _bench_kernels as k

    launch_blob = pickle.dumps(k.add.forall(1 << 20))
    numba_blob = cloudpickle.dumps(k.numba_add)
    env = dict(os.environ)
    # numba is importable in the daskgpu child, but must not be imported there.
    dg = [_fresh_process(_COLD_DASKGPU, launch_blob, env) for _ in range(repeat)]
    nb = [_fresh_process(_COLD_NUMBA, numba_blob, env) for _ in range(repeat)]
    return _ratio("cold start, fresh process to first result", dg, nb, "s",
                  "numba pickled dispatcher", goal=0.3)


def _sync():
    from cuda.bindings import driver

    driver.cuCtxSynchronize()


def bench_launch(n: int = 20000, size: int = 1024) -> dict:
    """Warm host time per launch on device arrays: daskgpu vs a Numba dispatcher."""
    import cupy as cp

    from daskgpu import _bench_kernels as k

    x = cp.ones(size, cp.float32)
    out = cp.empty_like(x)
    blocks = (size + 255) // 256
    dg_launch = k.add[blocks, 256]
    nb_launch = k.numba_add[blocks, 256]

    def per_launch(fn):
        for _ in range(100):
            fn(out, x, x)
        _sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(out, x, x)
        _sync()
        return (time.perf_counter() - t0) / n

    dg = [per_launch(dg_launch) for _ in range(3)]
    nb = [per_launch(nb_launch) for _ in range(3)]
    assert float(out[0]) == 2.0
    return _ratio(f"warm host overhead per launch ({size} elements, device arrays)",
                  dg, nb, "us", "numba dispatcher launch", goal=0.3, scale=1e6)


def _ratio(what, ours, base, unit, base_name, goal=None, scale=1.0) -> dict:
    a, b = min(ours) * scale, min(base) * scale
    return {
        "what": what,
        "daskgpu": a,
        "baseline": b,
        "baseline_name": base_name,
        "unit": unit,
        "ratio": a / b,
        "goal": goal,
        "samples_daskgpu": [x * scale for x in ours],
        "samples_baseline": [x * scale for x in base],
    }


SECTIONS = {"cold": bench_cold, "launch": bench_launch}


def _table(rows) -> str:
    lines = [f"{'comparison':<58} {'daskgpu':>10} {'baseline':>10} {'ratio':>7} {'goal':>6}"]
    for r in rows:
        goal = "" if r.get("goal") is None else f"<={r['goal']}"
        lines.append(
            f"{r['what'][:58]:<58} {r['daskgpu']:>9.3g}{r['unit'][:1]} "
            f"{r['baseline']:>9.3g}{r['unit'][:1]} {r['ratio']:>7.3f} {goal:>6}"
        )
        lines.append(f"    baseline: {r['baseline_name']}; unit {r['unit']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="daskgpu bench", description=__doc__)
    parser.add_argument("sections", nargs="*", default=list(SECTIONS),
                        help=f"which comparisons to run (default all: {', '.join(SECTIONS)})")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    rows = []
    for name in args.sections:
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
        row = SECTIONS[name]()
        rows.append(row)
        print(_table([row]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
