"""The worker half: link PTX per device, marshal arguments, launch.

Nothing under this package imports numba; workers need only numpy, cuda-core
and cuda-bindings.
"""
