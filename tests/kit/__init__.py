"""The test kit: what many tests share, defined once.

- :mod:`kit.kernels`: the kernels tests launch (``saxpy``, ``affine``), compiled and as source;
- :mod:`kit.batch`: stored inputs, folder snapshots and ``daskgpu batch`` runs;
- :mod:`kit.meter`: a recorder of what launches report to the runtime's meter;
- :mod:`kit.restart`: a slow worker preload and a task that loses its CUDA context.

Fixtures are in the ``conftest.py`` files. tests/conftest.py has ``simulate``
(launches run in Numba's CUDA simulator) and ``cluster`` and ``client`` (a
simulated ``LocalGPUCluster`` of threaded workers, one a module); a module that
needs another cluster defines its own ``cluster`` or ``client``. In tests/dask,
``simulate`` also runs graphs on Dask's synchronous scheduler.

A test that starts a cluster or a process carries the ``slow`` marker (a test
that uses ``cluster`` or ``client`` gets it from tests/conftest.py); one that
starts either without it fails, saying so. ``python -m pytest -q -m "not slow"``
is the fast lane. The commands the README and the guide show run through
tests/shown_commands.py.
"""
