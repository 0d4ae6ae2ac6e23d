"""Records and numba-cuda's random states on a GPU, through pickled PTX-only launches,
against numba-cuda's own kernels on the same data."""

import pickle

import numpy as np
import pytest
from numba import cuda
from numba.cuda.random import (
    create_xoroshiro128p_states,
    xoroshiro128p_normal_float64,
    xoroshiro128p_uniform_float32,
)

import daskgpu as dg

pytestmark = pytest.mark.gpu

ALIGNED = np.dtype([("a", np.int8), ("b", np.float64), ("c", np.complex64)], align=True)
# Packed, and still safe to index on the device: every field at its natural alignment.
PACKED = np.dtype([("b", np.float64), ("c", np.complex64), ("d", np.int32), ("a", np.int8),
                   ("e", np.int8), ("f", np.int16)])


def draw(states, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i, 0] = xoroshiro128p_uniform_float32(states, i)
        out[i, 1] = xoroshiro128p_normal_float64(states, i)


def test_random_states_from_numba_through_a_pickled_launch():
    n = 4096
    ours, theirs = create_xoroshiro128p_states(n, seed=7), create_xoroshiro128p_states(n, seed=7)
    got, want = np.zeros((n, 2)), np.zeros((n, 2))
    launch = pickle.loads(pickle.dumps(dg.jit(draw).specialize(ours, got).forall(n)))
    for _ in range(3):  # the states advance on the device, as in Numba
        states_back, out = launch(ours, got)
        cuda.jit(draw).forall(n)(theirs, want)
        assert states_back is ours
        np.testing.assert_array_equal(out, want)
    assert ours.copy_to_host().tobytes() == theirs.copy_to_host().tobytes()


def set_fields(recs, value):
    i = cuda.grid(1)
    if i < recs.size:
        recs[i].b = value.b + i
        recs[i].a = value.a
        recs[i].c = value.c * i
    if i == 0:
        value.a = 99  # a record by value is copied back (cuda.InOut), as Numba does


def fields(records):
    return [records[name].tobytes() for name in records.dtype.names]


@pytest.mark.parametrize("dtype", [ALIGNED, PACKED], ids=["aligned", "packed"])
@pytest.mark.parametrize("where", ["host", "device"])
def test_record_arrays_and_records_by_value_match_numba(dtype, where):
    n = 300
    value = np.zeros(2, dtype)
    value["a"], value["b"], value["c"] = 5, 0.25, 1 - 2j
    ours, theirs = np.zeros(n, dtype), np.zeros(n, dtype)
    ours["a"] = theirs["a"] = 1  # bytes the kernel does not write must survive
    if where == "device":
        ours, theirs = cuda.to_device(ours), cuda.to_device(theirs)
    ours_value, theirs_value = value.copy(), value.copy()
    launch = pickle.loads(pickle.dumps(dg.jit(set_fields).specialize(ours, value[0]).forall(n)))
    launch(ours, ours_value[0])
    cuda.jit(set_fields).forall(n)(theirs, theirs_value[0])
    host = (lambda a: a.copy_to_host()) if where == "device" else (lambda a: a)
    assert fields(host(ours)) == fields(host(theirs))
    assert fields(ours_value) == fields(theirs_value)  # padding bytes are anyone's
    assert ours_value["a"][0] == 99 and ours_value["a"][1] == 5


def add_one(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + 1
        x[i] = -1  # written, but an In array is never copied back


def test_cuda_in_out_inout_copy_as_numba_does():
    x = np.arange(1000, dtype=np.float64)
    out = np.full(1000, 7.0)
    k = pickle.loads(pickle.dumps(dg.jit("void(float64[::1], float64[::1])")(add_one)))
    k.forall(1000)(cuda.Out(out), cuda.In(x))
    np.testing.assert_array_equal(out, np.arange(1000) + 1)
    np.testing.assert_array_equal(x, np.arange(1000))  # In: not copied back
    k.forall(1000)(cuda.InOut(out), cuda.InOut(x))
    np.testing.assert_array_equal(x, -1)


def scale(out, x, s):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * s


def test_bfloat16_arrays_and_scalars_launch_with_the_gpus_rounding():
    # numba-cuda 0.30 cannot launch this at all: it refuses host bfloat16 arrays
    # (cuda.core's DLPack view: "only supports signed/unsigned integers, float and
    # complex dtypes") and bfloat16 scalars (NotImplementedError in _prepare_args).
    # The product of two bfloat16 values is exact in float32, so rounding it to
    # bfloat16 on the host gives the bits the GPU's bfloat16 multiply must give.
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = (np.arange(1000) / 7).astype(bf16)
    s = bf16.type(1.5)
    want = (x.astype(np.float32) * np.float32(s)).astype(bf16)
    shipped = pickle.loads(pickle.dumps(dg.jit(scale).specialize(want, x, s)))
    for _ in range(2):  # the first launch and the repeat
        got = shipped.forall(1000)(np.zeros(1000, bf16), x, s)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))

