"""``iterate``: a stencil kernel run for many steps, a block of steps per task.

The feature's modules, in the order an iteration is built:

- :mod:`.plan`: what the steps add to a map's plan (which output feeds which
  state, the block of steps a task runs, the boundary filled again per step);
- :mod:`.graph`: one layer of tasks per block, on either of Dask's graph layers;
- :mod:`.block_task`: what a task runs on a worker, the block's steps on the GPU;
- :mod:`.api`: :func:`iterate` itself, which validates and delegates.

It builds on :mod:`daskgpu._dask.map_kernel`: a step is planned as a map
(its kernel image, parameters and chunks), launched by the map's chunk launch,
and placed, sized and timed as a map's launches are.
"""
