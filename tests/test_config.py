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

_config.register()  # before dask.config.set, so the defaults outlive its blocks


@pytest.mark.parametrize("key,value,message", [
    ("module-cache-size", "abc", "whole number of at least 1"),
    ("module-cache-size", 0, "at least 1"),
    ("pinned-pool-bytes", -5, "at least 0 bytes"),
    ("pinned-pool-bytes", "lots", "such as \"8GiB\""),
    ("copy-threads", 2.5, "whole number"),
    ("simulate", "maybe", "true or false"),
    ("target-cc", "ampere", "major.minor"),
    ("cache-dir", 5, "directory path"),
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


def test_sizes_take_dask_byte_strings():
    with dask.config.set({"daskgpu.pinned-pool-bytes": "1GiB",
                          "daskgpu.device-pool-bytes": "512 MB",
                          "daskgpu.module-cache-size": "32"}):
        assert _config.get("pinned-pool-bytes") == 1 << 30
        assert _config.get("device-pool-bytes") == 512_000_000
        assert _config.get("module-cache-size") == 32
    assert _config.check()["pinned-pool-bytes"] == 536870912  # the packaged default


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


def test_a_bad_environment_value_fails_the_same_way_without_dask(tmp_path):
    (tmp_path / "conf").mkdir()
    before, after = _probe(tmp_path, {"DASK_DASKGPU__PINNED_POOL_BYTES": "-5"})
    assert before == after and "'pinned-pool-bytes' is -5" in before
