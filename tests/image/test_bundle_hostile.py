"""Hostile bundles: whatever a file holds, loading it ends in BundleError (or a
kernel), within time linear in its size, before any hash is checked."""

import json
import os
import random
import re
import threading
import time

import pytest

import daskgpu as dg
from daskgpu import BundleError
from daskgpu._image.bundle import MAX_BYTES, decode_bundle, document, integrity

KEY = b"team-key"


def _write(tmp_path, data: bytes, name="hostile.dgk"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _load_timed(path, key=None) -> tuple:
    """``(the BundleError, seconds)`` of loading ``path``; fails on any other outcome."""
    start = time.perf_counter()
    with pytest.raises(BundleError) as err:
        dg.load(path, key=key)
    return err.value, time.perf_counter() - start


# -- linear time, bounded size -------------------------------------------------------
QUOTE_RUNS = {
    "escaped quotes, 80 KB": b'\\"' * 40_000,
    "escaped quotes, 4 MB": b'\\"' * 2_000_000,
    "an open string of escaped quotes": b'{"format": "daskgpu-bundle", "x": "' + b'\\"' * 400_000,
    "quotes and escaped quotes": b'"\\"' * 300_000,
    "backslashes": b"\\" * 1_000_001,
}


@pytest.mark.parametrize("case", sorted(QUOTE_RUNS))
@pytest.mark.parametrize("key", [None, KEY])
def test_quote_runs_are_refused_in_linear_time(tmp_path, case, key):
    # The depth scan retried an unterminated string at every later quote: 80 KB took 71 s,
    # and it runs before the HMAC check, so a key did not help.
    _, seconds = _load_timed(_write(tmp_path, QUOTE_RUNS[case]), key)
    assert seconds < 2


def test_a_file_of_max_bytes_is_scanned_in_linear_time(tmp_path):
    small = _write(tmp_path, b'"\\"[' * (1 << 18), "small.dgk")
    large = _write(tmp_path, b'"\\"[' * (MAX_BYTES // 4), "large.dgk")
    _, t_small = _load_timed(small)
    _, t_large = _load_timed(large)
    assert t_large < 64 * t_small + 1  # 64 times the bytes: linear, with room for noise


def test_a_file_over_max_bytes_is_refused_unread(tmp_path):
    path = tmp_path / "big.dgk"
    with open(path, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: nothing to read, only a size
    err, seconds = _load_timed(path)
    assert "more than a kernel bundle may be" in str(err) and seconds < 1


def test_bytes_given_directly_are_bounded_too(monkeypatch):
    monkeypatch.setattr(document, "MAX_BYTES", 10)
    with pytest.raises(BundleError, match="more than a kernel bundle may be"):
        decode_bundle(b"[" + b" " * 20 + b"]", "<memory>")


# -- the depth scan: exact for JSON, across its chunks ----------------------------------
def test_brackets_in_strings_do_not_count_across_scan_chunks(tmp_path):
    # A string longer than a chunk of the scan, holding brackets and escaped quotes.
    text = b"[" * (3 << 20) + b'\\"]]\\\\'
    err, _ = _load_timed(_write(tmp_path, b'{"format": "daskgpu-bundle", "x": "' + text + b'"}'))
    assert "nests" not in str(err)


@pytest.mark.parametrize("lead", [0, (1 << 20) - 8])  # within a chunk, and across two
def test_nesting_is_counted_across_scan_chunks(tmp_path, lead):
    data = b" " * lead + b'["\\\\", ' + b"[" * 17 + b"]" * 18
    err, _ = _load_timed(_write(tmp_path, data))
    assert "nests JSON more than 16 levels deep" in str(err)
    ok = b" " * lead + b'["\\\\", ' + b"[" * 15 + b"]" * 16  # 16 deep: the parser's business
    err, _ = _load_timed(_write(tmp_path, ok))
    assert "nests" not in str(err)


# -- only regular files, opened without blocking --------------------------------------
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.dgk"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_load_timed(fifo)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # the old open blocked for a writer: give it one, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("loading a FIFO blocked")
    assert "not a regular file" in str(outcome[0][0])


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_unread(path):
    if not os.path.exists(path):
        pytest.skip(f"no {path} here")
    err, seconds = _load_timed(path)
    assert "not a regular file" in str(err) and seconds < 1


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(BundleError, match="is a directory, not a kernel bundle file"):
        dg.load(tmp_path)


# -- every malformed bundle: BundleError, nothing else ----------------------------------
@pytest.fixture(scope="module")
def raw_bundles(tmp_path_factory, bundle_kernels):
    """The bytes of a small real bundle, unsigned and signed with :data:`KEY`."""
    out = {}
    for key in (None, KEY):
        path = tmp_path_factory.mktemp("fuzz") / "fill.dgk"
        dg.save(bundle_kernels.fill, path, key=key)
        out[key] = path.read_bytes()
    return out


def _decode(raw: bytes, key):
    """Decode ``raw`` as :func:`dg.load` does; BundleError and success are the outcomes."""
    try:
        return decode_bundle(raw, "<fuzz>", key)
    except BundleError:
        return None


HOSTILE_TOKENS = [b"\\ud800", b"\\udfff", b"1e999", b"-1e999", b"NaN", b"Infinity", b"null",
                  b"true", b"[]", b"{}", b'"', b"\\", b"\\u00", b"9" * 30, b"-0", b"1.5",
                  "é".encode(), b"\xff", b"\xc3", b"\x00", b"[[[[", b"]]", b'"\\"']


def _mutate(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(data))
        action = rng.random()
        if action < 0.35:
            data[pos] = rng.randrange(256)
        elif action < 0.75:
            data[pos:pos + rng.randint(0, 6)] = rng.choice(HOSTILE_TOKENS)
        elif action < 0.9:
            del data[pos:pos + rng.randint(1, 40)]
        else:
            data[pos:pos] = data[pos:pos + rng.randint(1, 40)]
    return bytes(data)


@pytest.mark.parametrize("key", [None, KEY])
def test_byte_mutations_end_in_bundle_error(raw_bundles, key):
    rng = random.Random(26)
    loaded = 0
    for _ in range(1500):
        loaded += _decode(_mutate(raw_bundles[key], rng), key) is not None
    assert loaded < 1500  # the mutations do reach the checks


VALUES = [None, True, False, 0, -1, 2**40, 1.5, "", "x", "é", "\ud800", [], {}, [1],
          {"a": 1}, [None] * 4, [[7, 5], "x"], ["ValueError"], 10**30]


def _paths(obj, prefix=()):
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) \
        if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


def _forged(content: dict, key) -> bytes:
    """A bundle of ``content`` whose hashes match, as its maker (holding the key) writes it."""
    doc = dict(content)
    try:
        doc["sha256"] = integrity.digest(content)
        if key is not None:
            doc["hmac-sha256"] = integrity.seal(key, content)
    except (UnicodeEncodeError, ValueError):  # no hash can cover it: corrupt it is
        doc["sha256"] = "0" * 64
    return json.dumps(doc, ensure_ascii=True).encode()


@pytest.mark.parametrize("key", [None, KEY])
def test_field_mutations_with_matching_hashes_end_in_bundle_error(raw_bundles, key):
    # Wrong types and values in every field, hashed and signed: they reach every field check.
    rng = random.Random(27)
    original = json.loads(raw_bundles[key])
    content = {k: v for k, v in original.items() if k not in ("sha256", "hmac-sha256")}
    paths = [p for p in _paths(content) if p]
    for _ in range(1000):
        changed = json.loads(json.dumps(content))
        for path in rng.sample(paths, rng.randint(1, 2)):
            target = changed
            try:
                for step in path[:-1]:
                    target = target[step]
                if isinstance(target, dict) == isinstance(path[-1], str):
                    target[path[-1]] = json.loads(json.dumps(rng.choice(VALUES)))
            except (KeyError, IndexError, TypeError):  # an earlier change moved it
                pass
        _decode(_forged(changed, key), key)


def _replace_text(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw
    return raw.replace(old, new, 1)


@pytest.mark.parametrize("key", [None, KEY])
@pytest.mark.parametrize("old, new, message", [
    pytest.param(b'"daskgpu": "', b'"daskgpu": "\\ud800', "not valid Unicode", id="surrogate"),
    pytest.param(b'"grid_ndim": 1', b'"grid_ndim": 1e999', "the number 1e999 is out of range",
                 id="1e999"),
    pytest.param(b'"grid_ndim": 1', b'"grid_ndim": -1e999', "out of range", id="-1e999"),
    pytest.param(b'"grid_ndim": 1', b'"grid_ndim": ' + b"1" * 5000,
                 "no field holds more than 20 digits", id="long integer"),
    pytest.param(b'"sha256": "', b'"hmac-sha256": "' + "é".encode() * 64 + b'", "sha256": "',
                 "hmac-sha256 must be 64 hex digits", id="non-ASCII hmac"),
])
def test_named_cases_are_bundle_errors(raw_bundles, key, old, new, message):
    # Each raised UnicodeEncodeError, ValueError or TypeError before.
    raw = raw_bundles[key]
    if key is not None and b'"hmac-sha256"' in new:
        raw = _replace_text(raw, b'"hmac-sha256": "', b'"old-hmac": "')  # one hmac field
    with pytest.raises(BundleError, match=message):
        decode_bundle(_replace_text(raw, old, new), "<case>", key)


# -- exception tables: only classes a kernel may raise -----------------------------------
def _with_exception(raw: bytes, name: str, key) -> bytes:
    content = {k: v for k, v in json.loads(raw).items() if k not in ("sha256", "hmac-sha256")}
    content["images"][0]["exceptions"] = [[1, name, ["boom"], None]]
    return _forged(content, key)


@pytest.mark.parametrize("key", [None, KEY])  # signed by the key holder: refused all the same
@pytest.mark.parametrize("name, reason", [
    ("distributed:Reschedule", "may not raise the classes of 'distributed'.*Reschedule "
                               "reschedules it, forever"),
    ("distributed.exceptions:Reschedule", "may not raise the classes of 'distributed'"),
    ("daskgpu._errors:ContextLostError", "may not raise the classes of 'daskgpu'"),
    ("dask.utils:Dispatch", "may not raise the classes of 'dask'"),
    ("asyncio:CancelledError", "may not raise the classes of 'asyncio'"),
    ("builtins:SystemExit", "may not raise the classes of 'builtins'"),
    ("SystemExit", "a bare name must be one of the builtin exception classes"),
    ("KeyboardInterrupt", "a bare name must be one of the builtin exception classes"),
    ("StopIteration", "a bare name must be one of the builtin exception classes"),
    ("MyKernelError", "a bare name must be one of the builtin exception classes"),
    ("mykernels:", "module:qualname"),
])
def test_exception_classes_the_worker_acts_on_are_refused(raw_bundles, key, name, reason):
    with pytest.raises(BundleError, match=re.escape(f"{name!r} is refused: ") + f".*{reason}"):
        decode_bundle(_with_exception(raw_bundles[key], name, key), "<table>", key)


@pytest.mark.parametrize("name", ["ValueError", "IndexError", "mykernels:KernelError",
                                  "mykernels.errors:Outer.Inner"])
def test_builtin_and_user_exception_classes_load(raw_bundles, name):
    images, _ = decode_bundle(_with_exception(raw_bundles[None], name, None), "<table>")
    assert images[0].exceptions[0][1] == name
