"""pytest plugin: numba-cuda's own tests, with their kernels launched through daskgpu.

Load it with ``-p daskgpu_conformance`` (this folder on ``sys.path``) when running
numba-cuda's installed tests (``--pyargs numba.cuda.tests.cudapy.test_x``).

- ``--daskgpu-route``: every kernel that a test module defines with ``cuda.jit``
  becomes a proxy. Launching it (``k[grid, block](...)``, ``k.forall(n)(...)``)
  types the arguments as numba-cuda does, compiles that signature with
  daskgpu, pickles the kernel (PTX-only data), unpickles it and launches the
  copy. Everything else (device functions, numba-cuda's library kernels,
  introspection such as ``k.inspect_asm()``) stays numba-cuda's.
- ``--daskgpu-report PATH``: write each test's outcome, the reason of a
  failure, and how many launches went through daskgpu, as JSON.
- ``--daskgpu-manifest PATH`` (with ``--daskgpu-route``): record each kernel
  compiled, as plain data (``kernel_refs.py``): where its function is defined,
  its numba argument types and options. ``test_kernels_compile.py`` compiles
  them again in CI, without a GPU.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading

import pytest

_state = threading.local()
_LAUNCHES = {"count": 0}
_MANIFEST: list = []


def pytest_addoption(parser):
    group = parser.getgroup("daskgpu conformance")
    group.addoption("--daskgpu-route", action="store_true",
                    help="launch the tests' kernels through pickled daskgpu launches")
    group.addoption("--daskgpu-report", default=None, help="write outcomes as JSON here")
    group.addoption("--daskgpu-manifest", default=None,
                    help="record the kernels compiled, for the no-GPU CI check")
    # numba-cuda's repository conftest.py defines these; its wheel does not ship them.
    try:
        parser.addoption("--dump-failed-filechecks", action="store_true",
                         help="Dump reproducers for FileCheck tests that fail.")
    except ValueError:  # already defined by a conftest.py
        pass


@pytest.fixture(scope="class")
def initialize_from_pytest_config(request):
    if request.cls is not None:
        request.cls._dump_failed_filechecks = request.config.getoption("dump_failed_filechecks")


def pytest_configure(config):
    config._daskgpu_outcomes = {}
    if config.getoption("daskgpu_route"):
        install()


# -- routing ------------------------------------------------------------------------------


def _from_a_test_module(depth: int = 2) -> bool:
    """Whether the code calling ``cuda.jit`` is one of numba-cuda's test modules."""
    frame = sys._getframe(depth)
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/numba/cuda/tests/" in path:
            return True
        if "/numba/cuda/" in path or "/numba_cuda/" in path:
            return False  # numba-cuda's own library code
        if path.endswith("daskgpu_conformance.py"):
            frame = frame.f_back
            continue
        return False
    return False


def install():
    """Replace ``numba.cuda.jit`` with the routing one."""
    import numba.cuda
    import numba.cuda.decorators as decorators
    import numba.cuda.kernels.reduction  # noqa: F401
    import numba.cuda.kernels.transpose  # noqa: F401

    # Library kernels made when these import stay numba-cuda's.
    import numba.cuda.random  # noqa: F401

    original = decorators.jit
    if getattr(original, "_daskgpu_routed", False):
        return

    def jit(func_or_sig=None, *args, **kws):
        made = original(func_or_sig, *args, **kws)
        if not _from_a_test_module():
            return made
        return _wrap(made)

    jit._daskgpu_routed = True
    jit.__wrapped__ = original
    decorators.jit = jit
    numba.cuda.jit = jit


def _wrap(made):
    from numba.cuda.dispatcher import CUDADispatcher

    if isinstance(made, CUDADispatcher):
        if made.targetoptions.get("device"):
            return made
        return RoutedKernel(made)
    if callable(made):  # a decorator: cuda.jit(sig, ...) or cuda.jit(**options)
        def decorate(fn):
            return _wrap(made(fn))
        return decorate
    return made


class RoutedKernel:
    """A numba-cuda kernel whose launches go through daskgpu."""

    def __init__(self, dispatcher):
        self.__dict__["_dispatcher"] = dispatcher
        self.__dict__["_dg"] = None
        self.__dict__["_shipped"] = None
        self.__dict__["_shipped_n"] = -1
        self.__dict__["_lock"] = threading.Lock()
        self.__dict__["__doc__"] = dispatcher.__doc__

    def __getattr__(self, name):
        if name.startswith(("inspect_", "get_")) or name in ("overloads", "signatures"):
            # What numba-cuda itself makes for the signatures launched: tests
            # that inspect the PTX inspect numba's, as without daskgpu.
            d = self._dispatcher
            for argtypes in self.__dict__.get("_seen", ()):
                if d._can_compile and argtypes not in d.overloads:
                    try:
                        d.compile(argtypes)
                    except Exception:  # noqa: BLE001 - it failed to compile at launch too,
                        pass  # and numba keeps no overload for it either
        return getattr(self._dispatcher, name)

    def __setattr__(self, name, value):
        setattr(self._dispatcher, name, value)

    def __repr__(self):
        return f"<daskgpu-routed {self._dispatcher!r}>"

    def __reduce__(self):  # as numba's dispatcher pickles: its function, rebuilt and routed
        return RoutedKernel, (self._dispatcher,)

    # launch syntax, as numba-cuda's dispatcher
    def __getitem__(self, config):
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ValueError("must specify at least the griddim and blockdim")
        return RoutedLaunch(self, "configure", tuple(config))

    def configure(self, griddim, blockdim, stream=0, sharedmem=0):
        return RoutedLaunch(self, "configure", (griddim, blockdim, stream, sharedmem))

    def forall(self, ntasks, tpb=0, stream=0, sharedmem=0):
        from daskgpu._image.launch_config import LaunchConfig

        # Checked here, as numba's ForAll checks them when it is made.
        LaunchConfig(ntasks=ntasks, tpb=tpb, sharedmem=sharedmem)
        return RoutedLaunch(self, "forall", (ntasks, tpb, stream, sharedmem))

    def __call__(self, *args, **kwargs):
        return self._dispatcher(*args, **kwargs)  # numba's error for a launch without a config

    # compiling and shipping
    def _shipped_kernel(self, args):
        import daskgpu as dg

        d = self._dispatcher
        with self._lock:
            if self._dg is None:
                # An eagerly compiled dispatcher launches its own signatures only
                # (a Python int goes to its int32 one); a lazy one compiles per call.
                eager = not d._can_compile
                if eager:
                    for argtypes in d.overloads:
                        _record(d.py_func, argtypes, d.targetoptions)
                self.__dict__["_dg"] = dg.kernel(d, signatures=list(d.overloads) if eager else [])
            k = self._dg
            if not k._lazy:
                return self._ship(k)
            argtypes = tuple(d.typeof_pyval(a) for a in args)
            seen = self.__dict__.setdefault("_seen", set())
            if argtypes not in seen:  # recorded before compiling: failures are kept too
                seen.add(argtypes)
                _record(d.py_func, argtypes, d.targetoptions)
            k.compile(argtypes)
            return self._ship(k)

    def _ship(self, k):
        if self._shipped_n != len(k.images):
            # What a worker receives: the images as plain data, unpickled.
            self.__dict__["_shipped"] = pickle.loads(pickle.dumps(k))
            self.__dict__["_shipped_n"] = len(k.images)
        return self._shipped


class RoutedLaunch:
    def __init__(self, kernel, how, config):
        self.kernel, self.how, self.config = kernel, how, config

    @property
    def griddim(self):
        return self._launch_config().griddim

    @property
    def blockdim(self):
        return self._launch_config().blockdim

    def _launch_config(self):
        from daskgpu._image.launch_config import LaunchConfig

        return LaunchConfig(_dims(self.config[0]), _dims(self.config[1]))

    def __call__(self, *args):
        shipped = self.kernel._shipped_kernel(args)
        griddim_or_ntasks, other, *rest = self.config
        if self.how == "forall":
            tpb, stream, sharedmem = other, *rest
            if griddim_or_ntasks == 0:
                _LAUNCHES["count"] += 1
            launch = shipped.forall(griddim_or_ntasks, tpb=tpb, stream=stream, sharedmem=sharedmem)
        else:
            stream = rest[0] if rest else 0
            sharedmem = rest[1] if len(rest) > 1 else 0
            launch = shipped.configure(_dims(griddim_or_ntasks), _dims(other), stream, sharedmem)
        _LAUNCHES["count"] += 1
        launch(*args)


def _dims(d):
    # numba's Dim3 and tuples of any length
    if hasattr(d, "x") and hasattr(d, "y"):
        return (d.x, d.y, d.z)
    return d


def _record(py_func, argtypes, targetoptions):
    if _MANIFEST is None:
        return
    import kernel_refs

    try:
        _MANIFEST.append(kernel_refs.record(py_func, argtypes, targetoptions))
    except Exception:  # argument types that do not pickle: counted as left out
        _MANIFEST.append(None)


# -- outcomes -----------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = _LAUNCHES["count"]
    yield
    item._daskgpu_launches = _LAUNCHES["count"] - start


def pytest_runtest_logreport(report):
    config = _CONFIG[0] if _CONFIG else None
    if config is None:
        return
    outcomes = config._daskgpu_outcomes
    # Node ids of installed tests outside the rootdir lack their file: add it.
    key = report.nodeid
    module = getattr(report, "daskgpu_module", None) or _MODULES.get(report.nodeid)
    if module and not key.startswith(module):
        key = module + key if key.startswith("::") else f"{module}::{key}"
    entry = outcomes.setdefault(key, {"outcome": "passed", "reason": "", "launches": 0})
    if report.when == "call":
        entry["launches"] = getattr(report, "daskgpu_launches", 0)
    if report.outcome == "failed" or (report.outcome == "skipped" and entry["outcome"] == "passed"):
        entry["outcome"] = "failed" if report.outcome == "failed" else "skipped"
        if report.when != "call" and report.outcome == "failed":
            entry["outcome"] = "error"
        entry["reason"] = _reason(report)


_MODULES: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    module = getattr(getattr(item, "module", None), "__name__", None)
    if module:
        report.daskgpu_module = module
        _MODULES[item.nodeid] = module
    if call.when == "call":
        report.daskgpu_launches = getattr(item, "_daskgpu_launches", 0)


_CONFIG: list = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _CONFIG.append(session.config)


def _reason(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0][:300] if crash.message.strip() else ""
    if isinstance(report.longrepr, tuple):  # skips: (file, line, reason)
        return str(report.longrepr[2])[:300]
    return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""


def pytest_sessionfinish(session):
    config = session.config
    path = config.getoption("daskgpu_report")
    if path:
        with open(path, "w") as f:
            json.dump(config._daskgpu_outcomes, f, indent=0, sort_keys=True)
    manifest = config.getoption("daskgpu_manifest")
    if manifest and _MANIFEST:
        with open(manifest, "wb") as f:
            pickle.dump(_MANIFEST, f, protocol=4)
