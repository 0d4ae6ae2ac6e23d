"""The launch core: what the scheduler plugin, the worker parts and the features share.

As distributed's ``shuffle/_core.py`` sits below its scheduler and worker
plugins, this folder sits below :mod:`daskgpu._dask.placement` (the scheduler
plugin), :mod:`daskgpu._dask.workers` (the launch watch, the device facts),
:mod:`daskgpu._dask.map_kernel` and :mod:`daskgpu._dask.batch`: they import it,
and it imports none of them.

=============  ==============================================================
module         what it holds
=============  ==============================================================
``resources``  the launch vocabulary: ``GPU``, ``GPU-memory``, a launch's
               share, what a worker offers (:func:`~.resources.memory_offer`)
``task``       the task a map's launch runs in (:func:`~.task.run_chunk`) and
               its place, a typed record (:class:`~.task.ChunkPlace`)
``walk``       the one walk that finds the launches in a task spec
``asks``       the device memory a task's launches ask of the scheduler
=============  ==============================================================
"""
