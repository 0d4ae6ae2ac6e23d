"""The cluster ``daskgpu batch`` starts for itself admits only its own client and listens
on the loopback address only; ``daskgpu batch --scheduler tls://...`` connects with the
``--tls-*`` files, as ``dask worker`` takes them.

Simulated; the local cluster's workers are processes, as ``daskgpu batch`` starts them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import urllib.request

import numpy as np
import psutil
import pytest
from distributed import Client
from distributed.security import Security
from kit.batch import write_zarr
from kit.kernels import SAXPY_FILE, SAXPY_SIG

import daskgpu as dg
from daskgpu._cli.batch import main
from daskgpu._dask.batch import local_client

zarr = pytest.importorskip("zarr")


@pytest.fixture(scope="module")
def batch_cluster():
    """The client of the cluster a batch run starts for itself, and the cluster's processes."""
    with contextlib.ExitStack() as stack:
        client = local_client(stack, simulate=True)
        client.wait_for_workers(1, timeout=60)
        me = psutil.Process(os.getpid())
        yield client, [me, *me.children(recursive=True)]


def _refused(address, **kw):
    """Whether a client that connects to ``address`` as ``kw`` say is turned away."""
    for attempt in range(3):
        try:
            with Client(address, timeout="5s", **kw) as intruder:
                intruder.run(os.getpid)  # what an intruder would do: run code on the workers
        except (OSError, TimeoutError, TypeError, ValueError):
            return True
        except AssertionError:
            # distributed asserts that the client's IO loop thread started within 10 s,
            # which a loaded CI machine once missed: that says nothing about the
            # scheduler, so the client tries again.
            if attempt == 2:
                raise
            continue
        return False


@pytest.mark.slow
def test_only_the_runs_own_client_gets_in(batch_cluster):
    client, _ = batch_cluster
    address = client.scheduler.address
    assert address.startswith("tls://127.0.0.1:"), address
    assert client.run(os.getpid)  # the run's own client, with its credentials
    # No credentials, plain TCP to the same port, and credentials of another CA.
    assert _refused(address)
    assert _refused(address.replace("tls://", "tcp://"))
    assert _refused(address, security=Security.temporary())


@pytest.mark.slow
def test_nothing_listens_beyond_the_loopback_address(batch_cluster):
    client, processes = batch_cluster
    listening = {(p.pid, c.laddr.ip, c.laddr.port)
                 for p in processes if p.is_running()
                 for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    port = client.scheduler_info()["services"]["dashboard"]
    assert any(lport == port for _, _, lport in listening), listening  # the HTTP server
    wide = [entry for entry in listening if not ipaddress.ip_address(entry[1]).is_loopback]
    assert not wide, f"listening beyond loopback (pid, address, port): {wide}"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        assert r.read() == b"ok"  # served, on loopback


@pytest.mark.slow
def test_cli_connects_to_a_tls_scheduler_with_tls_files(tmp_path, capsys):
    credentials = Security.temporary()  # PEM text; written out as a site's files would be
    files = {}
    for option, pem in (("--tls-ca-file", credentials.tls_ca_file),
                        ("--tls-cert", credentials.tls_client_cert),
                        ("--tls-key", credentials.tls_client_key)):
        files[option] = tmp_path / f"{option.strip('-')}.pem"
        files[option].write_text(pem)
    x = np.arange(400, dtype=np.float32)
    inputs = [write_zarr(tmp_path / "x.zarr", x, 100), write_zarr(tmp_path / "y.zarr", x, 100)]
    kernel = tmp_path / "tlskern.py"
    kernel.write_text(SAXPY_FILE)
    out = tmp_path / "z.zarr"
    argv = [f"{kernel}:saxpy", "--sig", SAXPY_SIG, "--scalar", "float32:2", "--no-progress",
            "--simulate", "--input", inputs[0], "--input", inputs[1],
            "--output", f"{out}:float32"]
    with dg.LocalGPUCluster(simulate=True, processes=False, security=credentials,
                            dashboard_address=None) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        assert main([*argv, "--scheduler", address]) == 2  # no credentials given
        assert "speaks TLS" in capsys.readouterr().err
        tls = [a for option, path in files.items() for a in (option, str(path))]
        assert main([*argv, "--scheduler", address, *tls]) == 0, capsys.readouterr().err
    assert "4/4 chunks written" in capsys.readouterr().out
    np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[:], 3 * x)


def _tls_files(tmp_path):
    """A site's credential files: CA, certificate and key, and a key of another certificate."""
    ours, theirs = Security.temporary(), Security.temporary()
    files = {}
    for name, pem in (("ca.pem", ours.tls_ca_file), ("cert.pem", ours.tls_client_cert),
                      ("key.pem", ours.tls_client_key), ("other-key.pem", theirs.tls_client_key),
                      ("garbage.pem", "not a certificate\n")):
        files[name] = tmp_path / name
        files[name].write_text(pem)
    files["missing.pem"] = tmp_path / "missing.pem"
    files["a-directory"] = tmp_path / "a-directory"
    files["a-directory"].mkdir()
    return files


@pytest.mark.parametrize(("ca", "cert", "key", "expected"), [
    ("missing.pem", "cert.pem", "key.pem",
     "--tls-ca-file '{missing.pem}': cannot read it (No such file or directory); give a "
     "readable PEM file holding the scheduler's CA certificate(s)"),
    ("ca.pem", "a-directory", "key.pem",
     "--tls-cert '{a-directory}': cannot read it (Is a directory); give a readable PEM file "
     "holding this client's certificate"),
    ("ca.pem", "cert.pem", "other-key.pem",
     "--tls-key '{other-key.pem}' is not the key of --tls-cert '{cert.pem}': give the private "
     "key that belongs to that certificate"),
    ("ca.pem", "garbage.pem", "key.pem",
     "--tls-cert '{garbage.pem}': it holds no PEM certificate (NO_CERTIFICATE_OR_CRL_FOUND); "
     "give a readable PEM file holding this client's certificate"),
    ("ca.pem", "cert.pem", "garbage.pem",
     "--tls-key '{garbage.pem}': it holds no PEM private key; give a readable PEM file "
     "holding this client's private key"),
])
def test_tls_files_that_cannot_serve_are_refused_naming_flag_and_file(
        tmp_path, capsys, ca, cert, key, expected):
    files = _tls_files(tmp_path)
    argv = ["k.py:saxpy", "--input", "x.zarr", "--output", "z.zarr:float32",
            "--scheduler", "tls://127.0.0.1:1", "--tls-ca-file", str(files[ca]),
            "--tls-cert", str(files[cert]), "--tls-key", str(files[key])]
    assert main(argv) == 2  # the files cannot be used as given: a usage error
    message = expected
    for name, path in files.items():
        message = message.replace(f"{{{name}}}", str(path))
    assert capsys.readouterr().err == f"daskgpu batch: error: {message}\n"
