"""What a user passes as a kernel is told in one place, by type, and one probe for Numba's."""

import ast
import pathlib

import numpy as np
import pytest
from kit.kernels import saxpy
from numba import cuda

import daskgpu
from daskgpu._runtime.kernel_kinds import KernelKind, kind_of

PACKAGE = pathlib.Path(daskgpu.__file__).parent


def plain(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i]


@pytest.mark.parametrize(("make", "kind"), [
    (lambda tmp: saxpy, KernelKind.KERNEL),
    (lambda tmp: saxpy.specialize(np.zeros(4, np.float32), np.float32(2),
                                  np.zeros(4, np.float32), np.zeros(4, np.float32)),
     KernelKind.KERNEL),
    (lambda tmp: daskgpu.load(tmp / "k.dgk"), KernelKind.PTX),
    (lambda tmp: saxpy.forall(4), KernelKind.LAUNCH),
    (lambda tmp: saxpy[1, 4], KernelKind.LAUNCH),
    (lambda tmp: cuda.jit(plain), KernelKind.DISPATCHER),
    (lambda tmp: plain, KernelKind.FUNCTION),
    (lambda tmp: str(tmp / "k.dgk"), KernelKind.BUNDLE),
    (lambda tmp: tmp / "k.dgk", KernelKind.BUNDLE),
    (lambda tmp: len, KernelKind.OTHER),
    (lambda tmp: 42, KernelKind.OTHER),
], ids=["jit", "specialized", "loaded", "forall", "configured", "dispatcher", "function",
        "path", "pathlike", "builtin", "int"])
def test_each_kind_a_user_passes_is_told_by_its_type(make, kind, tmp_path):
    daskgpu.save(saxpy, tmp_path / "k.dgk")
    assert kind_of(make(tmp_path)) is kind


#: Attributes that told a kernel's kind by probing, before the one door.
_KIND_ATTRIBUTES = {"py_func", "ptx_kernel", "select_image", "targetoptions"}

#: Where such a probe still stands, and why: the door itself; dg.kernel reading the
#: dispatcher it wraps; the simulator telling Numba's CPU dispatchers among globals.
_PROBES_ALLOWED = {"_runtime/kernel_kinds.py", "_compiler/kernel.py", "_runtime/simulator.py"}


def _probes(tree) -> list:
    """Each ``hasattr(x, NAME)`` of a kind's attribute. (A ``getattr(kernel, "py_func",
    None)`` that reads a client kernel's function, where it has one, tells no kind.)"""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr" and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in _KIND_ATTRIBUTES):
            found.append(f"hasattr(..., {node.args[1].value!r}) at line {node.lineno}")
    return found


def test_no_entry_point_probes_attributes_to_tell_a_kernels_kind():
    wrong = {}
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        if where in _PROBES_ALLOWED or where.startswith("_cli/bench/"):
            continue
        found = _probes(ast.parse(path.read_text()))
        if found:
            wrong[where] = found
    assert wrong == {}, "ask daskgpu._runtime.kernel_kinds.kind_of instead"


def test_the_probe_check_sees_a_probe():
    tree = ast.parse("hasattr(k, 'ptx_kernel')\ngetattr(k, 'py_func', None)\n"
                     "hasattr(k, 'name')\n")
    assert _probes(tree) == ["hasattr(..., 'ptx_kernel') at line 1"]
