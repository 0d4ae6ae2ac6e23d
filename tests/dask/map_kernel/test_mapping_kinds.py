"""Each kind of map_kernel argument is one class that classifies, gives examples and plans."""

from __future__ import annotations

from fractions import Fraction

import dask.array as da
import numpy as np
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._dask.map_kernel import arg_kinds
from daskgpu._dask.map_kernel.arg_kinds import (
    KINDS,
    ArrayKind,
    Kind,
    OffsetKind,
    OutKind,
    PerChunkKind,
    Planned,
    StatesKind,
    Step,
    ValueKind,
    WholeKind,
    classify,
)
from daskgpu._dask.map_kernel.chunk_params import ValueParam


@dg.jit
def scale(out, x, a):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i]


def test_classify_gives_every_argument_its_kind():
    x = da.ones((4, 4), chunks=2)
    args = (dg.Out(np.float32, like=x), x, dg.Out(np.int64, per_chunk=3), dg.offset,
            dg.random_states(1), np.zeros(3), 2.0)
    roles, arrays = classify(args)
    assert [type(r) for r in roles] == [OutKind, ArrayKind, PerChunkKind, OffsetKind,
                                        StatesKind, WholeKind, ValueKind]
    assert arrays == [args[0], args[1]]
    assert [r.index for r in roles] == [0, 1, None, None, None, None, None]
    # One example per kernel parameter: dg.offset stands for one int64 per axis.
    examples = [v for r in roles for v in r.examples(2, flat=False)]
    assert len(examples) == sum(r.width(2) for r in roles) == 8
    assert examples[3:5] == [np.int64(0), np.int64(0)]


def test_a_kind_without_examples_is_refused_when_it_is_defined():
    # Before, a kind that launch_plan could not give an example for failed only at
    # dispatch, as "No matching definition".
    with pytest.raises(TypeError, match=r"kind Incomplete must define examples, plan"):
        class Incomplete(Kind):
            @staticmethod
            def claims(arg):
                return False


def test_every_kind_defines_what_the_client_asks_of_it():
    for kind in KINDS:
        for method in ("claims", "examples", "plan"):
            assert getattr(kind, method) is not getattr(Kind, method), (kind, method)


def test_a_new_kind_is_one_class(simulate, monkeypatch):
    class FractionKind(Kind):
        """A Fraction, passed as float64."""

        __slots__ = ()
        label = "a fraction"

        @staticmethod
        def claims(arg):
            return isinstance(arg, Fraction)

        def examples(self, ndim, flat):
            return (np.float64(self.value),)

        def plan(self, specs, index, planning):
            return Step((Planned(ValueParam(), np.float64(self.value)),))

    monkeypatch.setattr(arg_kinds, "KINDS", (FractionKind,) + KINDS)
    x = da.arange(6, chunks=3, dtype=np.float64)
    z = dg.map_kernel(scale, dg.Out(np.float64, like=x), x, Fraction(1, 2))
    np.testing.assert_array_equal(z.compute(), np.arange(6) / 2)
