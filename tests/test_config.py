"""daskgpu's settings: parsed and checked in one place, the same with or without dask."""

import json
import os
import subprocess
import sys
import textwrap

import dask.config
import pytest

from daskgpu import _config
from daskgpu._errors import ConfigError


@pytest.mark.parametrize("key,value,message", [
    ("module-cache-size", "abc", "whole number from 1 to 1000000"),
    ("module-cache-size", 0, "whole number from 1 to 1000000"),
    ("module-cache-size", 10**9, "whole number from 1 to 1000000"),
    ("pinned-pool-bytes", -5, r"a size from 1 to 1125899906842624 bytes \(1 PiB\)"),
    ("pinned-pool-bytes", "lots", "such as \"8GiB\""),
    ("pinned-pool-bytes", 1e30, r"a size from 1 to 1125899906842624 bytes \(1 PiB\)"),
    ("pinned-output-bytes", float("inf"), r"a size from 0 to 1125899906842624 bytes"),
    ("device-pool-bytes", float("nan"), r"a size from 0 to 1125899906842624 bytes"),
    ("pipeline-min-bytes", "1e999", r"a size from 0 to 1125899906842624 bytes"),
    ("copy-threads", 2.5, "whole number from 1 to 256"),
    ("copy-threads", 10**8, "whole number from 1 to 256"),
    ("simulate", "maybe", "true or false"),
    ("target-cc", "ampere", "major.minor"),
    ("target-cc", "75.5", "major version from 3 to 19"),
    ("target-cc", "1.0", "major version from 3 to 19"),
    ("cache-dir", 5, "directory path"),
    ("cache-bytes", 0, r"a size from 1 to 1125899906842624 bytes"),
    ("cache-bytes", "huge", "such as \"8GiB\""),
])
def test_a_bad_value_names_the_setting_the_value_and_the_fix(key, value, message):
    with dask.config.set({f"daskgpu.{key}": value}):
        with pytest.raises(ConfigError, match=message) as err:
            _config.get(key)
        with pytest.raises(ConfigError):
            _config.check()
    text = str(err.value)
    assert repr(key) in text and repr(value) in text
    assert "DASK_DASKGPU__" + key.upper().replace("-", "_") in text


@pytest.mark.parametrize("value", ["7.5", "12.1", "sm_100", 90])
def test_compute_capabilities_in_range_pass(value):
    with dask.config.set({"daskgpu.target-cc": value}):
        assert _config.get("target-cc") in ("7.5", "12.1", "10.0", "9.0")


def test_a_cache_dir_naming_a_file_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    with dask.config.set({"daskgpu.cache-dir": str(afile)}):
        with pytest.raises(ConfigError, match="names a file, not a directory"):
            _config.check()
    with dask.config.set({"daskgpu.cache-dir": str(afile / "cubins")}):
        with pytest.raises(ConfigError, match=r"'.*afile' is a file, so no directory can be"):
            _config.get("cache-dir")
    missing = tmp_path / "not" / "yet"  # created when the cache first stores
    with dask.config.set({"daskgpu.cache-dir": str(missing)}):
        assert _config.get("cache-dir") == str(missing)


def test_a_pinned_slot_larger_than_the_pool_is_refused():
    with dask.config.set({"daskgpu.pinned-slot-bytes": "1GiB",
                          "daskgpu.pinned-pool-bytes": "512MiB"}):
        with pytest.raises(ConfigError, match=r"'pinned-slot-bytes' is 1073741824, more than "
                                              r"'pinned-pool-bytes' \(536870912\)"):
            _config.check()


# -- the bundle key: only false means "no key" ---------------------------------------
@pytest.mark.parametrize("value", [None, "None", "null", "NULL", "~", "", "  "])
def test_a_bundle_key_that_is_no_value_is_refused(value):
    with dask.config.set({"daskgpu.bundle-key": value}):
        with pytest.raises(ConfigError, match="'bundle-key'.*or false for no key") as err:
            _config.get("bundle-key")
    assert "DASK_DASKGPU__BUNDLE_KEY" in str(err.value)


def test_only_false_turns_the_bundle_key_off_and_a_refused_key_is_not_shown():
    assert _config.get("bundle-key") is None  # the packaged default: false
    with dask.config.set({"daskgpu.bundle-key": False}):
        assert _config.get("bundle-key") is None
    with dask.config.set({"daskgpu.bundle-key": "s3cret"}):
        assert _config.get("bundle-key") == "s3cret"
    for number in (0, 8675309):  # 0 == False as a dict key: the memo must not mix them
        with dask.config.set({"daskgpu.bundle-key": number}):
            with pytest.raises(ConfigError, match="value of type int") as err:
                _config.get("bundle-key")
        assert str(number) not in str(err.value).split("cannot use")[0]


def test_sizes_take_dask_byte_strings():
    with dask.config.set({"daskgpu.pinned-pool-bytes": "1GiB",
                          "daskgpu.device-pool-bytes": "512 MB",
                          "daskgpu.module-cache-size": "32"}):
        assert _config.get("pinned-pool-bytes") == 1 << 30
        assert _config.get("device-pool-bytes") == 512_000_000
        assert _config.get("module-cache-size") == 32
    assert _config.check()["pinned-pool-bytes"] == 536870912  # the packaged default


def test_the_disk_cache_bound_is_a_size_of_one_gib_by_default():
    assert _config.get("cache-bytes") == 1 << 30
    with dask.config.set({"daskgpu.cache-bytes": "20 GiB"}):
        assert _config.get("cache-bytes") == 20 << 30


PROBE = textwrap.dedent("""
    import json, sys
    from daskgpu import _config
    keys = list(_config.SETTINGS)
    def read():
        try:
            return {k: _config.get(k) for k in keys}
        except _config.ConfigError as exc:
            return str(exc)
    before = read()
    assert "dask" not in sys.modules
    import dask
    print(json.dumps([before, read()]))
""")


def _probe(tmp_path, env):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DASK_DASKGPU")},
           "DASK_CONFIG": str(tmp_path / "conf"), **env}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.slow
def test_values_are_the_same_before_and_after_import_dask(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "daskgpu.yaml").write_text(
        "daskgpu:\n  cache-dir: /tmp/from-yaml\n  module_cache_size: 17\n"
        "  pinned-pool-bytes: 67108864\n")
    before, after = _probe(tmp_path, {"DASK_DASKGPU__COPY_THREADS": "3",
                                      "DASK_DASKGPU__SIMULATE": "false",
                                      "DASK_DASKGPU__TARGET_CC": "8.0"})
    assert before == after
    assert before["cache-dir"] == "/tmp/from-yaml" and before["module-cache-size"] == 17
    assert before["pinned-pool-bytes"] == 64 << 20 and before["copy-threads"] == 3
    assert before["simulate"] is False and before["target-cc"] == "8.0"


@pytest.mark.slow
def test_a_bad_environment_value_fails_the_same_way_without_dask(tmp_path):
    (tmp_path / "conf").mkdir()
    before, after = _probe(tmp_path, {"DASK_DASKGPU__PINNED_POOL_BYTES": "-5"})
    assert before == after and "'pinned-pool-bytes' is -5" in before


@pytest.mark.slow
@pytest.mark.parametrize("text", ["None", "null", ""])
def test_a_bundle_key_variable_that_reads_as_none_is_refused_with_or_without_dask(
        tmp_path, text):
    (tmp_path / "conf").mkdir()
    before, after = _probe(tmp_path, {"DASK_DASKGPU__BUNDLE_KEY": text})
    assert before == after and "'bundle-key'" in before and "or false for no key" in before


@pytest.mark.slow
def test_a_bundle_key_variable_of_false_means_no_key(tmp_path):
    (tmp_path / "conf").mkdir()
    before, after = _probe(tmp_path, {"DASK_DASKGPU__BUNDLE_KEY": "false"})
    assert before == after and before["bundle-key"] is None


@pytest.mark.slow
def test_a_bundle_key_read_as_a_number_says_how_to_quote_it(tmp_path):
    (tmp_path / "conf").mkdir()
    before, after = _probe(tmp_path, {"DASK_DASKGPU__BUNDLE_KEY": "8675309"})
    assert before == after and "'bundle-key'" in before
    assert "read as type int" in before
    assert """DASK_DASKGPU__BUNDLE_KEY='"<key>"'""" in before
    assert "8675309" not in before  # still a secret
    before, after = _probe(tmp_path, {"DASK_DASKGPU__BUNDLE_KEY": '"8675309"'})  # quoted
    assert before == after and before["bundle-key"] == "8675309"


def test_a_setting_given_its_default_value_counts_as_set(monkeypatch, tmp_path):
    monkeypatch.setenv("DASK_CONFIG", str(tmp_path))  # no config file of this machine's
    monkeypatch.delenv("DASK_DASKGPU__SIMULATE", raising=False)
    assert not _config.is_set("simulate")
    monkeypatch.setenv("DASK_DASKGPU__SIMULATE", "0")  # the default, said explicitly
    assert _config.is_set("simulate")
    monkeypatch.delenv("DASK_DASKGPU__SIMULATE")
    (tmp_path / "daskgpu.yaml").write_text("daskgpu:\n  simulate: false\n")
    assert _config.is_set("simulate")


def test_a_memory_margin_at_or_above_the_device_memory_is_refused_naming_both():
    gib = 2**30
    with dask.config.set({"daskgpu.device-memory-margin": "80GiB"}):
        for total in (80 * gib, 40 * gib):
            with pytest.raises(ConfigError) as caught:
                _config.memory_margin(total)
            message = str(caught.value)
            assert message.startswith(
                f"daskgpu setting 'device-memory-margin' is {80 * gib} bytes (80.00 GiB), at "
                f"or above this worker's device memory, {total} bytes ")
            assert "set daskgpu.device-memory to the bytes the worker offers" in message
        assert _config.memory_margin(80 * gib + 1) == 80 * gib  # one byte left to share
