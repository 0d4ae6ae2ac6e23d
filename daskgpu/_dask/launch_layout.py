"""The launch layout: which chunks each launch covers, and when chunks may share one.

``map_kernel`` and ``daskgpu batch`` both size launches for the GPU rather than for the
storage: neighbouring chunks far smaller than a launch should be are merged (never
split) into groups, launched once each. This module is the one home of that rule:

- :func:`group_target` validates what a user gives as a group size (``group=``,
  ``--group``, ``daskgpu.launch-bytes``: one check, one message);
- :func:`launch_bytes` turns it into the bytes a group should need on the device;
- :func:`group_chunks` merges chunks into groups of about that size, leaving enough
  groups for every GPU thread of the cluster;
- :func:`grouping_hazards` says, from the kernel image's record of how it uses its
  thread's position (:mod:`daskgpu._image.position_uses`), why grouping could change
  what the kernel computes: a kernel sees a group as one chunk, so its thread index, its
  arrays' extents and ``dg.offset`` all start at the group's start.

By default chunks are grouped only where :func:`grouping_hazards` finds nothing;
``group=True`` (or a size) groups any kernel.
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import NamedTuple

__all__ = ["Hazard", "check_group", "group_chunks", "group_target", "grouping_hazards",
           "launch_bytes"]


def check_group(group, what: str = "group"):
    """``group`` as ``map_kernel``, ``run_batch`` and ``--group`` take it, checked: None or
    True (the ``daskgpu.launch-bytes`` setting), False (no grouping), or a size (bytes, a
    NumPy integer, or a string such as ``"64 MiB"``). Returns it as given.

    Raises
    ------
    ValueError
        Naming ``what`` (the keyword or option), the value and what to give instead.

    Examples
    --------
    >>> import numpy as np
    >>> check_group(np.int64(8192)), check_group(False), check_group("64 MiB")
    (8192, False, '64 MiB')
    >>> check_group("lots")
    Traceback (most recent call last):
    ...
    ValueError: group='lots': it must be a size from 0 to 1125899906842624 bytes (1 PiB), \
such as "8GiB" or "512 MB"; give True or None (the daskgpu.launch-bytes setting), False \
(no grouping) or a size, e.g. "64 MiB"
    """
    from daskgpu import _config

    if group is None or isinstance(group, bool):
        return group
    if isinstance(group, Integral):
        group = int(group)  # np.int64(8192) as 8192
    try:
        _config.SETTINGS["launch-bytes"](group)
    except ValueError as exc:
        raise ValueError(
            f"{what}={group!r}: {exc}; give True or None (the daskgpu.launch-bytes setting), "
            'False (no grouping) or a size, e.g. "64 MiB"') from None
    return group


def group_target(group) -> int | None:
    """The group size ``group`` asks for, in bytes: None for the setting (``group`` None
    or True), 0 for none (False).

    Examples
    --------
    >>> group_target("1 KiB"), group_target(False), group_target(None)
    (1024, 0, None)
    """
    from daskgpu import _config

    group = check_group(group)
    if group is None or group is True:
        return None
    if group is False:
        return 0
    return _config.SETTINGS["launch-bytes"](group)


def least_groups(group, spread: int) -> int:
    """How many groups a layout leaves at least, where the chunks allow: ``spread`` (a
    group per GPU thread, say) for the default size (``group`` None or True); 1 for a
    size the caller named, which is taken as asked.

    Examples
    --------
    >>> least_groups(None, 4), least_groups("1 MiB", 4)
    (4, 1)
    """
    return max(1, spread) if group_target(group) is None else 1


def launch_bytes(group, cluster, default: int | None = None) -> int:
    """The device memory a grouped launch should cover: ``group`` (see
    :func:`check_group`), at most a quarter of the GPU memory a worker offers, so that
    grouped launches still share a GPU. ``default`` is the size that ``group`` None or
    True stands for (None: the ``daskgpu.launch-bytes`` setting).

    Examples
    --------
    >>> from daskgpu._dask.cluster_facts import ClusterFacts
    >>> launch_bytes("8 MiB", ClusterFacts()), launch_bytes(False, ClusterFacts())
    (8388608, 0)
    >>> launch_bytes(None, ClusterFacts(gpu_memory=2**24)) == 2**22
    True
    >>> launch_bytes(True, ClusterFacts(), default=2**30) == 2**30
    True
    """
    from daskgpu import _config

    target = group_target(group)
    if target is None:
        target = _config.get("launch-bytes") if default is None else default
    if cluster.gpu_memory:
        target = min(target, cluster.gpu_memory // 4)
    return int(target)


def group_chunks(chunks: tuple, per_element: int, target: int, *, fixed: int = 0,
                 min_groups: int = 1) -> tuple | None:
    """Neighbouring chunks merged (never split) into groups that need about ``target``
    bytes each on the device; None where grouping is off (``target`` 0), the chunks are
    not far smaller than that (the largest needs more than a quarter of it), or nothing
    would merge.

    ``per_element`` is what a launch puts on the device per element of its block (its
    chunks, aligned outputs, random states); ``fixed`` what it puts there whatever its
    size (arrays passed whole, per-chunk outputs). Groups are made small enough that
    there are at least ``min_groups`` of them where the chunks allow it (every GPU
    thread of the cluster gets launches). Groups grow along the last axis first (a
    C-ordered block stays contiguous), then along earlier ones.

    Examples
    --------
    >>> group_chunks(((256,) * 8,), per_element=8, target=8192)
    ((1024, 1024),)
    >>> group_chunks(((2,) * 4, (3, 3)), per_element=8, target=192)
    ((4, 4), (6,))
    >>> group_chunks(((256,) * 8,), per_element=8, target=8192, min_groups=4)
    ((512, 512, 512, 512),)
    >>> group_chunks(((256,) * 8,), per_element=8, target=8192, fixed=8000) is None
    True
    >>> group_chunks(((1000,),), per_element=8, target=8192) is None  # far enough
    True
    """
    target -= fixed
    if target <= 0 or per_element <= 0 or not chunks or any(not c for c in chunks):
        return None
    largest = math.prod(max(c) for c in chunks) * per_element
    if largest * 4 > target:
        return None
    total = math.prod(sum(c) for c in chunks)
    want = max(1, target // per_element)  # elements a group should hold
    want = min(want, max(1, total // max(1, min_groups)))
    grouped, inner = list(chunks), 1
    for ax in reversed(range(len(chunks))):
        length = max(1, -(-want // inner))  # elements along this axis a group should span
        runs, run = [], 0
        for c in chunks[ax]:
            if run and run + c > length:
                runs.append(run)
                run = 0
            run += c
        runs.append(run)
        grouped[ax] = tuple(runs)
        if len(runs) > 1:  # this axis holds the groups' size: earlier axes stay as they are
            break
        inner *= runs[0]
    grouped = tuple(grouped)
    return None if grouped == tuple(map(tuple, chunks)) else grouped


# -- whether grouping can change a result --------------------------------------------

class Hazard(NamedTuple):
    """One reason grouping could change what a kernel computes: what it does, where, and
    that line's code where its source is at hand."""

    what: str
    where: str = ""
    code: str = ""

    def __str__(self) -> str:
        at = f" at {self.where}" if self.where else ""
        code = f" ({self.code})" if self.code else ""
        return f"{self.what}{at}{code}"


def _source_line(where: str) -> str:
    """The line ``file:line`` names, stripped; empty where the file is not at hand."""
    import linecache

    path, _, line = where.rpartition(":")
    return linecache.getline(path, int(line)).strip() if line.isdigit() else ""


#: The role of each kernel parameter in a map, as :func:`grouping_hazards` reads it:
#: "mapped" (a chunk of the map, aligned with the launch: dask arrays, aligned outputs,
#: random states), ("offset", axis) (``dg.offset``), "value" (a number), "whole" (an
#: array passed whole, or a per-chunk output).
MAPPED = "mapped"


def grouping_hazards(positions, roles, *, rank: int, halo=(), padded=(),
                     names=None) -> tuple:
    """Why grouping chunks could change what a kernel computes: a tuple of
    :class:`Hazard`, empty where its results do not depend on where a launch begins or
    ends.

    ``positions`` is the image's record of its position uses (None: not recorded, which
    is a hazard of its own), ``roles`` one role per kernel parameter (see
    :data:`MAPPED`), ``rank`` the launch rank, ``halo`` the halo depth per axis
    (``map_kernel``'s ``depth``) and ``padded`` whether the array's own edges are padded
    too on each axis (a boundary other than ``"none"``). ``names`` names the parameters
    in messages.

    Examples
    --------
    >>> uses = (("at", 0, 1, 0, 0, 0, "k.py:4"), ("fixed", 1, "k.py:4"))
    >>> grouping_hazards(uses, ("mapped", "mapped"), rank=1, names=("out", "x"))
    (Hazard(what="reads x, a chunk, elsewhere than at the thread's position", \
where='k.py:4', code=''),)
    >>> grouping_hazards(uses, ("mapped", "whole"), rank=1)
    ()
    """
    if positions is None:
        return (Hazard("its image does not record how it uses its thread's position (a "
                       "bundle saved by an older daskgpu: save it again)"),)
    halo = tuple(halo) or (0,) * rank
    padded = tuple(padded) or (False,) * rank

    def name(p):
        return repr(names[p]).strip("'") if names and p < len(names) else f"argument {p}"

    def depth(axis):
        return halo[axis] if axis < len(halo) else 0

    found = []
    reach: dict = {}  # axis -> (reads before, reads after, guarded before, guarded after)
    for use in positions:
        kind, fields, where = use[0], use[1:-1], use[-1]
        what = _judge(kind, fields, roles, rank, depth, name, reach)
        if what:
            found.append(Hazard(what, where, _source_line(where)))
    for axis, (before, after, guard_before, guard_after) in sorted(reach.items()):
        # At an edge of the array that is not padded, a read beyond the launch wraps
        # around (a negative index) or runs off it, unless a guard keeps it inside.
        if axis < len(padded) and not padded[axis] and (
                before > guard_before or after > guard_after):
            found.append(Hazard(f"reads up to {max(before, after)} elements beyond its "
                                f"launch along axis {axis} at the array's unpadded edge "
                                "(boundary 'none') without a bound check that keeps "
                                "them inside"))
    return tuple(dict.fromkeys(found))


def _judge(kind, fields, roles, rank, depth, name, reach) -> str | None:
    """The hazard of one position use, or None where the roles make it harmless."""
    def role(p):
        return roles[p] if p < len(roles) else None

    if kind == "never":
        return fields[0]
    if kind == "at":
        p, nidx, k, axis, c = fields
        if role(p) != MAPPED:
            return (f"indexes {name(p)} at the thread's position, but {name(p)} is not one "
                    "of the mapped chunks (pass its global index: dg.offset plus the "
                    "position)")
        if axis != k + rank - nidx:
            return f"indexes axis {k} of {name(p)} with the position along axis {axis}"
        if abs(c) > depth(axis):
            return (f"reads {name(p)} {abs(c)} element(s) from the thread's position along "
                    f"axis {axis}, beyond a halo of {depth(axis)} (map with depth=)")
        b, a, gb, ga = reach.get(axis, (0, 0, 0, 0))
        reach[axis] = (max(b, -c), max(a, c), gb, ga)
        return None
    if kind in ("fixed", "whole", "size"):
        p = fields[0]
        if role(p) != MAPPED:
            return None
        return {"fixed": f"reads {name(p)}, a chunk, elsewhere than at the thread's position",
                "whole": f"uses the chunk {name(p)} whole (a slice, a loop, a call)",
                "size": f"uses the extent of the chunk {name(p)} as a value"}[kind]
    if kind == "bound":
        p, axis, k = fields
        if role(p) != MAPPED:
            return (f"compares the thread's position with the extent of {name(p)}, which is "
                    "not one of the mapped chunks")
        if k > depth(axis):
            return (f"tells the last {k} element(s) of its chunk along axis {axis} from the "
                    f"others, beyond a halo of {depth(axis)}")
        b, a, gb, ga = reach.get(axis, (0, 0, 0, 0))
        reach[axis] = (b, a, gb, max(ga, k))
        return None
    if kind == "first":
        axis, k = fields
        if k > depth(axis):
            return (f"tells the first {k} element(s) of its chunk along axis {axis} from the "
                    f"others, beyond a halo of {depth(axis)}")
        b, a, gb, ga = reach.get(axis, (0, 0, 0, 0))
        reach[axis] = (b, a, max(gb, k), ga)
        return None
    if kind == "plus":
        p, axis = fields
        if role(p) != ("offset", axis):
            return (f"adds {name(p)} to the thread's position along axis {axis} (only "
                    "dg.offset for that axis gives a global coordinate)")
        return None
    if kind == "value":
        p = fields[0]
        if isinstance(role(p), tuple):
            return (f"uses dg.offset ({name(p)}) as a value: the start of its launch, not of "
                    "an element")
        return None
    return f"does something this daskgpu cannot read ({kind!r})"
