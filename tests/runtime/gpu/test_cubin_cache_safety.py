"""The on-disk cubin cache cannot be turned against its user.

It loads only entries it wrote (an HMAC keyed by a per-user secret), reads only
regular files of its own without blocking and within a size bound, uses only a
directory that is the user's and writable by no one else, and never fails a
launch because the disk refuses a store.
"""

import hashlib
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import warnings

import dask
import pytest

from daskgpu._runtime.gpu.cubin_cache import DiskCache

CUBIN = b"\x7fELF" + bytes(range(256)) * 40
KEY = ("img", (9, 0), ((12, 9), (12, 9)))
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _fresh(tmp_path, name="cubins"):
    return DiskCache(str(tmp_path / name))


def _load_within(disk, seconds=5.0):
    """``disk.load(*KEY)`` in a thread; fails the test if it has not returned in time."""
    result = []
    thread = threading.Thread(target=lambda: result.append(disk.load(*KEY)), daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"load blocked for over {seconds} s"
    return result[0], time.perf_counter() - start


# -- planted entries ------------------------------------------------------------------------


@pytest.mark.parametrize("header", [
    # the old self-certifying format: a sha256 anyone can compute
    lambda c: b"daskgpu-cubin-1\n" + f"{len(c)} {hashlib.sha256(c).hexdigest()}\n".encode(),
    # today's format, with a sha256 (or any other guess) where the HMAC goes
    lambda c: DiskCache.MAGIC + f"{len(c)} {hashlib.sha256(c).hexdigest()}\n".encode(),
], ids=["old-format", "sha256-for-hmac"])
def test_a_planted_entry_is_a_miss_and_is_replaced(tmp_path, header):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)  # the directory and its secret exist
    evil = b"\x7fELF" + b"evil code" * 100
    with open(disk.path(*KEY), "wb") as f:
        f.write(header(evil) + evil)
    assert disk.load(*KEY) is None
    disk.store(*KEY, CUBIN)  # what linked() does after relinking
    assert disk.load(*KEY) == CUBIN


def test_an_entry_moved_to_another_key_is_a_miss(tmp_path):
    disk = _fresh(tmp_path)
    other = ("other-image", (9, 0), KEY[2])
    disk.store(*other, b"\x7fELF other kernel")
    os.replace(disk.path(*other), disk.path(*KEY))  # authentic, but for another image
    assert disk.load(*KEY) is None


def test_entries_of_another_cache_are_not_trusted(tmp_path):
    mine, theirs = _fresh(tmp_path, "mine"), _fresh(tmp_path, "theirs")
    mine.store(*KEY, CUBIN)
    theirs.store(*KEY, b"\x7fELF their code")
    os.replace(theirs.path(*KEY), mine.path(*KEY))  # another secret signed it
    assert mine.load(*KEY) is None


def test_directory_is_private_and_the_secret_is_too(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    assert stat.S_IMODE(os.stat(disk.directory).st_mode) == 0o700
    secret = os.path.join(disk.directory, DiskCache.SECRET)
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(disk.path(*KEY)).st_mode) == 0o600
    # Another process (another object) reads the same secret, so shares the entries.
    assert _fresh(tmp_path).load(*KEY) == CUBIN


def test_processes_starting_at_once_agree_on_one_secret(tmp_path):
    caches = [_fresh(tmp_path) for _ in range(8)]
    start = threading.Barrier(len(caches))

    def first_use(disk):
        start.wait()
        disk.load(*KEY)

    threads = [threading.Thread(target=first_use, args=(d,)) for d in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [secret] = [n for n in os.listdir(tmp_path / "cubins") if n == DiskCache.SECRET]
    caches[3].store(*KEY, CUBIN)
    assert all(d.load(*KEY) == CUBIN for d in caches)
    assert [n for n in os.listdir(tmp_path / "cubins") if n.endswith(".tmp")] == []


def test_an_entry_others_may_write_is_a_miss(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.chmod(disk.path(*KEY), 0o666)
    assert disk.load(*KEY) is None


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to another user needs root")
def test_an_entry_of_another_user_is_a_miss(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.chown(disk.path(*KEY), 65534, 65534)
    assert disk.load(*KEY) is None


def test_a_link_at_an_entry_path_is_not_followed(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    real = tmp_path / "elsewhere.cubin"
    os.replace(disk.path(*KEY), real)
    os.symlink(real, disk.path(*KEY))
    assert disk.load(*KEY) is None


# -- reads that never block and never fill memory ------------------------------------------


def test_a_fifo_at_an_entry_path_returns_at_once(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.unlink(disk.path(*KEY))
    os.mkfifo(disk.path(*KEY))
    cubin, seconds = _load_within(disk)
    assert cubin is None and seconds < 1.0
    disk.store(*KEY, CUBIN)  # the FIFO is replaced by a whole entry
    assert disk.load(*KEY) == CUBIN


def test_a_link_to_dev_zero_is_a_miss_unread(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.unlink(disk.path(*KEY))
    os.symlink("/dev/zero", disk.path(*KEY))
    cubin, seconds = _load_within(disk)
    assert cubin is None and seconds < 1.0


@pytest.mark.parametrize("mib", [192, 300])  # within the bound, and past it
def test_a_huge_sparse_file_is_a_miss_without_reading_it(tmp_path, mib):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    with open(disk.path(*KEY), "r+b") as f:
        f.truncate(mib << 20)  # the header stays, its length no longer fits the file
    tracemalloc.start()
    try:
        cubin, seconds = _load_within(disk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cubin is None and seconds < 1.0
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse a {mib} MiB entry"


def test_a_sparse_file_of_zeros_is_a_miss_without_reading_it(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.unlink(disk.path(*KEY))
    with open(disk.path(*KEY), "wb") as f:
        f.truncate(192 << 20)
    tracemalloc.start()
    try:
        assert disk.load(*KEY) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# -- directories that cannot be trusted: the cache is off, with one warning ------------------


def _off_with_one_warning(disk, *needles):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            assert disk.load(*KEY) is None
            disk.store(*KEY, CUBIN)
    messages = [str(w.message) for w in seen]
    assert len(messages) == 1, messages
    assert disk.directory in messages[0] and "linked in memory" in messages[0]
    for needle in needles:
        assert needle in messages[0]
    return messages[0]


def test_a_world_writable_directory_is_not_used(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    disk = DiskCache(str(folder))
    _off_with_one_warning(disk, "mode 0o777", "chmod go-w")
    assert os.listdir(folder) == []  # nothing stored there, not even the secret


def test_a_directory_opened_up_later_is_not_trusted(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.chmod(disk.directory, 0o775)  # group-writable: anyone in the group can plant
    _off_with_one_warning(_fresh(tmp_path), "mode 0o775")


@pytest.mark.skipif(not IS_ROOT, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_not_used(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    _off_with_one_warning(DiskCache(str(folder)), "owned by uid 65534")


def test_a_secret_others_may_read_turns_the_cache_off(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.chmod(os.path.join(disk.directory, DiskCache.SECRET), 0o644)
    _off_with_one_warning(_fresh(tmp_path), DiskCache.SECRET, "remove that file")


# -- a failed store never fails a launch ------------------------------------------------------


def test_a_cache_dir_that_is_a_file_is_off_and_store_does_not_raise(tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_bytes(b"some file")
    _off_with_one_warning(DiskCache(str(path)), "cannot be made")
    assert path.read_bytes() == b"some file"


def test_a_store_the_filesystem_refuses_warns_once(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    other = ("other", (9, 0), KEY[2])
    os.makedirs(os.path.join(disk.path(*other), "inside"))  # rename onto it fails
    with pytest.warns(RuntimeWarning, match="could not store a linked kernel") as seen:
        disk.store(*other, CUBIN)
        disk.store(*other, CUBIN)
    assert len(seen) == 1 and disk.directory in str(seen[0].message)
    assert disk.load(*other) is None and disk.load(*KEY) == CUBIN  # loads go on
    assert [n for n in os.listdir(disk.directory) if n.endswith(".tmp")] == []


@pytest.mark.skipif(IS_ROOT, reason="root writes into read-only directories")
def test_a_read_only_directory_never_raises(tmp_path):
    disk = _fresh(tmp_path)
    disk.store(*KEY, CUBIN)
    os.chmod(disk.directory, 0o500)
    try:
        with pytest.warns(RuntimeWarning, match="could not store"):
            disk.store("another", (9, 0), KEY[2], CUBIN)
        assert disk.load(*KEY) == CUBIN
        fresh = DiskCache(str(tmp_path / "new"))
        os.chmod(tmp_path, 0o500)
        with pytest.warns(RuntimeWarning, match="cannot be made"):
            fresh.store(*KEY, CUBIN)
    finally:
        os.chmod(tmp_path, 0o700)
        os.chmod(disk.directory, 0o700)


# -- the runtime's view: one cache object, so one warning, per directory ---------------------


def test_the_runtime_checks_each_directory_once(tmp_path):
    from daskgpu._runtime.gpu.linked_kernel import disk_cache

    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with dask.config.set({"daskgpu.cache-dir": str(folder)}):
        assert disk_cache() is disk_cache()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):
                assert disk_cache().load(*KEY) is None
    assert len(seen) == 1
    with dask.config.set({"daskgpu.cache-dir": None}):
        assert disk_cache() is None


# -- on a GPU: launches go on whatever the cache directory holds -----------------------------


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("plant", ["fifo", "dir-is-file", "world-writable", "forged"])
def test_a_launch_succeeds_whatever_is_at_the_cache(tmp_path, plant):
    from daskgpu._cli.bench.kernels import saxpy

    blob = tmp_path / "launch.pkl"
    blob.write_bytes(pickle.dumps(saxpy.forall(16)))
    cubins = tmp_path / "cubins"
    script = textwrap.dedent(f"""
        import hashlib, os, pickle, sys, warnings, numpy as np, dask
        sys.modules["numba"] = None
        from daskgpu._runtime.gpu import device
        from daskgpu._runtime.gpu.cubin_cache import DiskCache
        from daskgpu._runtime.gpu.driver import driver_version, nvjitlink_version
        launch = pickle.load(open({str(blob)!r}, "rb"))
        cubins, plant = {str(cubins)!r}, {plant!r}
        if plant == "dir-is-file":
            open(cubins, "w").close()
        elif plant == "world-writable":
            os.mkdir(cubins); os.chmod(cubins, 0o777)
        else:
            os.mkdir(cubins, 0o700)
        with dask.config.set({{"daskgpu.cache-dir": cubins}}):
            if plant in ("fifo", "forged"):
                disk = DiskCache(cubins)
                versions = (driver_version(), nvjitlink_version())
                cc = device.current().cc
                for image_hash in {[im.hash for im in saxpy.images]!r}:
                    path = disk.path(image_hash, cc, versions)
                    if plant == "fifo":
                        os.mkfifo(path)
                    else:
                        junk = b"\\x7fELF" + b"\\0" * 64
                        head = f"{{len(junk)}} {{hashlib.sha256(junk).hexdigest()}}\\n"
                        open(path, "wb").write(DiskCache.MAGIC + head.encode() + junk)
            x = np.ones(16, np.float32)
            try:
                right = (launch(np.zeros_like(x), 1.0, x, x) == 2).all()
            except Exception as exc:
                print(type(exc).__name__, exc)
            else:
                print("OK" if right else "WRONG")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    if plant == "dir-is-file":  # the settings check refuses it, naming it, before any link
        assert done.stdout.startswith("ConfigError") and "cache-dir" in done.stdout
    else:
        assert "OK" in done.stdout, done.stdout
