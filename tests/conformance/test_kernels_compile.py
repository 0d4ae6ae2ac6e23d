"""The conformance suite's part that runs without a GPU: every kernel it compiles.

``kernels.pkl.gz`` holds each kernel that numba-cuda's tests (the modules of
``run.py``, issue #13's list and the extra ones) compiled through daskgpu on the
GPU machine, as plain data (``kernel_refs.py``). Here each is rebuilt from the
installed test modules' source, compiled for ``daskgpu.target-cc`` with no
driver, pickled, and the pickles loaded in a fresh process where numba cannot
be imported. A kernel that numba-cuda itself cannot compile (``compile_ptx``
for the same cc fails too: the tests of numba's own typing errors) is counted
and left out; so is one whose function cannot be rebuilt from source here (made
by ``exec``, or closing over a device array). Run with ``-n 0 -s`` to see the counts.
Regenerate the file with ``run.py`` on the GPU machine (it writes
``OUTDIR/kernels.pkl.gz``; merge the listed and the extra runs) when the module
lists change.
"""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "kernels.pkl.gz")
sys.path.insert(0, HERE)

import kernel_refs  # noqa: E402

# numba-cuda's own tests define kernels with debug=True and opt=True, and numba
# warns about that option pair (its message starts with a color code) each time
# one is rebuilt here as they defined it.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*debug=True with opt=True:numba.cuda.core.errors.NumbaInvalidConfigWarning")


def _records():
    with gzip.open(MANIFEST, "rb") as f:
        return [pickle.loads(r) for r in pickle.load(f)]


# Rebuilt from source, these closures call intrinsics whose rebuilt copies crash
# numba's typing (a segfault); compiled as the test defines them, they compile.
_NOT_REBUILDABLE = frozenset({
    ("cuda.tests.cudapy.test_extending", "TestIntrinsic.test_void_return.<locals>.call_void_func"),
    ("cuda.tests.cudapy.test_extending",
     "TestIntrinsic.test_void_return.<locals>.call_non_void_func"),
})


def _compile_all(records):
    import numba.cuda

    import daskgpu as dg
    from daskgpu import _config

    counts = {"recorded": len(records), "compiled": 0, "not_rebuilt": 0,
              "numba_cannot": 0}
    lost, pickles = [], []
    cc = tuple(int(p) for p in str(_config.get("target-cc")).split("."))
    with kernel_refs.no_gpu_imports() as jit:
        rebuild = kernel_refs.Rebuilder(jit)
        for r in records:
            where = f"{r['module']}:{r['qualname']}{r['argtypes']}"
            try:
                fn = rebuild.function(r["function"]) if r["function"] else None
            except Exception:  # noqa: BLE001 - counted: the source moved, or a closure
                fn = None
            if (r["module"], r["qualname"]) in _NOT_REBUILDABLE:
                fn = None
            if fn is None:
                counts["not_rebuilt"] += 1
                continue
            options = dict(r["options"])
            if "link" in options:
                options["link"] = [kernel_refs.local_path(p) for p in options["link"]]
            try:
                kernel = dg.kernel(jit(fn, **options), signatures=[r["argtypes"]])
                pickles.append(pickle.dumps(kernel))
                counts["compiled"] += 1
            except Exception as exc:  # noqa: BLE001 - compared with numba's own compile
                try:
                    numba.cuda.compile_ptx(fn, r["argtypes"], cc=cc, **{
                        k: v for k, v in r["options"].items()
                        if k in ("fastmath", "debug", "lineinfo", "opt")})
                except Exception as numba_exc:  # noqa: BLE001 - nor numba, without a GPU
                    counts["numba_cannot"] += 1
                    counts.setdefault("numba_cannot_why", []).append(
                        f"{where}: {type(numba_exc).__name__}: {str(numba_exc)[:120]}")
                    continue
                lost.append(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return counts, lost, pickles


def _compile_part(start, stop):
    """In a process of its own: :func:`_compile_all` of the manifest's records[start:stop]."""
    import warnings

    warnings.filterwarnings("ignore", ".*debug=True with opt=True")  # as pytestmark, here
    return _compile_all(_records()[start:stop])


def _compile_in_processes(records, progress, parts=8):
    """:func:`_compile_all` of ``records`` in contiguous parts, on every core the machine
    gives (the rest of the suite runs on one); a line of progress as each part ends."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    bounds = [len(records) * i // parts for i in range(parts + 1)]
    counts = {"recorded": len(records), "compiled": 0, "not_rebuilt": 0, "numba_cannot": 0}
    lost, pickles, done = [], [], 0
    # spawn: a forked child would inherit numba's LLVM state mid-use.
    with ProcessPoolExecutor(max(1, min(cores or 1, 4)), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_compile_part, a, b): b - a for a, b in zip(bounds, bounds[1:])}
        for future in as_completed(futures):
            part_counts, part_lost, part_pickles = future.result()
            for key, value in part_counts.items():
                if key == "recorded":
                    continue
                counts[key] = counts.get(key, [] if isinstance(value, list) else 0) + value
            lost += part_lost
            pickles += part_pickles
            done += futures[future]
            progress(done, len(records))
    return counts, lost, pickles


class _Progress:
    """A line on the terminal as parts end, at most every 20 s: the check takes minutes."""

    def __init__(self, capsys, start, every=20.0):
        self.capsys, self.start, self.every = capsys, start, every
        self.shown = start

    def __call__(self, done, total):
        now = time.perf_counter()
        if now - self.shown >= self.every:
            self.shown = now
            with self.capsys.disabled():
                print(f"\n[conformance] compiled {done} of {total} kernels, "
                      f"{now - self.start:.0f} s", flush=True)


_LOAD_WITHOUT_NUMBA = """
import pickle, sys
sys.modules["numba"] = None  # any import of numba, or of its test modules, fails
blobs = pickle.load(sys.stdin.buffer)
kernels = [pickle.loads(b) for b in blobs]
assert all(type(k).__name__ == "PTXKernel" for k in kernels)
assert all(im.py_func is None and im.ptx for k in kernels for im in k.images)
leaked = sorted(m for m, mod in sys.modules.items()
                if mod is not None and m.split(".")[0] in ("numba", "numba_cuda"))
assert not leaked, leaked
print(len(kernels))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(MANIFEST), reason="no kernels.pkl.gz recorded yet")
def test_every_recorded_kernel_compiles_and_ships_ptx_only_with_no_driver(capsys):
    start = time.perf_counter()
    records = _records()
    counts, lost, pickles = _compile_in_processes(records, _Progress(capsys, start))
    proc = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_NUMBA], input=pickle.dumps(pickles),
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert int(proc.stdout) == counts["compiled"]
    counts["seconds"] = round(time.perf_counter() - start, 1)
    print("conformance kernels without a GPU:", counts)
    assert not lost, f"{len(lost)} kernels numba compiles and daskgpu does not:\n" + "\n".join(lost)
    # Rebuilding from source is the check's own limit; it must stay the exception.
    assert counts["compiled"] >= 0.9 * (counts["recorded"] - counts["numba_cannot"]), counts
