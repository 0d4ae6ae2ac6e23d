"""Reading PTX text: its ISA version, and which CUDA release reads which ISA."""

import pytest

from daskgpu._image.ptx import max_ptx_isa, ptx_isa_version


def test_ptx_isa_version_parsing():
    assert ptx_isa_version("//\n// comment .version 1.0\n  .version 7.8\n.target sm_75") == (7, 8)
    assert ptx_isa_version("\t.version 10.12\n") == (10, 12)
    assert ptx_isa_version("\x7fELF binary") is None


@pytest.mark.parametrize("cuda_version, isa", [
    # From NVIDIA's PTX ISA release notes: the ISA each CUDA release introduced.
    ((11, 0), (7, 0)), ((11, 8), (7, 8)), ((12, 0), (8, 0)), ((12, 4), (8, 4)),
    ((12, 5), (8, 5)), ((12, 6), (8, 5)), ((12, 8), (8, 7)), ((12, 9), (8, 8)),
    ((13, 0), (9, 0)),
    ((12, 7), (8, 5)),  # no such release: reads what 12.6 did
    ((10, 2), (0, 0)),  # older than the table: reads nothing daskgpu emits
    ((99, 0), (99, 0)),  # newer than the table: refuse nothing
])
def test_max_ptx_isa(cuda_version, isa):
    assert max_ptx_isa(cuda_version) == isa
    assert max_ptx_isa(list(cuda_version)) == isa


