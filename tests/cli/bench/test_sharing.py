"""The ``sharing`` section, simulated on a small mix: with four threads, large chunks
run one at a time and small ones side by side; a worker that offers no GPU-memory
runs large ones together, and the section refuses to report that."""

import pytest

from daskgpu._cli.bench import command, compute
from daskgpu._cli.bench.common import table

pytest.importorskip("distributed")

#: In-process simulated workers: the section's clusters start in about a second.
SIMULATED = {"simulate": True, "processes": False}

#: 4 large chunks of 512 float32, 16 small ones of 128: four small chunks fit together
#: (as many as the threads), two beside a large one, and two large ones never.
MIX = compute.Mix(8 << 10, large=4, small=16)


def test_sharing_is_a_section_of_the_run_size():
    assert command.SECTIONS["sharing"] is compute.bench_sharing
    assert command.section_sizes("sharing", 256 << 20) == {"size_bytes": 256 << 20}


def test_a_large_chunk_needs_two_thirds_of_the_offer_and_a_small_one_a_sixth():
    assert 8 * MIX.large_chunk * 3 == 2 * MIX.device_memory
    assert 8 * MIX.small_chunk * 6 == MIX.device_memory


@pytest.mark.slow
def test_with_four_threads_large_chunks_run_alone_and_small_ones_together():
    row = compute.bench_sharing(MIX.size_bytes, MIX.large, MIX.small, steps=1, repeat=1,
                                **SIMULATED)
    ours, base = row["at_once"]["daskgpu"], row["at_once"]["baseline"]
    assert ours["large"] == 1 and ours["small"] >= 2
    assert base == {"large": 1, "small": 1}
    assert row["what"].startswith("4 large + 16 small chunks, 4 threads (at once: 1 L, ")
    assert row["daskgpu"] > 0 and row["baseline"] > 0 and row["unit"] == "s"
    assert "as dask-cuda runs a GPU" in table([row])


@pytest.mark.slow
def test_a_worker_offering_no_gpu_memory_runs_large_chunks_together_and_is_refused():
    # Simulated workers offer GPU-memory only when daskgpu.device-memory is set.
    runs = compute.mix_on_new_worker(MIX, compute.SHARING_THREADS, steps=1, repeat=1,
                                     device_memory=None, **SIMULATED)
    assert runs.large >= 2
    with pytest.raises(RuntimeError, match=rf"^{runs.large} chunks that each need 4.00 kiB "
                                           r"of the worker's 6.00 kiB of GPU-memory ran at "
                                           r"once: launches did not ask"):
        compute.check_large_alone(runs, MIX)


def test_a_mix_without_an_element_per_small_chunk_is_refused():
    with pytest.raises(ValueError, match=r"at least 256 bytes"):
        compute.Mix(100, large=1, small=64)


@pytest.mark.gpu
def test_on_a_gpu_large_chunks_run_alone_and_small_ones_together():
    import dask

    # 64 MiB inputs: 16 MiB large chunks on a 48 MiB GPU-memory offer, 1 MiB small ones.
    with dask.config.set({"daskgpu.simulate": False}):
        row = compute.bench_sharing(64 << 20, repeat=1, simulate=False)
    ours, base = row["at_once"]["daskgpu"], row["at_once"]["baseline"]
    assert ours["large"] == 1 and ours["small"] >= 2
    assert base == {"large": 1, "small": 1}
