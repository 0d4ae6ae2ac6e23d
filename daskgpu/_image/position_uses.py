"""What a kernel image records of its uses of the thread's position, as plain data.

The client's compiler reads them off Numba's typed IR
(:func:`daskgpu._compiler.positions.position_uses`); the image carries them (in pickles
and bundles), so that a map can decide whether grouping chunks into one launch can
change what the kernel computes, also for a kernel loaded from a bundle with no Numba.
:func:`check_uses` is the one validation, for both.

A record is a tuple ``(kind, *fields, where)``:

================  ============================  ==========================================
kind              fields                        the kernel ...
================  ============================  ==========================================
``at``            param, nidx, k, axis, c       indexes ``param`` (``nidx`` indices) at
                                                index ``k`` with the position along
                                                ``axis`` plus ``c``
``fixed``         param                         indexes ``param`` elsewhere (``x[0]``)
``whole``         param                         uses ``param`` whole (slices, passes it on)
``size``          param                         uses ``param``'s extent as a value
``bound``         param, axis, k                compares the position with ``param``'s
                                                extent, telling the last ``k`` elements
                                                apart (0: a plain bound check)
``first``         axis, k                       compares the position with a constant,
                                                telling the first ``k`` elements apart
``plus``          param, axis                   adds ``param`` to the position
``value``         param                         uses the number ``param`` as a value
``never``         what                          does what no layout makes safe
================  ============================  ==========================================

``where`` is ``file:line`` in the kernel's source. No source text travels with an
image (workers get PTX and plain data alone); a message reads the line where the
source is at hand.
"""

from __future__ import annotations

#: The fields of each kind of record, before ``where``: "p" a parameter
#: index, "n" a small count or axis, "c" a signed constant, "s" text.
FIELDS = {"at": "pnnnc", "fixed": "p", "whole": "p", "size": "p", "bound": "pnn",
          "first": "nn", "plus": "pn", "value": "p", "never": "s"}

_TEXT_MAX = 500  # a source line, a file path: bounded, as everything a bundle gives is
#: The largest count, axis or constant a record holds.
COUNT_MAX = 2**31 - 1


def check_uses(uses, nargs: int) -> tuple | None:
    """``uses`` (records as tuples or lists) as a tuple of tuples, checked; None stays None
    (an image made before kernels recorded them).

    Raises
    ------
    ValueError
        Naming the first record that is not of a known kind, with the wrong number or
        types of fields, or a parameter index beyond ``nargs``.

    Examples
    --------
    >>> check_uses([["bound", 0, 0, 0, "k.py:3"]], nargs=1)
    (('bound', 0, 0, 0, 'k.py:3'),)
    >>> check_uses([["at", 5, 1, 0, 0, 0, "k.py:4"]], nargs=2)
    Traceback (most recent call last):
    ...
    ValueError: position use 0 ('at') names parameter 5 of a kernel of 2
    """
    if uses is None:
        return None
    if not isinstance(uses, (list, tuple)):
        raise ValueError(f"position uses must be a list, got {type(uses).__name__}")
    checked = []
    for i, record in enumerate(uses):
        if (not isinstance(record, (list, tuple)) or not record
                or not isinstance(record[0], str) or record[0] not in FIELDS):
            raise ValueError(f"position use {i} is not a record of a known kind "
                             f"({', '.join(FIELDS)}): {record!r:.80}")
        kind, fields = record[0], FIELDS[record[0]]
        if len(record) != len(fields) + 2:
            raise ValueError(f"position use {i} ({kind!r}) must have {len(fields) + 2} "
                             f"items, got {len(record)}")
        for spec, value in zip(fields + "s", record[1:]):
            _check_field(i, kind, spec, value, nargs)
        checked.append(tuple(record))
    return tuple(checked)


def _check_field(i, kind, spec, value, nargs):
    if spec == "s":
        if type(value) is not str or len(value) > _TEXT_MAX:
            raise ValueError(f"position use {i} ({kind!r}) has {value!r:.80} where a text "
                             f"of at most {_TEXT_MAX} characters belongs")
        return
    if type(value) is not int:
        raise ValueError(f"position use {i} ({kind!r}) has {value!r:.80} where an integer "
                         "belongs")
    if spec == "p" and not 0 <= value < nargs:
        raise ValueError(f"position use {i} ({kind!r}) names parameter {value} of a kernel "
                         f"of {nargs}")
    if spec == "n" and not 0 <= value <= COUNT_MAX or abs(value) > COUNT_MAX:
        raise ValueError(f"position use {i} ({kind!r}) has {value} out of range")
