"""The worker half imports, unpickles, marshals and links with numba unimportable."""

import json
import pickle
import subprocess
import sys
import textwrap

import dask
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._runtime.gpu.driver import nvjitlink_version

# Read a setting with dask loaded, so daskgpu's defaults are registered before any
# dask.config.set below (see test_public_api.py::test_config_set_keeps_the_defaults).
dg._config.get("target-cc")


@dg.jit(["void(float32[::1], float32, float32[::1], float32[::1])",
         "void(float64[:], float64, float64[:], float64[:])"], targets=["7.5", "9.0"])
def saxpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a * x[i] + y[i]


WORKER = textwrap.dedent("""
    import importlib, json, pickle, pkgutil, sys
    sys.modules["numba"] = None  # before any import: numba cannot be imported

    import daskgpu, daskgpu._runtime.launch, daskgpu._image.image, daskgpu._image.argspec
    import daskgpu._runtime
    # Every module, in subpackages (the GPU backend) too, new ones too.
    for module in pkgutil.walk_packages(daskgpu._runtime.__path__, "daskgpu._runtime."):
        importlib.import_module(module.name)
    from daskgpu._runtime.gpu.marshal import ParamLayout

    launch = pickle.loads(sys.stdin.buffer.read())
    images = launch.kernel.images
    report = {
        "kernel": type(launch.kernel).__name__,
        "signatures": launch.kernel.signatures,
        "hashes": [im.hash for im in images],
        "writes": [list(im.writes) for im in images],
        "params": [len(ParamLayout(im.args).offsets) for im in images],
        "config": repr(launch.config),
    }
    if sys.argv[1] == "link":
        from daskgpu._runtime.gpu import linker
        # No driver on CI machines; nvJitLink alone links (see gpu/test_linker.py).
        linker.driver_version = lambda: (12, 9)
        report["cubin"] = linker.link_cubin(images[0], (9, 0))[:4].hex()
    report["numba"] = sorted(
        m for m, v in sys.modules.items() if m.startswith("numba") and v is not None)
    report["dask"] = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
    report["cuda.core"] = "cuda.core" in sys.modules
    report["imported"] = sorted(m for m in sys.modules if m.startswith("daskgpu._runtime."))
    print(json.dumps(report))
""")


def run_worker(launch, mode="plain"):
    proc = subprocess.run([sys.executable, "-c", WORKER, mode], input=pickle.dumps(launch),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report():
    return run_worker(saxpy.forall(1000))


@pytest.mark.slow
def test_no_numba_module_is_imported(report):
    assert report["numba"] == []


@pytest.mark.slow
def test_unpickled_launch_is_the_ptx_kernel(report):
    assert report["kernel"] == "PTXKernel"
    assert report["signatures"] == saxpy.signatures
    assert report["hashes"] == [im.hash for im in saxpy.images]
    assert report["writes"] == [[0], [0]]
    assert report["config"] == "LaunchConfig(ntasks=1000)"
    # Three 1-D arrays (7 PTX parameters each) and a scalar.
    assert report["params"] == [3 * 7 + 1, 3 * 7 + 1]


@pytest.mark.slow
def test_bare_worker_does_not_import_dask(report):
    # Unpickling and running a launch needs neither dask nor distributed.
    assert report["dask"] == []


@pytest.mark.slow
def test_simulated_launch_unpickles_without_numba():
    with dask.config.set({"daskgpu.simulate": True}):
        launch = saxpy[2, 32]
        out = run_worker(launch)
    assert out["numba"] == [] and out["kernel"] == "PTXKernel"
    assert out["hashes"] == [im.hash for im in saxpy.images]


@pytest.mark.slow
@pytest.mark.skipif(nvjitlink_version() is None, reason="needs nvJitLink")
def test_worker_half_links_without_numba():
    out = run_worker(saxpy[1, 32], "link")
    assert out["cubin"] == b"\x7fELF".hex()
    assert out["numba"] == []
    # nvJitLink is called directly: cuda.core's import was a quarter of a
    # fresh worker's time to its first result.
    assert out["cuda.core"] is False


@pytest.mark.slow
def test_no_runtime_module_imports_cuda_core(report):
    assert report["cuda.core"] is False


@pytest.mark.slow
@pytest.mark.gpu
def test_a_fresh_process_launches_without_cuda_core():
    code = textwrap.dedent('''
        import pickle, sys
        import numpy as np
        sys.modules["numba"] = None
        launch = pickle.loads(sys.stdin.buffer.read())
        x = np.arange(1000, dtype=np.float32)
        out = launch(np.empty_like(x), np.float32(2), x, x)
        assert (out == 3 * x).all(), out[:4]
        print("cuda.core" in sys.modules)
    ''')
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(saxpy.forall(1000)),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split() == ["False"]


@pytest.mark.slow
def test_every_runtime_module_imports_without_numba(report):
    # The walk above reaches the GPU backend's subpackage too, and the
    # simulator module imports numba only when it simulates.
    assert "daskgpu._runtime.gpu.run" in report["imported"]
    assert "daskgpu._runtime.gpu.fast_path" in report["imported"]
    assert "daskgpu._runtime.simulator" in report["imported"]
