"""The public surface: ``daskgpu.__all__``, lazy imports, errors and settings."""

import importlib
import subprocess
import sys
import textwrap
import types

import pytest

import daskgpu


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode().strip()


def test_all_is_sorted_and_unique():
    assert daskgpu.__all__ == sorted(daskgpu.__all__)
    assert len(set(daskgpu.__all__)) == len(daskgpu.__all__)


@pytest.mark.parametrize("name", daskgpu.__all__)
def test_every_name_resolves(name):
    value = getattr(daskgpu, name)
    assert value is not None
    if name != "__version__":
        # Public objects come from daskgpu's private modules, documented.
        assert value.__module__.startswith("daskgpu")
        assert value.__doc__, f"{name} has no docstring"


def test_all_is_in_dir():
    assert set(daskgpu.__all__) <= set(dir(daskgpu))


def test_public_names_in_dir_are_all():
    public = {n for n in dir(daskgpu) if not n.startswith("_")}
    assert public == set(daskgpu.__all__) - {"__version__"}


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="module 'daskgpu' has no attribute 'nope'"):
        daskgpu.nope  # noqa: B018


def test_version_matches_the_package_metadata():
    from importlib.metadata import version

    assert daskgpu.__version__ == version("daskgpu")


def test_errors_derive_from_one_root():
    errors = ["BatchError", "BundleError", "CompileError", "DeviceError", "LaunchConfigError", "LinkError",
              "PTXVersionError", "PicklingError"]
    for name in errors:
        assert issubclass(getattr(daskgpu, name), daskgpu.DaskGPUError)
    assert issubclass(daskgpu.PTXVersionError, daskgpu.LinkError)
    # Where Python has a natural base, the error is one too.
    assert issubclass(daskgpu.LaunchConfigError, ValueError)
    assert issubclass(daskgpu.PicklingError, TypeError)


@pytest.mark.slow
def test_import_daskgpu_imports_neither_numba_nor_distributed():
    out = run_python("""
        import sys
        import daskgpu
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("numba", "numba_cuda", "distributed")))
    """)
    assert out == "[]"


@pytest.mark.slow
def test_lazy_names_load_their_module_on_first_use():
    out = run_python("""
        import sys
        import daskgpu
        before = "daskgpu._compiler.kernel" in sys.modules, "numba" in sys.modules
        daskgpu.jit
        after = "daskgpu._compiler.kernel" in sys.modules, "numba" in sys.modules
        print(before, after)
    """)
    assert out == "(False, False) (True, True)"


def test_private_modules_are_modules():
    for name in ("_image.argspec", "_image.image", "_image.launch_config", "_runtime.launch",
                 "_compiler.kernel", "_runtime.simulator", "_errors", "_config", "_files"):
        assert isinstance(importlib.import_module(f"daskgpu.{name}"), types.ModuleType)


# -- settings --------------------------------------------------------------------------------------


def test_config_defaults():
    import dask

    daskgpu._config.get("simulate")  # registers the defaults with dask loaded
    assert dask.config.get("daskgpu.simulate") is False
    assert dask.config.get("daskgpu.target-cc") == "7.5"
    assert daskgpu._runtime.backends.current().simulated is False


@pytest.mark.slow
def test_config_set_keeps_the_defaults():
    out = run_python("""
        import daskgpu as dg
        from daskgpu import _config
        import dask
        with dask.config.set({"daskgpu.simulate": True}):
            inside = _config.flag("simulate")
        print(inside, _config.get("simulate"), _config.get("target-cc"))
    """)
    assert out == "True False 7.5"


@pytest.mark.slow
def test_config_set_with_dask_imported_first():
    out = run_python("""
        import dask
        import daskgpu as dg
        from daskgpu import _config
        with dask.config.set({"daskgpu.simulate": True, "daskgpu.target-cc": "9.0"}):
            inside = _config.flag("simulate"), _config.get("target-cc")
        print(inside, _config.get("simulate"), _config.get("target-cc"))
    """)
    assert out == "(True, '9.0') False 7.5"
