"""Fixtures of the Dask layer's tests."""

import dask
import pytest


@pytest.fixture(scope="module", autouse=True)
def launches_per_chunk():
    """The Dask layer's tests check what each chunk's launch does (its place, offsets,
    per-chunk outputs, chains, task counts), so their maps launch once per chunk, as
    ``daskgpu.launch-bytes: 0`` has it. Module-scoped, so that module-scoped fixtures
    that build maps see it too."""
    with dask.config.set({"daskgpu.launch-bytes": 0}):
        yield


@pytest.fixture(autouse=True)
def grouped_launches(request):
    """A test marked ``@pytest.mark.grouped`` maps with the default launch size."""
    if request.node.get_closest_marker("grouped") is None:
        yield
        return
    from daskgpu import _config

    default = _config.defaults()["daskgpu"]["launch-bytes"]
    with dask.config.set({"daskgpu.launch-bytes": default}):
        yield


@pytest.fixture
def simulate():
    """Simulated launches (``daskgpu.simulate`` on) under Dask's synchronous scheduler: a
    graph's chunks run in this process, one after another, with no cluster."""
    with dask.config.set({"daskgpu.simulate": True, "scheduler": "sync"}):
        yield
