"""The conformance harness itself, without a GPU: what a routed launch ships.

The suite proper (numba-cuda's tests, plain and through daskgpu) needs a GPU:
``python3 tests/conformance/run.py OUTDIR`` on the GPU machine.
"""

import os
import pickle
import sys

import numpy as np
from numba import cuda

sys.path.insert(0, os.path.dirname(__file__))
import daskgpu_conformance as harness  # noqa: E402

from daskgpu._runtime.ptx_kernel import PTXKernel  # noqa: E402


def axpy(out, a, x, t):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + t[0] + t[1]


def test_a_routed_kernel_ships_ptx_only_images_of_numbas_argument_types():
    routed = harness.RoutedKernel(cuda.jit(axpy))
    args = (np.zeros(8, np.float32), 2.0, np.ones(8, np.float32), (1, 2.5))
    shipped = routed._shipped_kernel(args)
    assert type(shipped) is PTXKernel
    (image,) = shipped.images
    assert image.py_func is None and image.ptx and image.writes == (0,)
    assert image.signature == "(float32[::1], float64, float32[::1], Tuple(int64, float64))"
    assert b"axpy" in pickle.dumps(shipped) and b"co_code" not in pickle.dumps(shipped)


def test_routing_applies_to_numba_cudas_test_modules_only():
    assert not harness._from_a_test_module(1)


def test_device_functions_stay_numbas():
    dev = cuda.jit(device=True)(lambda x: x + 1)
    assert harness._wrap(dev) is dev
    assert isinstance(harness._wrap(cuda.jit(axpy)), harness.RoutedKernel)


def test_summary_counts_passes_losses_and_launches(tmp_path):
    import json

    import run

    (tmp_path / "numba-0.json").write_text(json.dumps({
        "m::T::a": {"outcome": "passed", "reason": "", "launches": 0},
        "m::T::b": {"outcome": "passed", "reason": "", "launches": 0},
        "m::T::c": {"outcome": "failed", "reason": "x", "launches": 0}}))
    (tmp_path / "daskgpu-0.json").write_text(json.dumps({
        "m::T::a": {"outcome": "passed", "reason": "", "launches": 2},
        "m::T::b": {"outcome": "failed", "reason": "LinkError: y", "launches": 1}}))
    summary = run.summarize(str(tmp_path), ["m", "numba.broken"])
    assert summary["total"] == {"numba_passed": 2, "daskgpu_passed": 1, "no_launch": 0}
    assert summary["modules"]["m"]["lost"] == {"m::T::b": "failed: LinkError: y"}
    assert summary["not_collected"] == ["numba.broken"]  # no outcome: it did not import


def test_the_module_list_is_the_issues():
    import run

    assert len(run.MODULES) == len(set(run.MODULES)) == 37 + 9
    assert all(m.startswith(("numba.cuda.tests.cudapy.", "numba.cuda.tests.doc_examples."))
               for m in run.MODULES + run.EXTRA)
    assert not set(run.MODULES) & set(run.EXTRA)


def test_a_negative_forall_raises_numbas_value_error_when_made():
    import pytest

    with pytest.raises(ValueError, match="Can't create ForAll with negative task count"):
        harness.RoutedKernel(cuda.jit(axpy)).forall(-1)


def _plus(x, k):
    return x + k


def test_kernel_records_rebuild_from_source_and_compile_without_a_gpu():
    import kernel_refs

    import daskgpu as dg

    offset = 3
    dev = cuda.jit(device=True)(_plus)

    def local_kernel(out, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = dev(x[i], offset)

    from numba.cuda import types

    argtypes = (types.float32[::1], types.float32[::1])
    entry = pickle.loads(kernel_refs.record(local_kernel, argtypes, {"fastmath": True}))
    assert entry["function"]["freevars"].keys() == {"dev", "offset"}
    assert entry["options"] == {"fastmath": True}
    with kernel_refs.no_gpu_imports() as jit:
        fn = kernel_refs.Rebuilder(jit).function(entry["function"])
        assert fn is not local_kernel and fn.__code__.co_firstlineno == local_kernel.__code__.co_firstlineno
        k = dg.kernel(jit(fn, **entry["options"]), signatures=[entry["argtypes"]])
    (image,) = pickle.loads(pickle.dumps(k)).images
    assert image.writes == (0,) and image.py_func is None
    assert ("fastmath", True) in image.options


def test_a_closure_over_process_state_is_recorded_as_unencodable():
    import kernel_refs
    from numba.cuda import types

    lock = __import__("threading").Lock()

    def k(out):
        if lock:
            out[0] = 1

    entry = pickle.loads(kernel_refs.record(k, (types.int32[::1],), {}))
    assert entry["function"] is None and "closure value" in entry["why"]


def test_vector_type_classes_in_closures_are_recorded_by_name():
    import kernel_refs
    from numba.cuda.vector_types import vector_types

    vobj = vector_types["float32x2"].user_facing_object
    encoded = kernel_refs.encode_value(vobj)
    assert encoded == {"vector_type": "float32x2"}
    with kernel_refs.no_gpu_imports() as jit:
        assert kernel_refs.Rebuilder(jit).value(encoded) is vobj
