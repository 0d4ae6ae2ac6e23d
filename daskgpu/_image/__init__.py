"""The plain-data core: what travels from client to worker.

A :class:`~daskgpu.KernelImage` (PTX per target, argument specs, write set,
link inputs), the argument specs it matches arguments by, launch
configurations, and facts read off PTX text. Nothing here imports numba, a GPU
library or dask; both halves build on it.
"""
