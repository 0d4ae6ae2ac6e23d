"""The kernels and file helpers the batch tests share.

Each kernel exists twice: compiled here (``saxpy``, ``affine``) for ``run_batch``, and as
module source (``SAXPY_FILE``, ``AFFINE_FILE``) for ``daskgpu batch MODULE.py:FUNCTION``.
"""

import os

from numba import cuda

import daskgpu as dg

SAXPY_SIG = "void(float32[::1], float32, float32[::1], float32[::1])"
AFFINE_SIG = "void(float64[::1], float64, float64[::1])"

SAXPY_FILE = '''
from numba import cuda

def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]
'''

AFFINE_FILE = '''
from numba import cuda

def affine(out, a, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0
'''


@dg.jit(SAXPY_SIG)
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@dg.jit(AFFINE_SIG)
def affine(out, a, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0


def write_zarr(path, data, chunks) -> str:
    """``data`` stored as a zarr array at ``path`` in ``chunks``; the path."""
    import zarr

    z = zarr.open_array(str(path), mode="w", shape=data.shape, chunks=chunks, dtype=data.dtype)
    z[...] = data
    return str(path)


def tree(path) -> dict:
    """Every file under ``path`` with its bytes: to show that nothing changed."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
    return out


def affine_cli(tmp_path, inputs, output, *extra) -> int:
    """``daskgpu batch`` of :data:`AFFINE_FILE` (written into ``tmp_path``) with scalar 2.0
    over ``inputs`` into ``output``; the exit status."""
    from daskgpu._cli.batch import main

    kernel = tmp_path / "affine_kernel.py"
    kernel.write_text(AFFINE_FILE)
    argv = [f"{kernel}:affine", "--sig", AFFINE_SIG, "--scalar", "2.0", "--no-progress"]
    for p in inputs:
        argv += ["--input", str(p)]
    return main(argv + ["--output", str(output), *extra])
