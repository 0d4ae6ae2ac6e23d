"""The write set and grid rank that daskgpu reads from Numba's typed IR."""

import dask
import numpy as np
import pytest
from numba import cuda
from numba.cuda import extending

import daskgpu as dg

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")

F1 = "float32[::1]"
F2 = "float32[:, ::1]"


def analysed(sig):
    """Compile the decorated function for ``sig``; return its image."""
    def wrap(fn):
        return dg.jit(sig)(fn).images[0]
    return wrap


# -- device functions used below ----------------------------------------------------------


@cuda.jit(device=True)
def dev_store(a, i, v):
    a[i] = v


@cuda.jit(device=True)
def dev_load(a, i):
    return a[i]


@cuda.jit(device=True)
def dev_store_through_view(a, v):
    tail = a[1:]
    tail[0] = v


@cuda.jit(device=True)
def dev_forward(a, b, v):
    # Writes its second parameter only, through another device function.
    dev_store(b, 0, dev_load(a, 0) + v)


def peek(a):
    pass


@extending.overload(peek, target="cuda")
def _peek_impl(a):
    def impl(a):
        return a[0]
    return impl


# -- stores ----------------------------------------------------------------------------------


@analysed(f"void({F1}, {F1})")
def plain_store(a, b):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = b[i]


@analysed(f"void({F1}, {F1})")
def inplace_store(a, b):
    a[0] += b[0]


@analysed(f"void({F2}, {F2})")
def tuple_index_store(a, b):
    i, j = cuda.grid(2)
    a[i, j] = b[j, i]


def test_plain_stores():
    assert plain_store.writes == (0,)
    assert inplace_store.writes == (0,)
    assert tuple_index_store.writes == (0,)


# -- atomics -----------------------------------------------------------------------------------


@analysed(f"void({F1}, {F1})")
def atomic_add(a, b):
    cuda.atomic.add(a, 0, b[0])


@analysed(f"void({F1}, {F1})")
def atomic_max(a, b):
    cuda.atomic.max(a, 0, b[0])


@analysed("void(int32[::1], int32[::1])")
def atomic_cas(a, b):
    cuda.atomic.compare_and_swap(a, 0, b[0])


@analysed("void(int32[::1], int32[::1], int32[::1])")
def atomic_into_second(a, b, c):
    old = cuda.atomic.add(b, 0, a[0])
    c[0] = old


def test_atomics_write_their_array_only():
    assert atomic_add.writes == (0,)
    assert atomic_max.writes == (0,)
    assert atomic_cas.writes == (0,)
    assert atomic_into_second.writes == (1, 2)


# -- cache hints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("store", [cuda.stcg, cuda.stcs, cuda.stwb, cuda.stwt])
@pytest.mark.parametrize("load", [cuda.ldcg, cuda.ldca])
def test_cache_hinted_stores_write_their_array_and_loads_read_theirs(store, load):
    def hinted_copy(r, x):
        for i in range(len(r)):
            store(r, i, load(x, i))

    assert analysed(f"void({F1}, {F1})")(hinted_copy).writes == (0,)


# -- views ---------------------------------------------------------------------------------------


@analysed(f"void({F1}, {F1})")
def slice_view(a, b):
    v = a[1:]
    v[0] = b[0]


@analysed(f"void({F1}, {F1})")
def slice_of_slice(a, b):
    v = a[1:]
    w = v[::2]
    w[0] = b[0]


@analysed("void(float32[:, :], float32[:, :])")
def transposed(a, b):
    t = a.T
    t[0, 1] = b[0, 0]


@analysed(f"void({F2}, {F2})")
def row_view(a, b):
    i = cuda.grid(1)
    if i < a.shape[0]:
        row = a[i]
        row[0] = b[i, 0]


@analysed(f"void({F1}, {F1})")
def reshaped(a, b):
    v = a.reshape((2, 2))
    v[0, 1] = b[0]


@analysed(f"void({F1}, {F1}, {F1})")
def view_chosen_in_a_branch(a, b, c):
    v = b
    if c[0] > 0:
        v = a
    v[0] = c[0]


@analysed(f"void({F1}, {F1})")
def view_carried_through_a_loop(a, b):
    v = b[:1]
    for k in range(3):
        if k == 2:
            v[0] = 1.0
        v = a[k:]


def test_stores_through_views():
    assert slice_view.writes == (0,)
    assert slice_of_slice.writes == (0,)
    assert transposed.writes == (0,)
    assert row_view.writes == (0,)
    assert reshaped.writes == (0,)
    # May-write: either array may be the view.
    assert view_chosen_in_a_branch.writes == (0, 1)
    assert view_carried_through_a_loop.writes == (0, 1)


def test_reading_a_view_is_not_a_write():
    @analysed(f"void({F1}, {F1})")
    def read_view(a, b):
        v = b[1:]
        a[0] = v[0] + b.T[0]

    assert read_view.writes == (0,)


# -- device functions ------------------------------------------------------------------------------


@analysed(f"void({F1}, {F1})")
def writes_in_device_function(a, b):
    i = cuda.grid(1)
    dev_store(a, i, dev_load(b, i))


@analysed(f"void({F1}, {F1})")
def reads_in_device_function(a, b):
    x = dev_load(a, 0) + dev_load(b, 0)  # noqa: F841 (a read, kept for the IR)


@analysed(f"void({F1}, {F1})")
def view_into_device_function(a, b):
    dev_store_through_view(b[2:], a[0])


@analysed(f"void({F1}, {F1}, {F1})")
def nested_device_functions(a, b, c):
    dev_forward(a, c, b[0])


def test_writes_inside_device_functions():
    assert writes_in_device_function.writes == (0,)
    assert reads_in_device_function.writes == ()
    assert view_into_device_function.writes == (1,)
    assert nested_device_functions.writes == (2,)


def test_unknown_calls_count_as_writes():
    @analysed(f"void({F1}, {F1})")
    def calls_an_overload(a, b):
        b[0] = peek(a)

    # peek only reads, but the analysis cannot see into an overload: conservative.
    assert calls_an_overload.writes == (0, 1)

    @analysed(f"void({F1}, {F1})")
    def keyword_call(a, b):
        b[0] = dev_load(a, i=0)

    # With keywords the parameter mapping is not followed: conservative too.
    assert keyword_call.writes == (0, 1)


def test_read_only_builtins_are_not_writes():
    @analysed(f"void({F1}, {F2}, {F1})")
    def reads(a, b, out):
        n = len(a) + a.size + b.shape[1] + min(a[0], b[0, 0])
        cuda.syncthreads()
        out[0] = n

    assert reads.writes == (2,)


# -- read-only kernels and several outputs -----------------------------------------------------------


@analysed(f"void({F1}, float32)")
def read_only(a, v):
    x = a[0] * v  # noqa: F841 (a read, kept for the IR)


@analysed(f"void({F1}, {F1}, {F1}, {F1})")
def several(a, b, c, d):
    i = cuda.grid(1)
    if i < a.size:
        d[i] = a[i]
        b[i] = a[i] * 2


def test_read_only_kernel_has_no_writes_and_returns_none():
    assert read_only.writes == ()
    k = dg.jit(f"void({F1}, float32)")(read_only_py)
    x = np.arange(4, dtype=np.float32)
    with dask.config.set({"daskgpu.simulate": True}):
        assert k[1, 4](x, 2.0) is None
    np.testing.assert_array_equal(x, np.arange(4, dtype=np.float32))


def read_only_py(a, v):
    x = a[0] * v  # noqa: F841 (a read, kept for the IR)


def several_py(a, b, c, d):
    i = cuda.grid(1)
    if i < a.size:
        d[i] = a[i]
        b[i] = a[i] * 2


def test_several_written_arrays_come_back_in_argument_order():
    assert several.writes == (1, 3)
    k = dg.jit(f"void({F1}, {F1}, {F1}, {F1})")(several_py)
    a = np.arange(5, dtype=np.float32)
    b, c, d = (np.zeros(5, np.float32) for _ in range(3))
    with dask.config.set({"daskgpu.simulate": True}):
        result = k.forall(5)(a, b, c, d)
    assert isinstance(result, tuple) and len(result) == 2
    assert result[0] is b and result[1] is d
    np.testing.assert_array_equal(b, a * 2)
    np.testing.assert_array_equal(d, a)


def test_scalars_are_never_in_the_write_set():
    @analysed(f"void(float32, {F1})")
    def scalar_reassigned(v, a):
        v = v + 1
        a[0] = v

    assert scalar_reassigned.writes == (1,)


# -- grid rank ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, sig, ndim", [
    ("i = cuda.grid(1)\n    a[i, 0, 0] = 1", "float32[:, :, :]", 1),
    ("i, j = cuda.grid(2)\n    a[i, j, 0] = 1", "float32[:, :, :]", 2),
    ("i, j, k = cuda.grid(3)\n    a[i, j, k] = 1", "float32[:, :, :]", 3),
    ("x, y = cuda.gridsize(2)\n    a[0, 0, 0] = x + y", "float32[:, :, :]", 2),
    ("n = cuda.gridsize(1)\n    a[0, 0, 0] = n", "float32[:, :, :]", 1),
    ("i = cuda.grid(1)\n    x, y, z = cuda.gridsize(3)\n    a[i, 0, 0] = x", "float32[:, :, :]", 3),
    ("a[cuda.threadIdx.x, cuda.blockIdx.x, 0] = cuda.blockDim.x", "float32[:, :, :]", 0),
    ("a[0, 0, 0] = 1", "float32[:, :, :]", 0),
])
def test_grid_ndim(body, sig, ndim):
    ns = {"cuda": cuda}
    exec(f"def kern(a):\n    {body}", ns)
    image = dg.jit(f"void({sig})")(ns["kern"]).images[0]
    assert image.grid_ndim == ndim
    assert image.writes == (0,)


def test_grid_ndim_from_an_imported_grid_function():
    from numba.cuda import grid

    @analysed(f"void({F2})")
    def imported(a):
        i, j = grid(2)
        a[i, j] = 1

    assert imported.grid_ndim == 2


# -- writes through array methods ---------------------------------------------------------


def test_fill_counts_as_a_write_of_its_receiver():
    @analysed(f"void({F1}, {F1}, {F1}, {F1})")
    def fills(x, y, z, w):
        x.fill(1.0)
        y[1:].fill(2)  # through a slice
        z.reshape(z.size).fill(3)  # through a read-only method's view
        s = w.sum()  # noqa: F841 (a read)

    assert fills.writes == (0, 1, 2)


def test_compare_and_swap_writes_its_array():
    @analysed("void(int32[::1], int32[::1])")
    def cas(a, b):
        cuda.atomic.compare_and_swap(a, 0, 1)
        cuda.atomic.cas(b, 0, 0, 1)

    assert cas.writes == (0, 1)


def test_fill_written_array_comes_back_simulated():
    def fill(out, v):
        out.fill(v)

    k = dg.jit(f"void({F1}, float32)")(fill)
    with dask.config.set({"daskgpu.simulate": True}):
        out = k[1, 1](np.zeros(8, np.float32), 2.5)
    np.testing.assert_array_equal(out, np.full(8, 2.5, np.float32))
