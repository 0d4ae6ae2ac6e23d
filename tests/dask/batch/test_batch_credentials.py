"""The credentials of the cluster ``daskgpu batch`` starts for itself need ``cryptography``
(the ``batch`` extra); without it the run is refused in one line, never started open.

A module of its own: the run must find no client of another test's cluster to join.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from kit.kernels import SAXPY_FILE, SAXPY_SIG

import daskgpu as dg
from daskgpu._cli.batch import main

pytest.importorskip("zarr")


def test_without_cryptography_the_local_cluster_is_refused_in_one_line(tmp_path, capsys,
                                                                      monkeypatch):
    # Found on a GPU machine without the package: a 48-line traceback, where the run's
    # own cluster cannot be secured. It is refused, never started open.
    monkeypatch.setitem(sys.modules, "cryptography", None)  # as if not installed
    with pytest.raises(ImportError, match=r"needs the 'cryptography' package: pip install "
                                          r"'daskgpu\[batch\]'"):
        dg.LocalGPUCluster(simulate=True, processes=False, security=True)
    x = np.arange(40, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    kernel = tmp_path / "nocrypto.py"
    kernel.write_text(SAXPY_FILE)
    out = tmp_path / "z.zarr"
    code = main([f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", "float32:2", "--simulate",
                 "--no-progress", "--input", str(tmp_path / "x.npy"),
                 "--input", str(tmp_path / "x.npy"), "--output", f"{out}:float32"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [
        "daskgpu batch: error: security=True makes temporary TLS credentials, which needs the "
        "'cryptography' package: pip install 'daskgpu[batch]' (or cryptography), or pass a "
        "distributed.Security of your own"]
    assert not list(tmp_path.glob("*lock*")), "the output's lock was left behind"
