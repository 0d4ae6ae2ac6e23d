"""The caches of linked kernels: ModuleCache in memory, DiskCache on disk."""

import os
import threading
import time

import pytest

from daskgpu._runtime.gpu.cubin_cache import DiskCache, ModuleCache

# -- ModuleCache -------------------------------------------------------------------------------


def test_maxsize_must_be_positive():
    with pytest.raises(ValueError, match="maxsize of at least 1, got 0"):
        ModuleCache(0)


def test_get_builds_once_per_key_and_counts_links():
    cache = ModuleCache(4)
    calls = []

    def build(value):
        def _build():
            calls.append(value)
            return value
        return _build

    a = cache.get(("h1", 0), build(object()))
    assert cache.get(("h1", 0), build("never")) is a
    b = cache.get(("h1", 1), build(object()))  # same image, another device
    assert b is not a
    assert len(calls) == 2 and cache.links == 2
    assert len(cache) == 2 and ("h1", 0) in cache and ("h2", 0) not in cache


def test_bound_evicts_the_least_recently_used():
    cache = ModuleCache(3)
    for k in range(3):
        cache.get(k, lambda k=k: f"v{k}")
    cache.get(0, lambda: "rebuilt")  # a hit makes 0 the most recently used
    cache.get(3, lambda: "v3")
    assert len(cache) == 3
    assert 1 not in cache and 0 in cache and 2 in cache and 3 in cache
    cache.get(4, lambda: "v4")
    assert 2 not in cache and 0 in cache
    assert cache.get(0, lambda: "rebuilt") == "v0"
    assert cache.get(1, lambda: "v1 again") == "v1 again"  # evicted: built anew
    assert cache.links == 6


def test_clear():
    cache = ModuleCache(8)
    for k in range(5):
        cache.get(k, lambda: object())
    cache.clear()
    assert len(cache) == 0 and 0 not in cache
    assert cache.get(0, lambda: "new") == "new"


def test_a_failed_build_stores_nothing():
    cache = ModuleCache(2)

    def fail():
        raise RuntimeError("link failed")

    with pytest.raises(RuntimeError, match="link failed"):
        cache.get("k", fail)
    assert "k" not in cache and cache.links == 0
    assert cache.get("k", lambda: "ok") == "ok"


def test_build_runs_once_per_key_under_threads():
    cache = ModuleCache(64)
    counts = {}
    counts_lock = threading.Lock()
    start = threading.Barrier(16)
    results = [[] for _ in range(16)]

    def build(key):
        def _build():
            with counts_lock:
                counts[key] = counts.get(key, 0) + 1
            time.sleep(0.01)  # a slow link: others arrive meanwhile
            return ("linked", key, object())
        return _build

    def worker(n):
        start.wait()
        for key in ("a", "b", "c", n % 4):
            results[n].append(cache.get(key, build(key)))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {"a": 1, "b": 1, "c": 1, 0: 1, 1: 1, 2: 1, 3: 1}
    assert cache.links == 7
    for key_index in range(3):
        assert len({id(r[key_index]) for r in results}) == 1
    for n in range(16):
        assert results[n][3] is results[n % 4][3]


# -- DiskCache -----------------------------------------------------------------------------------

ELF = b"\x7fELF"  # DiskCache.load serves only ELF files
VERSIONS = ((12, 9), (12, 9))


def test_store_load_round_trip(tmp_path):
    cache = DiskCache(str(tmp_path / "cubins"))
    assert cache.load("abc", (9, 0), VERSIONS) is None
    blob = b"\x7fELF" + bytes(range(256)) * 10
    cache.store("abc", (9, 0), VERSIONS, blob)
    assert cache.load("abc", (9, 0), VERSIONS) == blob
    # Another cache object on the same directory (another worker process) finds it.
    assert DiskCache(str(tmp_path / "cubins")).load("abc", (9, 0), VERSIONS) == blob
    cache.store("abc", (9, 0), VERSIONS, ELF + b"replaced")
    assert cache.load("abc", (9, 0), VERSIONS) == ELF + b"replaced"


def test_key_includes_hash_cc_and_versions(tmp_path):
    cache = DiskCache(str(tmp_path))
    base = cache.path("abc", (9, 0), VERSIONS)
    assert cache.path("abc", (9, 0), VERSIONS) == base
    others = {
        cache.path("abd", (9, 0), VERSIONS),
        cache.path("abc", (8, 0), VERSIONS),
        cache.path("abc", (9, 0), ((12, 9), (12, 8))),  # nvJitLink upgraded
        cache.path("abc", (9, 0), ((13, 0), (12, 9))),  # driver upgraded
        cache.path("abc", (9, 0), ((12, 9), None)),     # no nvJitLink
    }
    assert base not in others and len(others) == 5
    cache.store("abc", (9, 0), VERSIONS, b"old toolchain")
    assert cache.load("abc", (9, 0), ((12, 9), (12, 8))) is None
    assert cache.load("abc", (8, 0), VERSIONS) is None
    assert os.path.dirname(base) == str(tmp_path) and base.endswith(".cubin")


def test_directory_is_made_and_user_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cache = DiskCache("~/deep/cubins")
    assert cache.directory == str(tmp_path / "deep" / "cubins")
    cache.store("h", (7, 5), VERSIONS, b"x")
    assert (tmp_path / "deep" / "cubins").is_dir()


def test_what_is_not_a_cubin_loads_as_a_miss(tmp_path):
    cache = DiskCache(str(tmp_path))
    for junk in (b"", b"truncated", b"\x00" * 64):
        cache.store("h", (9, 0), VERSIONS, junk)
        assert cache.load("h", (9, 0), VERSIONS) is None


def test_store_leaves_no_temporary_files(tmp_path):
    cache = DiskCache(str(tmp_path))
    for i in range(5):
        cache.store(f"h{i}", (9, 0), VERSIONS, b"data" * i)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".cubin") == sorted(
        [DiskCache.SECRET, DiskCache.LOCK])
    assert len(list(tmp_path.glob("*.cubin"))) == 5


def test_failed_store_keeps_the_old_file_and_no_temporary(tmp_path):
    cache = DiskCache(str(tmp_path))
    cache.store("h", (9, 0), VERSIONS, ELF + b"good")

    # write() raises after the temporary file was made (as a full disk would).
    with pytest.raises(TypeError):
        cache.store("h", (9, 0), VERSIONS, object())
    assert cache.load("h", (9, 0), VERSIONS) == ELF + b"good"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        os.path.basename(cache.path("h", (9, 0), VERSIONS)), DiskCache.SECRET, DiskCache.LOCK])


def test_readers_never_see_half_a_cubin(tmp_path):
    cache = DiskCache(str(tmp_path))
    blobs = [ELF + bytes([n]) * (1 << 20) for n in range(1, 5)]
    stop = threading.Event()
    seen = set()
    bad = []

    def writer(blob):
        while not stop.is_set():
            cache.store("h", (9, 0), VERSIONS, blob)

    def reader():
        while not stop.is_set():
            data = cache.load("h", (9, 0), VERSIONS)
            if data is None:
                continue
            if data not in blobs:
                bad.append(len(data))
            else:
                seen.add(data[4])

    threads = [threading.Thread(target=writer, args=(b,)) for b in blobs]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert bad == []
    assert seen  # the readers did read


# -- DiskCache: entries checked before they are loaded ---------------------------------------
CUBIN = b"\x7fELF" + bytes(range(256)) * 40


@pytest.mark.parametrize("damage", [
    lambda b: b[: len(b) // 2],                      # torn: a crash mid-write, a partial copy
    lambda b: b[:-1],                                # one byte short
    lambda b: b[:-5] + b"XXXXX",                     # corrupt tail, length kept
    lambda b: CUBIN,                                 # an old, headerless entry
    lambda b: b"",
])
def test_a_damaged_entry_reads_as_missing_and_store_replaces_it(tmp_path, damage):
    disk = DiskCache(str(tmp_path))
    key = ("img", (9, 0), ("12.8", "12.9"))
    disk.store(*key, CUBIN)
    path = disk.path(*key)
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(damage(whole))
    assert disk.load(*key) is None
    disk.store(*key, CUBIN)  # what linked() does after relinking
    assert disk.load(*key) == CUBIN
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
