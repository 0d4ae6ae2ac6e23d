"""The Dask layer: ``map_kernel``, the embedded cluster, the worker plugin, batch jobs.

It builds graphs from client kernels and PTX-only kernels alike and leaves
compiling to :mod:`daskgpu._compiler` and launching to :mod:`daskgpu._runtime`.
"""
