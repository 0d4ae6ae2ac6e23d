"""A release a user can trust: the built wheel installs and runs outside the checkout.

``python -m build`` makes the sdist from a clean copy of the source tree, then
the wheel from the unpacked sdist, so a file the sdist lacks is missing from
the wheel too. The wheel goes into a fresh virtual environment that sees this
interpreter's packages, whether it runs in a virtual environment or not
(installing numba-cuda's CUDA wheels anew would take minutes), but not the
checkout: the tests prove that environment imports daskgpu from the wheel,
then run ``daskgpu info`` and ``daskgpu demo`` there from a directory of their
own (simulated where there is no GPU).
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "daskgpu"


def _source_files() -> list[str]:
    """The source tree's files as a commit would take them (tracked or not ignored)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the release check copies the files git tracks; this is no git checkout")
    return sorted(f for f in out.decode().split("\0") if f and (REPO / f).is_file())


def _package_files() -> set[str]:
    """The package's own files in the source tree: what the wheel must carry."""
    return {f for f in _source_files()
            if f.startswith(f"{PACKAGE}/") and "__pycache__" not in f}


def _clean_env() -> dict:
    # Nothing that points Python at the checkout or switches Numba to its simulator.
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NUMBA_ENABLE_CUDASIM",
            "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(wheel, sdist, seconds)`` built from a clean copy of the source tree.

    A copy, so that no stale ``*.egg-info`` of an editable install in the
    checkout (setuptools reads its file list) leaks files into the sdist.
    """
    pytest.importorskip("build")  # the test extra's
    source = tmp_path_factory.mktemp("source")
    for name in _source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
                          capture_output=True, text=True, timeout=600, env=_clean_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # setuptools turns its deprecations into errors on a date it names: see them here first.
    assert "DeprecationWarning" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    (wheel,) = dist.glob(f"{PACKAGE}-*.whl")
    (sdist,) = dist.glob(f"{PACKAGE}-*.tar.gz")
    return wheel, sdist, time.perf_counter() - start


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """A fresh virtual environment with the wheel installed, and its interpreter."""
    wheel, _, _ = built
    root = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120, env=_clean_env())
    python = root / "bin" / "python"
    _see_these_packages(python)
    # This interpreter's pip installs into the venv: no pip of its own to bootstrap.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--no-compile", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=300, env=_clean_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return root, python


def _see_these_packages(python) -> None:
    """Have the venv of ``python`` see this interpreter's packages, after its own.

    ``venv --system-site-packages`` shows the base Python's, which inside a
    virtual environment (where the README's commands are mostly run) are not the
    ones installed. This environment's prefixes and site directories are added
    instead, by a ``.pth`` file, as that option adds the base Python's: their own
    ``.pth`` files are read, and ``site.getsitepackages()`` names them (where
    cuda-pathfinder looks for the CUDA libraries the ``cu12`` extra installs).
    """
    import site

    prefixes = list(site.PREFIXES)
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                          "'purelib'))"], capture_output=True, text=True, check=True,
                         timeout=60, env=_clean_env()).stdout.strip()
    # One line, run by exec: names set on it are not seen inside a comprehension.
    line = f"import site; site.PREFIXES.extend({prefixes!r}); list(map(site.addsitedir, {dirs!r}))"
    pathlib.Path(own, "_daskgpu_release_test.pth").write_text(line + "\n")


def _run(args, cwd, timeout=300):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_clean_env())


def test_the_wheel_carries_every_file_of_the_package(built):
    wheel, _, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    in_wheel = {n for n in names if n.startswith(f"{PACKAGE}/")}
    source = _package_files()
    assert {f"{PACKAGE}/daskgpu.yaml", f"{PACKAGE}/py.typed"} <= source
    # Nothing missing (the settings file, the typing marker, any module) and nothing
    # foreign (tests, byte code, build leftovers).
    assert sorted(source - in_wheel) == [], "files of the package missing from the wheel"
    assert sorted(in_wheel - source) == [], "files in the wheel that are not the package's"
    # The command line is installed with it.
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as zf:
        assert "daskgpu = daskgpu._cli.main:main" in zf.read(entry_points).decode()


def test_the_sdist_carries_the_package_and_its_build_files(built):
    _, sdist, _ = built
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        names = {n.removeprefix(f"{top}/") for n in tf.getnames()}
    missing = (_package_files() | {"pyproject.toml", "README.md"}) - names
    assert sorted(missing) == []


def test_the_venv_imports_daskgpu_from_the_wheel_not_the_checkout(venv, tmp_path):
    root, python = venv
    proc = _run([str(python), "-c",
                 "import daskgpu, daskgpu._config as c, os;"
                 "print(os.path.realpath(daskgpu.__file__));"
                 "print(os.path.realpath(c._FN), os.path.isfile(c._FN));"
                 "print(sorted(os.listdir(os.path.dirname(daskgpu.__file__))))"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    module, settings, listing = proc.stdout.strip().splitlines()
    site = os.path.realpath(root)
    assert module.startswith(site + os.sep), f"daskgpu imported from {module}, not {site}"
    assert not module.startswith(str(REPO.resolve()) + os.sep)
    # The settings it reads at import, from beside the installed package, and the marker.
    assert settings == f"{os.path.join(os.path.dirname(module), 'daskgpu.yaml')} True"
    assert {"daskgpu.yaml", "py.typed"} <= set(ast.literal_eval(listing))


def test_the_venv_sees_the_packages_of_the_environment_running_the_tests(venv, tmp_path):
    # Inside a virtual environment, --system-site-packages showed the base Python's
    # packages instead (none, for a bare Python: "No module named 'dask'"), or other
    # copies of them.
    import dask
    import numpy

    _, python = venv
    proc = _run([str(python), "-c", "import dask, numpy; print(dask.__file__); "
                 "print(numpy.__file__)"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [dask.__file__, numpy.__file__]


def test_the_installed_command_runs_info_and_demo_outside_the_checkout(venv, tmp_path):
    root, python = venv
    script = root / "bin" / "daskgpu"
    # The console script runs the venv's interpreter, whose daskgpu is the wheel's.
    assert script.read_text().splitlines()[0] == f"#!{python}"

    info = _run([str(script), "info"], cwd=tmp_path, timeout=120)
    assert info.returncode == 0, info.stdout + info.stderr
    assert info.stdout.startswith("daskgpu "), info.stdout

    start = time.perf_counter()
    demo = _run([str(script), "demo"], cwd=tmp_path)
    seconds = time.perf_counter() - start
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "saxpy over" in demo.stdout and demo.stdout.rstrip().endswith("OK"), demo.stdout
    print(f"daskgpu demo from the wheel: {seconds:.1f} s")
