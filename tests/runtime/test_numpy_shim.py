"""numba-cuda 0.30 compiles under daskgpu on a NumPy without ``np.row_stack``.

NumPy 2.5 removed ``np.row_stack``; numba-cuda 0.30 registers an overload of it
when the CUDA target first loads its implementations, at the first compile.
Each case runs in a fresh process, as that happens once per process. Where
NumPy still has ``row_stack`` (2.4 and older), the process deletes it first,
from the namespace and ``__all__``, which is what NumPy 2.5 did to it; on
NumPy 2.5 there is nothing to delete.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = """
import inspect, json, sys
import numpy as np
if hasattr(np, "row_stack"):  # remove it as NumPy 2.5 did, from __all__ too
    del np.row_stack
    np.__all__.remove("row_stack")
{imports}

SIG = "void(float32[::1], float32, float32[::1], float32[::1])"

def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]

ptx, _ = cuda.compile_ptx(saxpy, SIG, cc=(7, 5))
result = {{"numba_ptx": ".entry" in ptx, "row_stack_after": hasattr(np, "row_stack")}}
if "daskgpu" in sys.modules:
    import dask
    import daskgpu as dg
    from daskgpu._runtime import numpy_shim
    kernel = dg.jit(SIG)(saxpy)
    x = np.arange(64, dtype=np.float32)
    out = np.zeros_like(x)
    with dask.config.set({{"daskgpu.simulate": True}}):
        kernel[2, 32](out, np.float32(2), x, x)
    arrayobj = sys.modules["numba.cuda.np.arrayobj"]
    result.update(
        daskgpu_ptx=all(".entry" in text for _, text in kernel.images[0].ptx),
        launched=bool((out == 3 * x).all()),
        finder_left=numpy_shim.RowStackFinder in {{type(f) for f in sys.meta_path}},
        source=bool(inspect.getsource(arrayobj.impl_np_vstack)),
    )
print(json.dumps(result))
"""


def _run(imports):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    code = PROGRAM.format(imports=textwrap.dedent(imports).strip())
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_numba_cuda_alone_fails_without_row_stack():
    # What the shim answers: without daskgpu, numba-cuda 0.30's first compile fails.
    proc = _run("from numba import cuda")
    assert proc.returncode != 0
    assert "has no attribute 'row_stack'" in proc.stderr


@pytest.mark.parametrize("imports", [
    "import daskgpu\nfrom numba import cuda",
    "from numba import cuda\nimport daskgpu",
], ids=["daskgpu-first", "numba-cuda-first"])
def test_kernels_compile_without_row_stack_in_either_import_order(imports):
    proc = _run(imports)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "numba_ptx": True,        # numba's own compile, in the same process
        "row_stack_after": False,  # NumPy is left as it was
        "daskgpu_ptx": True,       # dg.jit's compile
        "launched": True,          # and its kernel runs (simulated)
        "finder_left": False,      # the finder took itself off sys.meta_path
        "source": True,            # the module's source still reads through its loader
    }
