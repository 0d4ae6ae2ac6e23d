"""Facts read off PTX text: the ISA version it needs, and which CUDA release reads it."""

from __future__ import annotations

import re

# The newest PTX ISA each CUDA release reads (CUDA release -> PTX ISA). Releases
# missing here (12.7) read what the previous one did.
_PTX_ISA_OF_CUDA = {
    (11, 0): (7, 0), (11, 1): (7, 1), (11, 2): (7, 2), (11, 3): (7, 3),
    (11, 4): (7, 4), (11, 5): (7, 5), (11, 6): (7, 6), (11, 7): (7, 7),
    (11, 8): (7, 8), (12, 0): (8, 0), (12, 1): (8, 1), (12, 2): (8, 2),
    (12, 3): (8, 3), (12, 4): (8, 4), (12, 5): (8, 5), (12, 6): (8, 5),
    (12, 8): (8, 7), (12, 9): (8, 8), (13, 0): (9, 0), (13, 1): (9, 1),
    (13, 2): (9, 2),
}

_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)


def ptx_isa_version(ptx: str) -> tuple | None:
    """The ``.version`` directive of a PTX text as ``(major, minor)``; None without one.

    Examples
    --------
    >>> ptx_isa_version(".version 8.8\\n.target sm_75\\n")
    (8, 8)
    >>> ptx_isa_version("not ptx") is None
    True
    """
    m = _VERSION_RE.search(ptx)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def max_ptx_isa(cuda_version: tuple) -> tuple:
    """The newest PTX ISA that a CUDA release (driver or nvJitLink) reads.

    Examples
    --------
    >>> max_ptx_isa((12, 9)), max_ptx_isa((12, 7))
    ((8, 8), (8, 5))
    """
    if tuple(cuda_version) > max(_PTX_ISA_OF_CUDA):
        # Newer than this table: refuse nothing rather than guess.
        return (99, 0)
    known = [v for v in _PTX_ISA_OF_CUDA if v <= tuple(cuda_version)]
    return _PTX_ISA_OF_CUDA[max(known)] if known else (0, 0)


# A shared variable declared at module or function scope: ".visible .shared .align 4
# .b8 _cudapy_smem_1[256];" (static) or ".extern .shared ... name[];" (dynamic).
_SHARED_RE = re.compile(
    r"^\s*(?P<extern>\.extern\s+)?(?:\.(?:visible|weak)\s+)?\.shared\s+(?:\.align\s+\d+\s+)?"
    r"\.[a-z]+(?P<bits>\d+)\s+[\w$.]+(?P<dims>(?:\[\d*\])*)\s*;", re.MULTILINE)


def shared_memory(ptx: str) -> tuple:
    """The shared memory a PTX text declares: ``(static bytes, whether it uses dynamic)``.

    Static shared memory is what ``cuda.shared.array`` with a constant shape
    makes; dynamic is ``cuda.shared.array(0, ...)``, sized at launch.

    Examples
    --------
    >>> shared_memory(".visible .shared .align 4 .b8 _cudapy_smem_1[256];\\n")
    (256, False)
    >>> shared_memory(".extern .shared .align 4 .b8 _cudapy_smem_1[];\\n")
    (0, True)
    """
    static, dynamic = 0, False
    for m in _SHARED_RE.finditer(ptx):
        if m.group("extern"):
            dynamic = True
            continue
        count = 1
        for dim in re.findall(r"\[(\d+)\]", m.group("dims")):
            count *= int(dim)
        static += count * int(m.group("bits")) // 8
    return static, dynamic
