"""The GPU backend of the runtime: link PTX per device, stage arrays, launch.

Everything under this package talks to the CUDA driver through
``cuda.bindings`` (and links through cuda.core's ``Linker`` only where
nvJitLink is not installed); the simulator backend and the plain-data half of
the runtime never import it. :mod:`daskgpu._runtime.backends` is the one door in.

=======================  ==========================================================
module                   what it holds
=======================  ==========================================================
``driver``               driver-call checking, sticky errors, versions, device count
``device``               this thread's device, its facts and limits, its stream
``linker``               PTX (and link inputs) to a cubin with nvJitLink
``cubin_cache``          linked kernels in memory, cubins on disk
``linked_kernel``        an image linked and loaded for a device; the module cache
``marshal``              kernel parameters as Numba lays them out
``run``                  the general launch path
``fast_path``            repeat launches on device arrays, by generated code
``host_staging``         a launch's host arrays on the device; the page-locked pools
``copy_pipeline``        pinned-slot copies of pageable arrays
``pinned_arrays``        recycled page-locked outputs
``random_states``        random states built on the device
``chains``               fused tasks' arrays on the device, and their CUDA graphs
=======================  ==========================================================
"""
