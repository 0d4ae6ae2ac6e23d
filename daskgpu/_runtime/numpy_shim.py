"""numba-cuda 0.30 on NumPy 2.5, which removed ``np.row_stack``.

numba-cuda 0.30's ``numba.cuda.np.arrayobj`` runs ``overload(np.row_stack)`` at
import, unguarded (its other overloads of removed NumPy names check the NumPy
version). On NumPy 2.5 that raises ``AttributeError`` the first time the CUDA
target loads its implementations, that is, at the first compile, and no kernel
compiles in that process. Nothing else in numba-cuda 0.30 or daskgpu needs a
name NumPy 2.5 removed.

:func:`install` puts a finder first on ``sys.meta_path`` that, for that one
module, lends NumPy a stand-in ``row_stack`` while the module runs and takes it
away afterwards, so the overload registers against a function no one else can
reach and NumPy is left as it was. A finder rather than setting the name at
``import daskgpu``: NumPy keeps saying it has no ``row_stack`` to every library
that asks. A finder rather than importing the module here: ``import daskgpu``
must not import numba (workers never do), and the module loads at the first
compile, whether the user imported ``numba.cuda`` before daskgpu or after. It
does not help a process that compiled (and failed) before importing daskgpu.
It lives in the runtime, which imports no numba, because ``import daskgpu``
installs it; the client compiler's package imports numba.

It does nothing where NumPy still has ``row_stack`` or where numba-cuda is not
0.30, and removes itself once the module has loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
import threading

import numpy as np

#: The module that registers the overload.
MODULE = "numba.cuda.np.arrayobj"


def _removed_row_stack(*args, **kwargs):
    """Stands in for ``np.row_stack`` while numba-cuda registers its overload."""
    raise AttributeError("np.row_stack was removed in NumPy 2.5: use np.vstack")


class _StandInLoader(importlib.abc.Loader):
    """Runs the module with ``np.row_stack`` lent; all else goes to its loader."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        np.row_stack = _removed_row_stack
        try:
            self._loader.exec_module(module)
        finally:
            del np.row_stack
        uninstall()

    def __getattr__(self, name):
        # get_source, get_filename, ...: inspect and linecache read the source
        # of the module's functions through its loader.
        return getattr(self._loader, name)


class RowStackFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`MODULE` through the other finders and wraps its loader."""

    def __init__(self):
        # numba-cuda's own finder (numba.cuda -> numba_cuda) asks every finder on
        # sys.meta_path again for the module it redirects, this one included.
        self._searching = threading.local()

    def find_spec(self, name, path, target=None):
        if name != MODULE or getattr(self._searching, "on", False):
            return None
        if not _numba_cuda_030():
            uninstall()
            return None
        self._searching.on = True
        try:
            spec = _find_elsewhere(self, name, path, target)
        finally:
            self._searching.on = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _StandInLoader(spec.loader)
        return spec


def _find_elsewhere(finder, name, path, target):
    for other in list(sys.meta_path):
        find_spec = getattr(other, "find_spec", None)
        if other is finder or find_spec is None:
            continue
        spec = find_spec(name, path, target)
        if spec is not None:
            return spec
    return None


def _numba_cuda_030() -> bool:
    # The finder is asked while numba.cuda imports its own modules: numba_cuda,
    # whose __version__ this reads, is loaded by then.
    version = getattr(sys.modules.get("numba_cuda"), "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version("numba-cuda")
        except importlib.metadata.PackageNotFoundError:
            return False
    return version.startswith("0.30.")


_finder = RowStackFinder()


def needed() -> bool:
    """Whether this NumPy lacks ``np.row_stack`` and numba-cuda has yet to load
    the module that registers an overload for it."""
    return not hasattr(np, "row_stack") and MODULE not in sys.modules


def install() -> None:
    """Put the finder first on ``sys.meta_path`` if :func:`needed`; idempotent."""
    if needed() and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Take the finder off ``sys.meta_path``, if it is there."""
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass
