"""The plain-data core: what travels from client to worker.

A :class:`~daskgpu.KernelImage` (PTX per target, argument specs, write set,
link inputs), the argument specs it matches arguments by, launch
configurations, and facts read off PTX text. Nothing here imports numba, a GPU
library or dask; both halves build on it.

=================  ================================================================
module             what it holds
=================  ================================================================
``image``          ``KernelImage``: one compiled signature, immutable plain data
``argspec``        what one kernel parameter accepts, as plain data
``array_info``     what a launch reads off each argument at run time
``launch_config``  ``LaunchConfig``: grid and block, or a forall's task count
``ptx``            facts read off PTX text: its ISA, which CUDA release reads it
``position_uses``  how a kernel uses its thread's position, as plain records
``random_states``  xoroshiro128+ states as plain data: jump tables, a host reference
``bundle/``        the kernel bundle format: the file, its hash, images as JSON
=================  ================================================================
"""
