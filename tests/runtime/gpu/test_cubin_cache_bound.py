"""The disk cubin cache's size bound: other versions first, then least recently used.

DiskCache needs no GPU: the driver and nvJitLink versions are given, the cubins
are small fake ELF files.
"""

import multiprocessing
import os
import time
import warnings

import dask.config
import pytest

from daskgpu._runtime.gpu.cubin_cache import DiskCache

VERSIONS = ((12, 9), (12, 9))
OLD_VERSIONS = ((12, 4), (12, 4))  # a driver and nvJitLink since upgraded
CC = (9, 0)
# File timestamps are coarse (4 ms here): let each use be clearly later than the last.
TICK = 0.02


def _cubin(n: int, size: int = 1000) -> bytes:
    return b"\x7fELF" + n.to_bytes(4, "little") * ((size - 4) // 4)


def _total(disk) -> int:
    return sum(size for _, size, _ in disk.entries())


def _entry_size(tmp_path) -> int:
    """The bytes one entry of a :func:`_cubin` takes on disk (header and cubin)."""
    probe = DiskCache(str(tmp_path / "probe"))
    probe.store("probe", CC, VERSIONS, _cubin(0))
    return os.path.getsize(probe.path("probe", CC, VERSIONS))


def test_the_total_stays_within_the_bound(tmp_path):
    one = _entry_size(tmp_path)
    disk = DiskCache(str(tmp_path / "cubins"), max_bytes=10 * one + one // 2)
    for n in range(40):
        disk.store(f"img{n}", CC, VERSIONS, _cubin(n))
        assert _total(disk) <= disk.max_bytes
    assert len(disk.entries()) == 10
    # The ten latest stored are the ten kept, and they load.
    for n in range(30, 40):
        assert disk.load(f"img{n}", CC, VERSIONS) == _cubin(n)
    assert disk.load("img29", CC, VERSIONS) is None


def test_a_hit_makes_an_entry_the_last_to_be_evicted(tmp_path):
    one = _entry_size(tmp_path)
    disk = DiskCache(str(tmp_path / "cubins"), max_bytes=3 * one)
    for name in ("a", "b", "c"):
        disk.store(name, CC, VERSIONS, _cubin(ord(name)))
        time.sleep(TICK)
    assert disk.load("a", CC, VERSIONS) == _cubin(ord("a"))  # a: now the most recently used
    time.sleep(TICK)
    disk.store("d", CC, VERSIONS, _cubin(ord("d")))
    assert disk.load("b", CC, VERSIONS) is None  # the least recently used went
    for name in ("c", "a", "d"):
        time.sleep(TICK)
        assert disk.load(name, CC, VERSIONS) == _cubin(ord(name))
    time.sleep(TICK)
    disk.store("e", CC, VERSIONS, _cubin(ord("e")))  # c was used longest ago
    assert disk.load("c", CC, VERSIONS) is None
    assert {disk.load(n, CC, VERSIONS) for n in "ade"} == {_cubin(ord(n)) for n in "ade"}


def test_entries_of_other_tool_versions_go_first(tmp_path):
    one = _entry_size(tmp_path)
    disk = DiskCache(str(tmp_path / "cubins"), max_bytes=4 * one)
    disk.store("current-old", CC, VERSIONS, _cubin(1))
    time.sleep(TICK)
    # Written later, and used last, but for an older driver and nvJitLink.
    disk.store("stale", CC, OLD_VERSIONS, _cubin(2))
    disk.store("stale2", CC, OLD_VERSIONS, _cubin(3))
    time.sleep(TICK)
    # An entry named as caches before version tags named them: a key alone.
    legacy = os.path.join(disk.directory, "ab" * 32 + ".cubin")
    with open(disk.path("stale2", CC, OLD_VERSIONS), "rb") as f:
        with open(legacy, "wb") as g:
            g.write(f.read())
    time.sleep(TICK)
    assert disk.load("stale", CC, OLD_VERSIONS) == _cubin(2)
    disk.store("new", CC, VERSIONS, _cubin(4))  # needs one entry's room: the oldest
    assert disk.load("stale2", CC, OLD_VERSIONS) is None  # other versions', not current-old
    assert disk.load("stale", CC, OLD_VERSIONS) == _cubin(2)
    for n in (5, 6):  # two more
        disk.store(f"new{n}", CC, VERSIONS, _cubin(n))
    names = {name for name, _, _ in disk.entries()}
    assert names == {os.path.basename(disk.path(k, CC, VERSIONS))
                     for k in ("current-old", "new", "new5", "new6")}
    assert disk.load("current-old", CC, VERSIONS) == _cubin(1)
    assert _total(disk) <= disk.max_bytes


def test_an_entry_larger_than_the_bound_is_not_stored_and_warns(tmp_path):
    disk = DiskCache(str(tmp_path / "cubins"), max_bytes=2000)
    disk.store("small", CC, VERSIONS, _cubin(1, 500))
    with pytest.warns(RuntimeWarning, match=r"daskgpu.cache-bytes bounds the whole cache at "
                                            r"2000 bytes. Raise that setting"):
        disk.store("big", CC, VERSIONS, _cubin(2, 4000))
    assert disk.load("big", CC, VERSIONS) is None
    assert disk.load("small", CC, VERSIONS) == _cubin(1, 500)  # nothing evicted for it


def test_temporaries_secret_and_other_files_are_neither_counted_nor_removed(tmp_path):
    one = _entry_size(tmp_path)
    disk = DiskCache(str(tmp_path / "cubins"), max_bytes=2 * one)
    disk.store("a", CC, VERSIONS, _cubin(1))
    entry = os.path.basename(disk.path("b", CC, VERSIONS))
    # Another process's store in progress: large, but not an entry yet.
    busy = tmp_path / "cubins" / f".{entry}.4242-0123abcd.tmp"
    busy.write_bytes(b"\0" * 50 * one)
    # A crashed store's leftover, two hours old.
    stale = tmp_path / "cubins" / f".{entry}.4243-89abcdef.tmp"
    stale.write_bytes(b"\0" * one)
    os.utime(stale, (time.time() - 7200,) * 2)
    notes = tmp_path / "cubins" / "README"  # not a name entries have
    notes.write_bytes(b"\0" * 50 * one)
    disk.store("b", CC, VERSIONS, _cubin(2))
    assert disk.load("a", CC, VERSIONS) == _cubin(1)  # the temporaries did not push it out
    assert busy.exists() and notes.exists() and not stale.exists()
    assert (tmp_path / "cubins" / DiskCache.SECRET).exists()


def test_eviction_skips_files_that_vanish(tmp_path):
    one = _entry_size(tmp_path)
    disk = DiskCache(str(tmp_path / "cubins"), max_bytes=3 * one)
    for n in range(3):
        disk.store(f"img{n}", CC, VERSIONS, _cubin(n))
    names = disk.entries()
    # Another process evicted two of them after this one listed the directory.
    os.unlink(disk.path("img0", CC, VERSIONS))
    os.unlink(disk.path("img1", CC, VERSIONS))
    disk._scan = lambda stale_before: list(names)  # the listing this process had
    tag = os.path.basename(disk.path("x", CC, VERSIONS))[:16]
    assert disk.make_room(2 * one, tag) == 2 * one  # what vanished counts as freed
    assert disk.load("img2", CC, VERSIONS) == _cubin(2)


def test_the_bound_is_the_cache_bytes_setting(tmp_path):
    from daskgpu._runtime.gpu.linked_kernel import disk_cache

    with dask.config.set({"daskgpu.cache-dir": str(tmp_path), "daskgpu.cache-bytes": "3MiB"}):
        assert disk_cache().max_bytes == 3 << 20
    with dask.config.set({"daskgpu.cache-dir": str(tmp_path)}):
        assert disk_cache().max_bytes == 1 << 30  # the default: 1 GiB


# -- several processes sharing one directory ---------------------------------------------

def _store_many(directory, bound, worker, count, one, results):
    disk = DiskCache(directory, max_bytes=bound)
    worst, misses = 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed store would warn
        for n in range(count):
            if disk.load("hot", CC, VERSIONS) != _cubin(7):
                misses += 1
            disk.store(f"w{worker}-{n}", CC, VERSIONS, _cubin(worker * 100_000 + n))
            worst = max(worst, sum(size for _, size, _ in disk.entries()))
    results.put((worker, worst, misses))


def _storing_at_once(tmp_path, entries, processes, stores, timeout):
    """``processes`` processes each storing ``stores`` entries into one cache bounded at
    ``entries`` entries, which holds an entry "hot" they all load; the cache's folder,
    its bound, one entry's size and each process's ``(worker, worst, misses)``."""
    directory = str(tmp_path / "cubins")
    one = _entry_size(tmp_path)
    bound = entries * one
    DiskCache(directory, max_bytes=bound).store("hot", CC, VERSIONS, _cubin(7))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_store_many,
                               args=(directory, bound, w, stores, one, results))
               for w in range(1, processes + 1)]
    for w in workers:
        w.start()
    done = [results.get(timeout=timeout) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    return directory, bound, one, done


@pytest.mark.slow
def test_two_processes_storing_at_once_keep_the_bound_and_the_entry_in_use(tmp_path):
    directory, bound, one, done = _storing_at_once(tmp_path, 12, 2, 300, timeout=120)
    for worker, worst, misses in done:
        assert worst <= bound + one, (worker, worst, bound)  # at most the other's store over
        assert misses == 0, (worker, misses)  # the entry both use was never evicted
    disk = DiskCache(directory, max_bytes=bound)
    assert _total(disk) <= bound + one
    assert disk.load("hot", CC, VERSIONS) == _cubin(7)
    assert [n for n in os.listdir(directory) if n.endswith(".tmp")] == []


# -- on a GPU: what linked() stores stays within daskgpu.cache-bytes -----------------------

@pytest.mark.slow
@pytest.mark.gpu
def test_linked_kernels_on_disk_stay_within_the_setting(tmp_path):
    import pickle
    import subprocess
    import sys
    import textwrap

    import numpy as np

    from daskgpu._cli.bench.kernels import add, saxpy

    x = np.ones(16, np.float32)
    launches = {"saxpy": (saxpy.forall(16), (np.zeros_like(x), 1.0, x, x)),
                "add": (add.forall(16), (np.zeros_like(x), x, x))}
    blob = tmp_path / "launches.pkl"
    blob.write_bytes(pickle.dumps(launches))
    cubins = tmp_path / "cubins"

    def run(name, bound):
        script = textwrap.dedent(f"""
            import pickle, sys, dask
            sys.modules["numba"] = None
            with dask.config.set({{"daskgpu.cache-dir": {str(cubins)!r},
                                   "daskgpu.cache-bytes": {bound}}}):
                import daskgpu._runtime.gpu.linked_kernel as linked_kernel
                calls = []
                orig = linked_kernel.link_cubin
                linked_kernel.link_cubin = lambda *a: calls.append(1) or orig(*a)
                launch, args = pickle.load(open({str(blob)!r}, "rb"))[{name!r}]
                assert (launch(*args) == 2).all()
                print("LINKED", len(calls))
        """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def entries():
        return [p for p in cubins.iterdir() if p.suffix == ".cubin"]

    assert "LINKED 1" in run("saxpy", 1 << 30)
    [first] = entries()
    bound = first.stat().st_size * 3 // 2  # room for one entry, not two
    assert "LINKED 1" in run("add", bound)
    assert len(entries()) == 1 and sum(p.stat().st_size for p in entries()) <= bound
    assert "LINKED 0" in run("add", bound)  # the newer entry stayed
    assert "LINKED 1" in run("saxpy", bound)  # the older one was evicted


# -- the bound kept on load, and by processes storing at once ----------------------------

def test_a_cache_filled_under_a_larger_bound_comes_within_this_one_on_first_load(tmp_path):
    one = _entry_size(tmp_path)
    directory = str(tmp_path / "cubins")
    roomy = DiskCache(directory, max_bytes=10 * one)
    for n in range(10):
        roomy.store(f"img{n}", CC, VERSIONS, _cubin(n))
        time.sleep(TICK)
    disk = DiskCache(directory, max_bytes=2 * one + one // 2)  # the setting since lowered
    assert disk.load("img3", CC, VERSIONS) == _cubin(3)  # a hit: nothing stored
    assert _total(disk) <= disk.max_bytes  # it stayed ten times over while loads hit
    # The entry just used, and the most recently stored, are the two kept.
    assert disk.load("img3", CC, VERSIONS) == _cubin(3)
    assert disk.load("img9", CC, VERSIONS) == _cubin(9)
    assert disk.load("img8", CC, VERSIONS) is None


@pytest.mark.slow
def test_four_processes_storing_at_once_never_exceed_the_bound(tmp_path):
    directory, bound, one, done = _storing_at_once(tmp_path, 6, 4, 150, timeout=300)
    for worker, worst, _ in done:
        assert worst <= bound, (worker, worst - bound, one)  # went 3 entries over
    assert _total(DiskCache(directory, max_bytes=bound)) <= bound
    assert [n for n in os.listdir(directory) if n.endswith(".tmp")] == []
