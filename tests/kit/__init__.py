"""The test kit: what many tests share, defined once.

- :mod:`kit.kernels`: the kernels tests launch (``saxpy``, ``affine``), compiled and as source;
- :mod:`kit.clusters`: the simulated clusters the fixtures start;
- :mod:`kit.batch`: stored inputs and ``daskgpu batch`` runs for the batch tests;
- :mod:`kit.meter`: a recorder of what launches report to the runtime's meter;
- :mod:`kit.restart`: a slow worker preload and a task that loses its CUDA context.

The fixtures are in the ``conftest.py`` files: ``simulate`` and the shared
simulated clusters in tests/conftest.py (tests/dask/conftest.py adds Dask's
synchronous scheduler to ``simulate``). Tests that start clusters or processes
carry the ``slow`` marker; ``python -m pytest -m "not slow"`` is the fast lane.
Commands the README and the guide show run through tests/shown_commands.py.
"""
