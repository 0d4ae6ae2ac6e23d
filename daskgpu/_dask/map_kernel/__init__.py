"""``map_kernel``: one forall-style launch per chunk of dask arrays.

The feature's modules, in the order a map is built:

- :mod:`.arguments` and :mod:`.arg_kinds`: what the user passes (``dg.Out``,
  ``dg.offset``, arrays, numbers) and how each kind plans its parameters;
- :mod:`.keywords`: the ``da.map_blocks`` keywords (``dtype=``, ``meta=``,
  ``chunks=``), checked, and those it refuses with what does the same;
- :mod:`.selection`: the kernel image and launch rank a map runs;
- :mod:`.plan`: :class:`~.plan.MapPlan`, everything about one map, built once;
- :mod:`.graphs`: the plan as tasks, on Dask's
  HighLevelGraph or on its array expressions (``array.query-planning``);
- :mod:`.chunk_task` and :mod:`.chunk_params`: what a task runs on a worker;
- :mod:`.arrays`: what both halves ask of an array (CuPy or NumPy, its dtype);
- :mod:`.chains`: a map over another map's result, fused into one task;
- :mod:`.reduction`: per-chunk outputs combined across chunks;
- :mod:`.api`: :func:`map_kernel` itself, which validates and delegates.
"""
