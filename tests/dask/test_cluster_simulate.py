"""``daskgpu.simulate`` is not global state that one cluster flips for another.

A module of its own: no other cluster is open while these tests run.
"""

import dask
import numpy as np
import pytest
from distributed import Client
from numba import cuda

import daskgpu as dg
from daskgpu import _config
from daskgpu._runtime import backends


@dg.jit("void(float32[::1])")
def iota(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i


def _works(cluster):
    with Client(cluster, set_as_default=False) as client:
        x = np.zeros(8, np.float32)
        return bool((client.submit(iota.forall(8), x).result() == np.arange(8)).all())


def _simulated():
    return dg.LocalGPUCluster(simulate=True, processes=False, dashboard_address=":0")


@pytest.mark.slow
def test_two_simulated_clusters_each_keep_working_when_the_other_closes():
    with dask.config.set({"daskgpu.simulate": False}):
        first = _simulated()
        with _simulated() as second:
            assert _works(first) and _works(second)
            first.close()
            assert backends.current().simulated is True  # the second is still open
            assert _works(second)
        assert backends.current().simulated is False
        with _simulated() as third:
            fourth = _simulated()
            third.close()  # closed before the one opened after it
            assert _works(fourth)
            fourth.close()
        assert backends.current().simulated is False


@pytest.mark.slow
def test_the_setting_comes_back_when_the_last_simulated_cluster_closes():
    with dask.config.set({"daskgpu.simulate": False}):
        with _simulated() as c:
            assert c.simulated and backends.current().simulated is True
        assert backends.current().simulated is False


def test_a_bad_setting_stops_the_cluster_at_start_naming_it():
    import pytest

    with dask.config.set({"daskgpu.module-cache-size": "abc"}):
        with pytest.raises(_config.ConfigError, match="'module-cache-size' is 'abc'"):
            _simulated()


def test_a_bad_setting_fails_a_worker_plugin_at_setup():
    import pytest

    from daskgpu._dask.workers.plugin import GPUWorkerPlugin

    with dask.config.set({"daskgpu.simulate": True, "daskgpu.pinned-pool-bytes": -5}):
        with pytest.raises(_config.ConfigError, match="'pinned-pool-bytes' is -5"):
            GPUWorkerPlugin().setup(worker=None)


README_PATTERN = '''
import dask.config, psutil
import numpy as np
from distributed import Client
import daskgpu as dg
from numba import cuda

@dg.jit("void(float64[::1], float64[::1])")
def add_one(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1

if __name__ == "__main__":
    with dg.LocalGPUCluster(simulate=True) as cluster, Client(cluster) as client:
        x = np.arange(8.0)
        assert (client.submit(add_one.forall(8), x, np.zeros(8)).result() == x + 1).all()
    print("simulate:", dask.config.get("daskgpu.simulate"))
    left = [p.cmdline() for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]
    print("processes:", left)
'''


@pytest.mark.slow
def test_the_readme_cluster_pattern_closes_what_it_opens(tmp_path):
    # In a fresh process, as a user's script: the nanny processes are gone at the block's
    # end, the setting is as it was, and no worker had to be killed on the way out.
    import subprocess
    import sys

    script = tmp_path / "pattern.py"
    script.write_text(README_PATTERN)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "simulate: False" in done.stdout
    assert "processes: []" in done.stdout
    assert "still alive" not in done.stderr and "killing" not in done.stderr, done.stderr


KERNEL_MODULE = '''
from numba import cuda
import daskgpu as dg

@cuda.jit(device=True)
def value(i):
    return {device}

def fill(a):  # compiled by the caller: dg.jit(sig)(edited_kernel.fill), as batch does
    i = cuda.grid(1)
    if i < a.size:
        a[i] = value(i) + {kernel}
'''


@pytest.mark.slow
def test_a_long_lived_simulated_cluster_runs_the_edited_kernel(tmp_path, monkeypatch):
    # The workers import the kernel's module once; after an edit the client ships the new
    # image, and the workers must run its code, not their stale copy of the module.
    import importlib
    import sys

    (tmp_path / "edited_kernel.py").write_text(KERNEL_MODULE.format(device="i", kernel="0.0"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the workers can import it by name
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_kernel")
    try:
        with dg.LocalGPUCluster(simulate=True, devices=[0], dashboard_address=":0") as cluster, \
                Client(cluster, set_as_default=False) as client:
            x = np.zeros(4)
            fill = dg.jit("void(float64[::1])")(module.fill)
            first = client.submit(fill.forall(4), x).result()
            np.testing.assert_array_equal(first, np.arange(4.0))
            (tmp_path / "edited_kernel.py").write_text(
                KERNEL_MODULE.format(device="2 * i", kernel="100.0"))
            importlib.invalidate_caches()
            module = importlib.reload(module)
            fill = dg.jit("void(float64[::1])")(module.fill)
            second = client.submit(fill.forall(4), x).result()
            np.testing.assert_array_equal(second, 2 * np.arange(4.0) + 100)
    finally:
        sys.modules.pop("edited_kernel", None)
