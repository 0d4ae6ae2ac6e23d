"""The kernels many tests launch, defined once.

Import them by name (``from kit.kernels import saxpy``): tests/conftest.py puts
tests/ on ``sys.path``, and worker processes a test starts inherit it, so a
kernel's Python function, which simulated launches run, unpickles there too.

Each kernel's name (``saxpy``) is what launches report, errors name and
metrics label, whichever module launches it. The eager kernels compile once a
process, when this module is first imported; the lazy one compiles once per
argument types and keeps what it compiled for the tests after.

A kernel a command runs from a file of its own exists here as source too
(``SAXPY_FILE``), for ``daskgpu batch MODULE.py:FUNCTION`` and worker scripts.
"""

from numba import cuda

import daskgpu as dg

SAXPY_SIG = "void(float32[::1], float32, float32[::1], float32[::1])"
AFFINE_SIG = "void(float64[::1], float64, float64[::1])"
SCALE_SIG = "void(float32[::1], float32, float32[::1])"
SCALE64_SIG = "void(float64[::1], float64, float64[::1])"
DOUBLE_SIG = "void(float32[::1], float32[::1])"

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
    """``out = a * x + y`` in float32, compiled when this module is imported."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


#: The same function compiled lazily, for the argument types of each first launch.
saxpy_lazy = dg.jit(saxpy.py_func)


@dg.jit(SCALE_SIG)
def scale(out, a, x):
    """``out = a * x`` in float32."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i]


#: The same function in float64.
scale64 = dg.jit(SCALE64_SIG)(scale.py_func)

#: The same function compiled lazily, for the argument types of each first launch. A
#: test that counts what a lazy kernel compiled makes its own: ``dg.jit(scale.py_func)``.
scale_lazy = dg.jit(scale.py_func)


@dg.jit(DOUBLE_SIG)
def double(out, x):
    """``out = 2 * x`` in float32."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i]


@dg.jit(AFFINE_SIG)
def affine(out, a, x):
    """``out = a * x + 1`` in float64."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0


@dg.jit
def sum_diff(s, d, x, y):
    """``s = x + y`` and ``d = x - y`` over 2-D arrays: two outputs, compiled lazily."""
    i, j = cuda.grid(2)
    if i < s.shape[0] and j < s.shape[1]:
        s[i, j] = x[i, j] + y[i, j]
        d[i, j] = x[i, j] - y[i, j]


@dg.jit
def smooth(out, x):
    """``out[i] = x[i - 1] + x[i] + x[i + 1]`` inside the chunk, compiled lazily: with a
    halo (``depth=1``), a three-point stencil over the whole array."""
    i = cuda.grid(1)
    if 0 < i < x.size - 1:
        out[i] = x[i - 1] + x[i] + x[i + 1]


# -- kernels whose results depend on where their launch begins or ends -------------
# map_kernel launches them once per chunk by default: grouping chunks would change them.

@dg.jit
def chunk_index(out):
    """``out[i] = i``: each element's index within its chunk (a tile-local index)."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


@dg.jit
def minus_first(out, x):
    """``out[i] = x[i] - x[0]``: each element against its chunk's first one."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] - x[0]


@dg.jit
def chunk_cumsum(out, x):
    """A scan within each chunk: ``out[i] = x[0] + ... + x[i]`` of the chunk."""
    i = cuda.grid(1)
    if i < out.size:
        total = 0.0
        for k in range(i + 1):
            total += x[k]
        out[i] = total
