"""Run the conformance suite on a GPU machine: numba-cuda's tests, plain and through daskgpu.

    python3 tests/conformance/run.py OUTDIR [--shards N] [--modules listed|extra|all|m1,m2]

Runs each module list twice, in parallel shards: once as numba-cuda ships it, once
with ``--daskgpu-route`` (see ``daskgpu_conformance.py``). Writes per-shard JSON
outcomes to OUTDIR and prints, per module, the tests passing with numba-cuda, those
of them passing through daskgpu, those passing with no launch through daskgpu,
and each test lost with its reason (also in OUTDIR/summary.json). The modules
are issue #13's list by default; ``extra`` runs the other kernel-launching ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CUDAPY = (
    "test_array_args test_atomics test_blackscholes test_boolean test_casting test_complex "
    "test_complex_kernel test_constmem test_cuda_array_interface test_exception test_fastmath "
    "test_forall test_freevar test_idiv test_intrinsics test_laplace test_localmem test_mandel "
    "test_math test_matmul test_minmax test_montecarlo test_powi test_random test_record_dtype "
    "test_reduction test_slicing test_sm test_sync test_transpose test_userexc test_vector_type "
    "test_warp_ops test_alignment test_array test_debug test_cooperative_groups"
).split()
DOC_EXAMPLES = ("test_vecadd test_matmul test_montecarlo test_random test_reduction "
                "test_laplace test_cg test_ufunc test_globals").split()
MODULES = ([f"numba.cuda.tests.cudapy.{m}" for m in CUDAPY]
           + [f"numba.cuda.tests.doc_examples.{m}" for m in DOC_EXAMPLES])

# Beyond issue #13's list: the other modules whose tests launch kernels (not the
# ones about numba's own machinery: ufunc builders, IPC, multiprocessing, caching
# of numba's dispatchers).
EXTRA_CUDAPY = (
    "test_array_alignment test_array_methods test_array_reductions test_bfloat16 "
    "test_bfloat16_bindings test_cache_hints test_const_string test_cuda_jit_no_types "
    "test_datetime test_device_func test_enums test_extending test_extending_types "
    "test_flow_control test_fp8_bindings test_frexp_ldexp test_globals test_inline "
    "test_inspect test_iterators test_lang test_libdevice test_lineinfo test_multithreads "
    "test_nondet test_operator test_optimization test_overload test_print test_py2_div_issue "
    "test_recursion test_retrieve_autoconverted_arrays test_serialize test_sm_creation "
    "test_ssa test_stream_api test_warning test_dispatcher test_compiler test_debuginfo"
).split()
EXTRA_DOC_EXAMPLES = "test_cpointer test_cpu_gpu_compat test_sessionize".split()
EXTRA = ([f"numba.cuda.tests.cudapy.{m}" for m in EXTRA_CUDAPY]
         + [f"numba.cuda.tests.doc_examples.{m}" for m in EXTRA_DOC_EXAMPLES])


def _shards(modules, n):
    # Round-robin keeps the slow modules (test_math, test_atomics) apart.
    return [modules[i::n] for i in range(n) if modules[i::n]]


def _command(mods, report, route, manifest=None):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "daskgpu_conformance",
           "--import-mode=importlib", "-o", "addopts=", "-p", "no:cacheprovider",
           "--continue-on-collection-errors",
           "--daskgpu-report", report]
    if route:
        cmd.append("--daskgpu-route")
        if manifest:
            cmd += ["--daskgpu-manifest", manifest]
    return cmd + ["--pyargs", *mods]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--modules", default="")
    parser.add_argument("--timeout", type=float, default=480)
    args = parser.parse_args(argv)
    named = {"listed": MODULES, "extra": EXTRA, "all": MODULES + EXTRA}
    modules = named.get(args.modules) or [
        m if "." in m else next(x for x in MODULES + EXTRA if x.endswith("." + m))
        for m in args.modules.split(",") if m] or MODULES
    os.makedirs(args.outdir, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    procs = []
    start = time.time()
    for route in (False, True):
        for i, mods in enumerate(_shards(modules, args.shards)):
            tag = f"{'daskgpu' if route else 'numba'}-{i}"
            report = os.path.join(args.outdir, tag + ".json")
            manifest = os.path.join(args.outdir, f"manifest-{i}.pkl") if route else None
            log = open(os.path.join(args.outdir, tag + ".log"), "w")
            procs.append((tag, subprocess.Popen(_command(mods, report, route, manifest),
                                                stdout=log, stderr=subprocess.STDOUT,
                                                env=env, cwd=args.outdir)))
    for tag, p in procs:
        try:
            p.wait(timeout=max(1, args.timeout - (time.time() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            print(f"shard {tag} timed out", flush=True)
    print(f"ran in {time.time() - start:.0f} s", flush=True)
    summary = summarize(args.outdir, modules)
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print_summary(summary)
    kernels = merge_manifests(args.outdir)
    print(f"recorded {kernels} distinct kernel compiles in {args.outdir}/kernels.pkl.gz "
          "(tests/conformance/ keeps a copy for the no-GPU CI check)", flush=True)


def merge_manifests(outdir) -> int:
    """The shards' kernel records in one file, each once, in a stable order."""
    import gzip
    import pickle

    records = set()
    for name in sorted(os.listdir(outdir)):
        if name.startswith("manifest-") and name.endswith(".pkl"):
            with open(os.path.join(outdir, name), "rb") as f:
                records.update(r for r in pickle.load(f) if r is not None)
    with gzip.GzipFile(os.path.join(outdir, "kernels.pkl.gz"), "wb", mtime=0) as f:
        pickle.dump(sorted(records), f, protocol=4)
    return len(records)


def _load(outdir, prefix):
    merged = {}
    for name in sorted(os.listdir(outdir)):
        if name.startswith(prefix) and name.endswith(".json"):
            with open(os.path.join(outdir, name)) as f:
                merged.update(json.load(f))
    return merged


def _module_of(nodeid, modules):
    return nodeid.split("::")[0]


def summarize(outdir, modules):
    plain, routed = _load(outdir, "numba-"), _load(outdir, "daskgpu-")
    per = {}
    for nodeid, entry in plain.items():
        mod = _module_of(nodeid, modules)
        row = per.setdefault(mod, {"numba_passed": 0, "daskgpu_passed": 0, "no_launch": 0,
                                   "lost": {}, "daskgpu_only": 0})
        if entry["outcome"] != "passed":
            continue
        row["numba_passed"] += 1
        got = routed.get(nodeid)
        if got is None:
            row["lost"][nodeid] = "not run through daskgpu (shard crashed or timed out)"
        elif got["outcome"] == "passed":
            row["daskgpu_passed"] += 1
            if not got.get("launches"):
                row["no_launch"] += 1
        else:
            row["lost"][nodeid] = f"{got['outcome']}: {got['reason']}"
    total = {k: sum(r[k] for r in per.values()) for k in ("numba_passed", "daskgpu_passed", "no_launch")}
    # A module with no outcome at all failed to import (see its shard's log).
    seen = {m.removeprefix("numba.") for m in per}  # node ids drop the "numba." of --pyargs
    missing = [m for m in modules if m.removeprefix("numba.") not in seen]
    return {"modules": per, "total": total, "not_collected": missing}


def print_summary(summary):
    print(f"{'module':60s} {'numba':>6s} {'daskgpu':>8s} {'no-launch':>9s}")
    for mod, row in sorted(summary["modules"].items()):
        print(f"{mod:60s} {row['numba_passed']:6d} {row['daskgpu_passed']:8d} {row['no_launch']:9d}")
    t = summary["total"]
    pct = 100 * t["daskgpu_passed"] / max(1, t["numba_passed"])
    print(f"{'TOTAL':60s} {t['numba_passed']:6d} {t['daskgpu_passed']:8d} {t['no_launch']:9d}  ({pct:.1f}%)")
    for _mod, row in sorted(summary["modules"].items()):
        for nodeid, reason in sorted(row["lost"].items()):
            print(f"LOST {nodeid}: {reason}")
    for mod in summary.get("not_collected", ()):
        print(f"NOT COLLECTED {mod}: no outcome from numba-cuda's run (an import error?)")


if __name__ == "__main__":
    main()
