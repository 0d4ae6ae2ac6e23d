"""The position analysis (daskgpu._compiler.positions): what each use of the thread's
position is recorded as, and that the walk ends on loops that grow a value."""

import time

from numba import cuda
from numba.cuda import types
from numba.cuda.compiler import compile_cuda

from daskgpu._compiler.positions import position_uses
from daskgpu._compiler.target import compiling_for

F32 = types.float32[::1]


def _uses(fn, argtypes):
    with compiling_for((7, 5)):
        cres = compile_cuda(fn, None, argtypes, cc=(7, 5))
    return {use[:-1] for use in position_uses(cres.type_annotation, len(argtypes))}


def _kinds(uses):
    return {use[0] for use in uses}


def scale(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 2 * x[i]


def counter_indexes_a_table(out, x, table):
    # A loop counter (k += 1) grows a new constant each time round the walk.
    i = cuda.grid(1)
    if i < out.size:
        acc = x[i]
        k = 0
        while k < table.size:
            acc += table[k]
            k += 1
        out[i] = acc


def position_walks_in_a_loop(out, x):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = x[i]
        i += 1


def test_an_index_at_the_position_and_a_bound_check_are_all_a_plain_map_records():
    assert _uses(scale, (F32, F32)) == {("at", 0, 1, 0, 0, 0), ("at", 1, 1, 0, 0, 0),
                                       ("bound", 0, 0, 0)}


def test_a_loop_counter_widens_to_plain_data_and_the_walk_ends_quickly():
    started = time.perf_counter()
    uses = _uses(counter_indexes_a_table, (F32, F32, F32))
    assert time.perf_counter() - started < 30
    assert "never" not in _kinds(uses), uses
    assert ("at", 1, 1, 0, 0, 0) in uses and ("fixed", 2) in uses


def test_a_position_changed_in_a_loop_counts_against_grouping():
    uses = _uses(position_walks_in_a_loop, (F32, F32))
    assert "never" in _kinds(uses), uses


def test_the_random_states_kernel_compiles():
    # Its bit loop (k += 1, g >>= 1 inside two nested loops) once kept the walk from ending.
    from daskgpu._compiler.random_states import builder

    assert builder().images


def spins_below_a_huge_count(flag):
    i = cuda.grid(1)
    k = 0
    while i < 1 << 40 and flag[0] == 0:
        k += 1


def test_a_comparison_with_a_count_past_what_a_record_holds_is_kept_at_its_bound():
    from daskgpu._image.position_uses import COUNT_MAX, check_uses

    uses = _uses(spins_below_a_huge_count, (types.int64[::1],))
    assert ("first", 0, COUNT_MAX) in uses
    assert check_uses([u + ("k.py:1",) for u in uses], nargs=1)


def test_widening_keeps_structure_and_absorbs_what_it_stands_for():
    from daskgpu._compiler.position_kinds import MAX_KINDS, widened

    counters = frozenset({("const", k) for k in range(MAX_KINDS + 1)} | {("arr", 0)})
    assert widened(counters) == {("int",), ("arr", 0)}
    # Once widened, a kind absorbs the constants a loop adds next: the set only grows.
    assert widened(frozenset({("int",), ("const", 99)})) == {("int",)}
    positions = frozenset({("pos", 0, c) for c in range(MAX_KINDS + 1)})
    assert widened(positions) == {("top",)}
    assert widened(frozenset({("top",), ("pos", 0, 1), ("const", 1)})) == {("top",), ("const", 1)}


def _calling(call):
    """A device function that calls ``call`` twice in a loop."""
    @cuda.jit(device=True)
    def level(x, i):
        acc = 0.0
        k = 0
        while k < 2:
            acc += call(x, i)
            k += 1
        return acc
    return level


def _nested(levels):
    """A kernel calling ``levels`` nested device functions, each calling the next inside
    a loop, the innermost reading ``x`` at the position."""
    @cuda.jit(device=True)
    def read(x, i):
        return x[i]

    call = read
    for _ in range(levels):
        call = _calling(call)

    def kernel(out, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = call(x, i)
    return kernel


def test_nested_device_functions_are_walked_once_each_not_once_per_pass():
    # Each level's loop takes the walk several passes; walking a call again on every
    # pass of its caller multiplied them level by level.
    started = time.perf_counter()
    uses = _uses(_nested(8), (F32, F32))
    assert time.perf_counter() - started < 60
    assert ("at", 1, 1, 0, 0, 0) in uses and "never" not in _kinds(uses), uses
