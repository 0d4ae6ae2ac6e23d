"""The Dask layer: ``map_kernel``, the embedded cluster, the worker plugin, batch jobs.

It builds graphs from client kernels and PTX-only kernels alike and leaves
compiling to :mod:`daskgpu._compiler` and launching to :mod:`daskgpu._runtime`.
Its parts, from the ground up (each imports only those above it in this table):

=================  ================================================================
module             what it holds
=================  ================================================================
``launch_core/``   what the parts below share: the launch vocabulary, the task a
                   map's launch runs in, the walk that finds launches, memory asks
``placement``      the scheduler plugin: launches on GPU workers, memory asked
``workers/``       the worker side: the plugin, its launch watch, device facts,
                   GPU time, Prometheus figures
``cluster_facts``  what the current cluster's workers offer, as its scheduler says
``cluster``        ``LocalGPUCluster``: one worker per local GPU
``launch_layout``  which chunks each launch covers: group sizes, and when grouping
                   cannot change what a kernel computes (map_kernel and batch)
``map_kernel/``    the feature: one launch per chunk of dask arrays
``iterate/``       the feature: a stencil kernel for many time steps, a block of
                   steps per task (built from map_kernel's plan and layers)
``batch/``         the feature: a kernel over stored arrays, chunk by chunk
=================  ================================================================
"""
