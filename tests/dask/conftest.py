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

    with dask.config.set({"daskgpu.launch-bytes": _config.defaults()["daskgpu"]["launch-bytes"]}):
        yield
