"""Fixtures of the Dask layer's tests."""

import dask
import pytest


@pytest.fixture
def simulate():
    """Simulated launches (``daskgpu.simulate`` on) under Dask's synchronous scheduler: a
    graph's chunks run in this process, one after another, with no cluster."""
    with dask.config.set({"daskgpu.simulate": True, "scheduler": "sync"}):
        yield
