"""The client half: compile Python functions to :class:`KernelImage` with numba-cuda.

Only this package (and the simulator) import numba.
"""
