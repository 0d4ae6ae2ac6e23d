"""Which of Dask's array graph layers this test process runs on.

Dask chooses once per process, when ``dask.array`` is first imported, from
``array.query-planning``; the suite runs the Dask layer's tests on both
(``DASK_ARRAY__QUERY_PLANNING=True`` in a second process). A test that reads
what only one layer has says so with :data:`hlg_only`.
"""

import pytest

from daskgpu._dask.map_kernel.api import expressions_enabled

EXPRESSIONS = expressions_enabled()

#: For a test that reads the HighLevelGraph itself (its layers, their annotations,
#: ``fuse_roots``), or an array API that Dask's expressions do not have yet.
hlg_only = pytest.mark.skipif(EXPRESSIONS, reason="reads what only the HighLevelGraph "
                              "layer has (array.query-planning is on)")


def launch_keys(graph) -> list:
    """The keys of ``graph`` that hold a map's launch (``<name>-launch``)."""
    return [k for k in dict(graph) if isinstance(k, str) and k.endswith("-launch")]


def launch_restrictions(client) -> dict:
    """``{key: resource restrictions}`` of the tasks on ``client``'s scheduler that run a
    launch, read as the scheduler holds them (on either layer, whatever a persisted
    collection's keys are called: Dask's expressions alias them)."""
    def read(dask_scheduler):
        from daskgpu._dask.launch_core.walk import runs_launch

        return {ts.key: ts.resource_restrictions for ts in dask_scheduler.tasks.values()
                if ts.run_spec is not None and runs_launch(ts.run_spec)}

    return client.run_on_scheduler(read)


def chain_task_count() -> int:
    """Tasks of a chain of two maps over 8 chunks, optimized as ``compute`` would."""
    import dask
    import dask.array as da
    import numpy as np
    from kit.kernels import scale

    import daskgpu as dg

    with dask.config.set({"daskgpu.simulate": True, "daskgpu.launch-bytes": 0}):
        x = da.from_array(np.arange(64, dtype=np.float32), chunks=8)
        y = dg.map_kernel(scale, dg.Out(like=x), 2.0, x)
        z = dg.map_kernel(scale, dg.Out(like=x), 3.0, y)
        if EXPRESSIONS:
            graph = z.optimize().__dask_graph__()
        else:
            (opt,) = dask.optimize(z)
            graph = opt.__dask_graph__()
        return len(dict(graph))
