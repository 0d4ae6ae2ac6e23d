"""The client half: compile Python functions to :class:`KernelImage` with numba-cuda.

Only this package (and the simulator) import numba.

=================== ================================================================
module              what it holds
=================== ================================================================
``kernel``          ``jit``, ``kernel`` and ``Kernel``: compiles, launches, ships PTX
``as_kernel``       the one door: whatever a user passes, as a kernel daskgpu launches
``compile``         one signature of a function compiled to a ``KernelImage``
``signatures``      between Numba's types and daskgpu's argument specs
``analysis``        what a kernel writes and its grid rank, from Numba's typed IR
``positions``       how a kernel uses its thread's position, from Numba's typed IR
``position_kinds``  the values that analysis follows, and how arithmetic combines them
``link_inputs``     what a kernel links besides its own PTX
``target``          device functions compiled for the target asked, not this GPU
``random_states``   ``dg.random_states`` and the states kernel
``boundary_fill``   the kernels that fill a block's boundary between time steps
=================== ================================================================

Numba's own switch to its simulator, ``NUMBA_ENABLE_CUDASIM=1``, replaces
``numba.cuda`` in the whole process with a module that cannot compile PTX,
which is what daskgpu ships; daskgpu simulates through its own setting
instead, so a process with that switch on is stopped here, in one line that
names the setting.
"""

from numba.core import config as _numba_config

from daskgpu._errors import ConfigError

if _numba_config.ENABLE_CUDASIM:
    raise ConfigError(
        "NUMBA_ENABLE_CUDASIM=1 is set, so numba.cuda is Numba's CUDA simulator in this "
        "process, which cannot compile the PTX daskgpu ships. daskgpu simulates through its "
        "own setting: unset NUMBA_ENABLE_CUDASIM and set DASK_DASKGPU__SIMULATE=1 (or "
        "dask.config.set({'daskgpu.simulate': True}), LocalGPUCluster(simulate=True))")
