"""The worker half: launches as plain data, and the backends that run them.

Nothing under this package imports numba (but the simulator, to simulate) or
Dask; workers need only numpy and cuda-bindings (cuda-core, too, to link
without nvJitLink).

=======================  ==========================================================
module                   what it holds
=======================  ==========================================================
``launch``               ``Launch`` and ``LaunchAPI``: launch syntax and dispatch
``ptx_kernel``           ``PTXKernel``: a compiled kernel as plain data
``dispatch``             which image takes the arguments, as Numba's dispatcher picks
``backends/``            the one seam to a device: which runs launches, what it is
``gpu/``                 the GPU: link, cache, marshal, stage, launch
``simulator``            Numba's CUDA simulator on the host
``random_states``        ``dg.random_states`` built where the kernel runs
``faults``               exceptions raised by kernels on the device
``metrics``              launch time by activity for whoever hosts the runtime; NVTX
``kernel_files``         kernel bundle files: ``dg.save`` / ``dg.load``
``kernel_kinds``         what a user passed as a kernel, told once, by type
``launch_task``          ``LaunchTask``: what a launch asks of scheduler and worker
``launch_runs``          when each thread's launch began its run; stopping it
``numpy_shim``           numba-cuda 0.30 on NumPy 2.5, which removed ``np.row_stack``
=======================  ==========================================================
"""
