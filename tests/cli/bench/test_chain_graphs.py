"""The chain-graphs section without a GPU: its tasks, and its one-line skip."""

import dask
import numpy as np
import pytest

from daskgpu._cli.bench import command
from daskgpu._cli.bench.overhead import bench_chain_graphs, chain_tasks
from daskgpu._dask.map_kernel.chunk_task import Fused


def test_the_section_runs_after_the_chain_and_takes_no_size():
    names = list(command.SECTIONS)
    assert names.index("chain-graphs") == names.index("chain") + 1
    assert command.section_sizes("chain-graphs", 1 << 30) == {}


def test_its_tasks_are_the_fused_chains_of_the_graph_and_give_the_chain():
    rng = np.random.default_rng(0)
    xn, yn = rng.random(4 * 64, dtype=np.float32), rng.random(4 * 64, dtype=np.float32)
    with dask.config.set({"daskgpu.simulate": True}):
        tasks = chain_tasks(xn, yn, 64, 3)
        assert len(tasks) == 4
        for i, (launch, values) in enumerate(tasks):
            assert isinstance(launch, Fused) and len(list(launch.steps())) == 3
            assert values[-1] == ((i,), (64,), (64 * i,), None)  # the chunk's place, last
            arrays = [v for v in values if isinstance(v, np.ndarray)]
            assert len(arrays) == 4 and len({id(a) for a in arrays}) == 2  # x, and y thrice
            want = xn[64 * i:64 * (i + 1)].astype(np.float64)
            for _ in range(3):
                want = 2 * want + yn[64 * i:64 * (i + 1)]
            np.testing.assert_allclose(launch(*values), want, rtol=1e-6)


@pytest.mark.nogpu
def test_without_a_gpu_it_says_so_in_one_line_and_gives_no_row(capsys):
    assert bench_chain_graphs(chunks=4, chunk_elements=64) == []
    out = capsys.readouterr().out
    assert out.startswith("chain-graphs: skipped, it needs a GPU") and out.count("\n") == 1


def test_with_simulation_on_it_skips_too(capsys):
    with dask.config.set({"daskgpu.simulate": True}):
        assert bench_chain_graphs(chunks=4, chunk_elements=64) == []
    assert capsys.readouterr().out.startswith("chain-graphs: skipped")
