"""On a GPU: a damaged on-disk cubin is relinked and replaced, never loaded."""

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from daskgpu._cli.bench.kernels import saxpy
from daskgpu._runtime.gpu.cubin_cache import DiskCache

pytestmark = pytest.mark.gpu


@pytest.mark.slow
def test_a_truncated_or_corrupt_entry_is_relinked_and_replaced(tmp_path):
    blob = tmp_path / "launch.pkl"
    blob.write_bytes(pickle.dumps(saxpy.forall(16)))
    cubins = tmp_path / "cubins"
    script = textwrap.dedent(f"""
        import pickle, sys, numpy as np, dask
        sys.modules["numba"] = None
        with dask.config.set({{"daskgpu.cache-dir": {str(cubins)!r}}}):
            import daskgpu._runtime.gpu.linked_kernel as linked_kernel
            calls = []
            orig = linked_kernel.link_cubin
            linked_kernel.link_cubin = lambda *a: calls.append(1) or orig(*a)
            launch = pickle.load(open({str(blob)!r}, "rb"))
            x = np.ones(16, np.float32)
            assert (launch(np.zeros_like(x), 1.0, x, x) == 2).all()
            print("LINKED", len(calls))
    """)

    def run():
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "LINKED 1" in run()
    [name] = [n for n in os.listdir(cubins) if n.endswith(".cubin")]  # and the secret
    entry = cubins / name
    good = entry.read_bytes()
    assert "LINKED 0" in run()  # a whole entry is loaded
    # Torn in half, and its last bytes flipped (ELF files end in zero padding,
    # so overwriting them with zeros could change nothing).
    for damaged in (good[: len(good) // 2], good[:-7] + bytes(b ^ 0xFF for b in good[-7:])):
        entry.write_bytes(damaged)
        assert "LINKED 1" in run()  # relinked, not loaded
        assert "LINKED 0" in run()  # and replaced by a whole entry
    assert sorted(os.listdir(cubins)) == sorted([name, DiskCache.SECRET, DiskCache.LOCK])
