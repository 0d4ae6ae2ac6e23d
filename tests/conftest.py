"""Fixtures and hooks of the whole suite; the kernels and helpers they share are in kit/."""

import contextlib
import functools
import os
import sys
import warnings

import dask
import pytest
from numba import cuda

# The kit (kit.kernels, ...) and tests/shown_commands.py import by name, also in the
# worker processes the tests spawn: the suite imports in importlib mode, which puts
# no test folder on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The kit holds no tests; collected for doctests, its kernels would compile twice.
collect_ignore = ["kit"]

# daskgpu's settings, registered with dask.config once for the whole suite, before any
# test sets one: a `dask.config.set` block entered first would take them away as it ends.
from daskgpu import _config  # noqa: E402

_config.register()


@functools.cache
def gpu_available() -> bool:
    from daskgpu._runtime.gpu.driver import device_count

    return device_count()[0] > 0


#: Fixtures that start a cluster or processes: a test that uses one is ``slow``.
#: (``slurm`` starts a SLURM: tests/deploy; ``site`` builds the docs, ``shots`` runs a
#: browser, ``threaded_clusters`` starts the guide's clusters: tests/docs.)
SLOW_FIXTURES = frozenset({"client", "cluster", "slurm", "site", "shots", "threaded_clusters"})


def pytest_collection_modifyitems(config, items):
    # `gpu` tests need a device; `nogpu` tests check what happens without one.
    unwanted, reason = ("nogpu", "checks the no-GPU case") if gpu_available() else (
        "gpu", "needs a CUDA GPU")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        # The marker itself: item.keywords also holds folder names (tests/runtime/gpu/).
        if item.get_closest_marker(unwanted) is not None:
            item.add_marker(skip)
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)



def pytest_xdist_auto_num_workers(config):
    """How many processes ``-n auto`` (pyproject.toml's addopts) runs the tests in, each
    taking whole files (``--dist loadfile``, so that a module's fixtures start once).

    Two on a machine of two cores or more: most of a test that starts a cluster or a
    process waits, and the other process runs meanwhile. One (no xdist) where a GPU is:
    its tests time and fill the one device, which a second process would share. ``-n 0``
    runs in one process anywhere (for ``--pdb``, or ``-s`` to see a test's prints).
    """
    if gpu_available() or len(os.sched_getaffinity(0)) < 2:
        return 0
    return 2

# -- the fast lane starts no process and no cluster ------------------------------

class _Starts:
    """The processes and clusters started while a test not marked ``slow`` runs.

    Wraps ``subprocess.Popen``, ``multiprocessing``'s ``Process.start`` and
    distributed's ``SpecCluster`` (``LocalGPUCluster``, ``LocalCluster``, ...) once a
    session; each records what it starts while :attr:`watching`.
    """

    def __init__(self):
        self.watching = False
        self.seen = []

    def install(self):
        import multiprocessing.process
        import subprocess

        from distributed.deploy.spec import SpecCluster

        self._wrap(subprocess.Popen, "__init__",
                   lambda self, *args, **kwargs: f"the process {(args or [kwargs.get('args')])[0]!r}"[:200])
        self._wrap(multiprocessing.process.BaseProcess, "start",
                   lambda self: f"the process {self.name!r} (multiprocessing)")
        self._wrap(SpecCluster, "__init__", lambda self, *_, **__: f"a {type(self).__name__}")

    def _wrap(self, cls, name, describe):
        original = getattr(cls, name)

        @functools.wraps(original)
        def recorded(obj, *args, **kwargs):
            if self.watching:
                self.seen.append(describe(obj, *args, **kwargs))
            return original(obj, *args, **kwargs)

        setattr(cls, name, recorded)

    @contextlib.contextmanager
    def watch(self, item, when):
        if item.get_closest_marker("slow") is not None:
            yield
            return
        self.watching, self.seen = True, []
        try:
            yield
        finally:
            self.watching = False
        if not self.seen:
            return
        message = (f"{item.nodeid} started {'; '.join(dict.fromkeys(self.seen))} in its "
                   f"{when} but is not marked slow: mark it @pytest.mark.slow (the fast "
                   "lane, pytest -m 'not slow', skips slow tests)")
        if item.get_closest_marker("gpu") is not None:
            # Written where no GPU runs it: a warning on the GPU machine, not a failure.
            warnings.warn(pytest.PytestWarning(message), stacklevel=1)
        else:
            pytest.fail(message, pytrace=False)


_starts = _Starts()


def pytest_configure(config):
    _starts.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _starts.watch(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _starts.watch(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _starts.watch(item, "teardown"):
        return (yield)


@pytest.fixture
def simulate():
    """Kernels launched in the test run in Numba's CUDA simulator (``daskgpu.simulate`` on)."""
    with dask.config.set({"daskgpu.simulate": True}):
        yield


@pytest.fixture(scope="module")
def cluster():
    """A simulated ``LocalGPUCluster`` of two threaded workers in this process, on TCP so
    that a subprocess can join it; one a module.

    Starting one takes a tenth of a second: what makes a test slow is a cluster of worker
    processes, which a test that needs one starts itself. While it is open, simulation
    is on in this process (``daskgpu.simulate``), so a module's tests do not share it
    with the next module's.
    """
    import daskgpu as dg

    with dg.LocalGPUCluster(simulate=True, processes=False, protocol="tcp://",
                            dashboard_address=":0") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    """A client of :func:`cluster`, the default one for the module's tests."""
    from distributed import Client

    with Client(cluster) as client:
        yield client


@pytest.fixture(scope="session")
def plus_one_ptx(tmp_path_factory):
    """A PTX file defining device function ``plus_one`` with Numba's ABI (no GPU needed)."""
    from numba import cuda

    def plus_one(x):
        return x + 1

    ptx, _ = cuda.compile_ptx(plus_one, "int32(int32)", device=True, cc=(7, 5),
                              abi_info={"abi_name": "plus_one"})
    path = tmp_path_factory.mktemp("link") / "plus_one.ptx"
    path.write_text(ptx)
    return path


# -- the kernels the bundle tests save and load (tests/image, tests/runtime) ------

def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a * x[i] + y[i]


def fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


@pytest.fixture(scope="session")
def bundle_kernels():
    """A two-signature saxpy with options and targets, and a one-signature fill."""
    import types

    import daskgpu as dg

    return types.SimpleNamespace(
        saxpy=dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
                      "void(float64[:], float64, float64[:], float64[:])"],
                     targets=["7.5", "9.0"], fastmath=True, max_registers=64)(saxpy),
        fill=dg.jit("void(float32[::1])")(fill),
    )


@pytest.fixture
def bundle(tmp_path, bundle_kernels):
    """The saxpy of :func:`bundle_kernels`, saved to a bundle file."""
    import daskgpu as dg

    path = tmp_path / "saxpy.dgk"
    dg.save(bundle_kernels.saxpy, path)
    return path
