"""What the batch tests share besides kernels (kit.kernels): stored inputs, snapshots of
a folder, and ``daskgpu batch`` of the affine kernel."""

import os

from kit.kernels import AFFINE_FILE, AFFINE_SIG


def write_zarr(path, data, chunks) -> str:
    """``data`` stored as a zarr array at ``path`` in ``chunks``; the path."""
    import zarr

    z = zarr.open_array(str(path), mode="w", shape=data.shape, chunks=chunks, dtype=data.dtype)
    z[...] = data
    return str(path)


def tree(path) -> dict:
    """Every file under ``path`` with its bytes: to show that nothing changed."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
    return out


def data_mtimes(path) -> dict:
    """Modification times of the data files of a zarr array at ``path``, its ledger left
    out: which chunks a run wrote again."""
    from daskgpu._dask.batch.ledger import LEDGER

    out = {}
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != LEDGER]
        for f in files:
            out[os.path.relpath(os.path.join(root, f), path)] = os.stat(
                os.path.join(root, f)).st_mtime_ns
    return out


def affine_cli(tmp_path, inputs, output, *extra) -> int:
    """``daskgpu batch`` of :data:`AFFINE_FILE` (written into ``tmp_path``) with scalar 2.0
    over ``inputs`` into ``output``; the exit status."""
    from daskgpu._cli.batch import main

    kernel = tmp_path / "affine_kernel.py"
    kernel.write_text(AFFINE_FILE)
    argv = [f"{kernel}:affine", "--sig", AFFINE_SIG, "--scalar", "2.0", "--no-progress"]
    for p in inputs:
        argv += ["--input", str(p)]
    return main(argv + ["--output", str(output), *extra])


def batch_without_a_cluster(argv):
    """``daskgpu batch argv`` in a subprocess where starting a ``LocalGPUCluster`` exits
    at once with "a cluster was started" (status 1): whether a run needed one. The
    completed process, its output as text."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        from daskgpu._dask import cluster

        def refuse(*args, **kwargs):
            raise SystemExit("a cluster was started")

        cluster.LocalGPUCluster.__init__ = refuse
        from daskgpu._cli.batch import main
        sys.exit(main({list(argv)!r}))
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
