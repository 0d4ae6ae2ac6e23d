"""The public API is typed: ``py.typed``, hints on every public name, mypy clean.

mypy (settings in pyproject.toml's ``[tool.mypy]``) checks a user's program
written against ``daskgpu.__all__`` together with the modules that define those
names, and must find nothing; a second program that misuses the API must fail
where, and only where, it is wrong, which shows the hints are read (a name
typed ``Any`` lets anything pass).
"""

import ast
import inspect
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import daskgpu

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "daskgpu"

#: Modules of public names whose hints are still being written: mypy reads the
#: types they have but does not report their errors, and their names are not
#: yet held to full hints. Take a module off once it is typed (the tests say so).
NOT_YET_TYPED = {
    "daskgpu._dask.map_kernel.arguments",
    "daskgpu._dask.batch.job",
    "daskgpu._dask.batch.progress",
    "daskgpu._dask.map_kernel.api",
    "daskgpu._dask.workers.plugin",
}


def _defining_module(name: str) -> str:
    value = getattr(daskgpu, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        return value.__module__
    return type(value).__module__  # an instance, such as dg.offset


def public_modules() -> set[str]:
    """The modules that define the names of ``daskgpu.__all__``, and the package's own."""
    found = {_defining_module(n) for n in daskgpu.__all__ if n != "__version__"}
    return found | {"daskgpu", "daskgpu._version"}


def _path(module: str) -> pathlib.Path:
    parts = module.split(".")[1:]
    package = PACKAGE.joinpath(*parts)
    return package / "__init__.py" if package.is_dir() else package.with_suffix(".py")


# -- hints on every public name ---------------------------------------------------

def _callables(name, value):
    """``(qualified name, function)`` of a public function or class's public methods."""
    if inspect.isfunction(value):
        yield name, value
        return
    if not inspect.isclass(value):
        return
    for cls in value.__mro__:
        if not cls.__module__.startswith("daskgpu"):
            continue
        for attr, member in vars(cls).items():
            if attr.startswith("_") and attr not in ("__init__", "__call__", "__getitem__"):
                continue
            if isinstance(member, property):
                member = member.fget
            elif isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member):
                yield f"{name}.{attr}", member


def _unhinted(function) -> list[str]:
    sig = inspect.signature(function)
    missing = [p.name for p in sig.parameters.values()
               if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def _hint_gaps() -> dict[str, dict[str, list[str]]]:
    """``{module: {callable: [unhinted parameters, "return"]}}`` over ``__all__``."""
    gaps: dict[str, dict[str, list[str]]] = {}
    for name in daskgpu.__all__:
        for qualified, function in _callables(name, getattr(daskgpu, name)):
            missing = _unhinted(function)
            if missing:
                gaps.setdefault(function.__module__, {})[qualified] = missing
    return gaps


def test_the_package_carries_the_typing_marker():
    # PEP 561: without it, type checkers ignore the package's hints.
    assert (PACKAGE / "py.typed").is_file()


def test_every_public_function_and_method_has_hints():
    gaps = {m: g for m, g in _hint_gaps().items() if m not in NOT_YET_TYPED}
    assert gaps == {}


def test_the_modules_not_yet_typed_are_listed_only_while_untyped():
    gaps = _hint_gaps()
    typed = sorted(m for m in NOT_YET_TYPED if m not in gaps)
    assert typed == [], "typed now: take these off NOT_YET_TYPED"
    assert NOT_YET_TYPED <= public_modules()


def test_type_checkers_see_the_lazy_names_as_the_package_serves_them():
    """``__init__``'s ``if TYPE_CHECKING:`` imports name the modules ``_LAZY`` serves."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    seen = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Attribute)
                and node.test.attr == "TYPE_CHECKING"):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                seen.update({alias.name: stmt.module for alias in stmt.names})
    assert seen == daskgpu._LAZY


# -- mypy ---------------------------------------------------------------------

#: A user's program: every public name used as the documentation shows it.
#: assert_type pins what mypy infers, so a hint that decays to Any fails here.
GOOD = '''
    from __future__ import annotations

    import pathlib

    import dask.array as da
    import numpy as np
    from distributed import Client
    from numba import cuda
    from typing_extensions import assert_type

    import daskgpu as dg

    SIG = "void(float32[::1], float32, float32[::1], float32[::1])"


    def saxpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]


    class Lines(dg.BatchProgress):
        pass


    def kernels(path: pathlib.Path) -> None:
        eager = dg.jit(SIG)(saxpy)
        assert_type(eager, dg.Kernel)
        assert_type(dg.jit(saxpy), dg.Kernel)
        tuned = dg.jit([SIG], targets=["7.5", (9, 0)], fastmath=True, max_registers=64,
                       lineinfo=True, link=[path], launch_bounds=256)
        assert_type(tuned(saxpy), dg.Kernel)
        assert_type(dg.kernel(cuda.jit(saxpy), [SIG], fastmath=True), dg.Kernel)

        image = eager.compile(SIG)
        assert_type(image, dg.KernelImage)
        assert_type(eager.images, tuple[dg.KernelImage, ...])
        assert_type(eager.signatures, list[str])
        assert_type(image.hash, str)
        assert_type(image.ptx_for((8, 0)), str | None)

        x = np.ones(1000, np.float32)
        out = np.empty_like(x)
        launch = eager[4, 256]
        assert_type(launch, dg.Launch)
        assert_type(eager.configure((4, 1), 256, timeout=30), dg.Launch)
        assert_type(eager.forall(x.size), dg.Launch)
        assert_type(eager.forall((10, 100), tpb=128, sharedmem=1024), dg.Launch)
        assert_type(launch.config, dg.LaunchConfig)
        assert_type(launch.timeout, float | None)
        written = launch(out, np.float32(2), x, x)  # whatever the kernel wrote
        assert_type(eager.specialize(out, np.float32(2), x, x), dg.Kernel)
        config = dg.LaunchConfig(ntasks=1000, tpb=128)
        assert_type(config.griddim, tuple[int, ...] | None)
        assert_type(dg.LaunchConfig(4, 256) == config, bool)

        digest = dg.save(eager, path / "saxpy.dgk", key="secret")
        assert_type(digest, str)
        loaded = dg.load(str(path / "saxpy.dgk"), key=b"secret")
        assert_type(loaded, dg.PTXKernel)
        assert_type(loaded.forall(1000), dg.Launch)
        print(written, dg.random_states(42, n=1000, start=10), dg.__version__.split("."))


    def cluster() -> None:
        gpus = dg.LocalGPUCluster(devices=[0], simulate=True, dashboard_address=None,
                                  death_timeout="2 minutes")
        assert_type(gpus.devices, tuple[int | str, ...])
        assert_type(gpus.simulated, bool)
        eager = dg.jit(SIG)(saxpy)
        with Client(gpus) as client:
            x = np.ones(1000, np.float32)
            future = client.submit(eager.forall(x.size), np.empty_like(x), 2.0, x, x)
            xd = da.from_array(x, chunks=250)
            z = dg.map_kernel(eager, dg.Out(np.float32, like=xd), np.float32(2), xd, xd)
            client.register_plugin(dg.GPUWorkerPlugin())
            print(future.result(), z.sum().compute(), client.run(dg.device_info), dg.offset)
        gpus.close()


    def errors(kernel: dg.Kernel) -> str:
        try:
            kernel.compile("void(float32[::1])")
        except dg.CUDAError as error:
            return f"{error.code}: {error}"
        except (dg.CompileError, dg.LinkError, dg.PTXVersionError, dg.PicklingError,
                dg.BundleError, dg.ConfigError, dg.LaunchConfigError, dg.BatchError,
                dg.ContextLostError, dg.LaunchTimeoutError, dg.DeviceError) as error:
            return str(error)
        except dg.DaskGPUError:
            raise
        return ""


    def batch(report: dg.BatchReport) -> object:
        return report, dg.run_batch, Lines
'''

#: Each line marked ``# wrong`` is an error mypy must report; no other line is.
BAD = '''
    import numpy as np

    import daskgpu as dg


    def f(out):
        out[0] = 1


    kernel = dg.jit("void(float32[::1])")(f)
    dg.jit("void(float32[::1])", fastmath="yes")  # wrong
    kernel.forall("1000")  # wrong
    dg.load(42)  # wrong
    dg.no_such_name  # wrong
    dg.LocalGPUCluster(simulate="yes")  # wrong
    count: int = kernel.images  # wrong
    dg.jit(f).compile("void(float32[::1])").no_such_field  # wrong
    dg.LaunchConfig(4, 256, sharedmem=1.5)  # wrong
    dg.random_states("42")  # wrong
    dg.save(kernel, 3)  # wrong
    kernel[4, 256](np.zeros(4, np.float32))
'''


#: Internal interfaces mypy holds their implementations to: each module of an interface
#: (whose own errors are all reported) and its implementations (whose errors against
#: the interface are: ``[override]``, a member's signature that differs).
INTERFACES = {
    "daskgpu._dask.map_kernel.graphs.layer": ("daskgpu._dask.map_kernel.graphs.hlg",
                                              "daskgpu._dask.map_kernel.graphs.expr"),
}

#: The graph layers, made as ``map_kernel`` makes them: mypy refuses to make one that
#: lacks a member of the interface.
LAYERS = '''
    from daskgpu._dask.map_kernel.graphs.expr import ExprLayer
    from daskgpu._dask.map_kernel.graphs.hlg import HLGLayer
    from daskgpu._dask.map_kernel.graphs.layer import GraphLayer

    layers: list[GraphLayer] = [HLGLayer(), ExprLayer()]
'''

#: A layer that gets the interface wrong, each line marked ``# wrong`` where mypy must
#: say so.
BAD_LAYER = '''
    from typing import Any

    from daskgpu._dask.map_kernel.graphs.layer import GraphLayer


    class Half(GraphLayer):
        name = "half"

        def trim(self, result: Any) -> Any:  # wrong
            return result


    Half()  # wrong
'''


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory):
    """mypy over the programs, the public modules and the internal interfaces with their
    implementations, in one run: ``{file: [lines]}``."""
    pytest.importorskip("mypy")
    work = tmp_path_factory.mktemp("typing")
    (work / "good.py").write_text(textwrap.dedent(GOOD).lstrip())
    (work / "bad.py").write_text(textwrap.dedent(BAD).lstrip())
    (work / "layers.py").write_text(textwrap.dedent(LAYERS).lstrip())
    (work / "bad_layer.py").write_text(textwrap.dedent(BAD_LAYER).lstrip())
    interfaces = {m for pair in INTERFACES.items() for m in (pair[0], *pair[1])}
    modules = sorted((public_modules() - NOT_YET_TYPED) | interfaces)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    env["MYPYPATH"] = str(REPO)  # this checkout's daskgpu, whatever is installed
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(work / "cache"), "--no-error-summary", "--show-error-codes",
         "good.py", "bad.py", "layers.py", "bad_layer.py", *(str(_path(m)) for m in modules)],
        cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 2: mypy itself failed
    errors: dict[str, list[str]] = {}  # by file, as mypy names it
    for line in proc.stdout.splitlines():
        match = re.match(r"(.+?):(\d+): error: (.*)", line)
        if match:
            errors.setdefault(match[1], []).append(f"{match[2]}: {match[3]}")
    return errors, proc.stdout


def _implementations() -> set[str]:
    """The files of the interfaces' implementations, as mypy names them."""
    return {str(_path(m)) for ms in INTERFACES.values() for m in ms}


@pytest.mark.slow
def test_mypy_finds_nothing_in_a_users_program_or_the_public_modules(mypy_report):
    errors, out = mypy_report
    assert {f: e for f, e in errors.items()
            if f not in ("bad.py", "bad_layer.py") and f not in _implementations()} == {}, out


@pytest.mark.slow
def test_the_graph_layers_implement_their_interface(mypy_report):
    errors, out = mypy_report
    wrong = {f: [e for e in es if e.endswith("[override]")] for f, es in errors.items()
             if f in _implementations()}
    assert {f: e for f, e in wrong.items() if e} == {}, out


@pytest.mark.slow
def test_mypy_reports_a_layer_that_gets_the_interface_wrong(mypy_report):
    errors, out = mypy_report
    source = textwrap.dedent(BAD_LAYER).lstrip().splitlines()
    wrong = [str(i) for i, line in enumerate(source, 1) if line.endswith("# wrong")]
    reported = sorted({e.split(":")[0] for e in errors.get("bad_layer.py", [])}, key=int)
    assert reported == wrong, out


@pytest.mark.slow
def test_mypy_reports_each_misuse_of_the_api_and_nothing_else(mypy_report):
    errors, out = mypy_report
    source = textwrap.dedent(BAD).lstrip().splitlines()
    wrong = [str(i) for i, line in enumerate(source, 1) if line.endswith("# wrong")]
    reported = sorted({e.split(":")[0] for e in errors.get("bad.py", [])}, key=int)
    assert reported == wrong, out
