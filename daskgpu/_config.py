"""The ``daskgpu`` section of ``dask.config``: every setting read, parsed and checked here.

The defaults live in the packaged ``daskgpu.yaml`` and are registered with
``dask.config.update_defaults``. A bare process that only unpickles and runs a
launch may never import dask (importing it costs about 0.1 s, more than the
rest of a cold start); there the settings come from the same YAML files and
``DASK_*`` environment variables that ``dask.config`` reads, collected the
way dask collects them, so a value reads the same before and after
``import dask``. Every value goes through one parser per setting
(:data:`SETTINGS`); a bad one raises :class:`ConfigError` naming the setting,
the value and how to set it.
"""

from __future__ import annotations

import ast
import base64
import functools
import json
import os
import re
import site
import sys

from daskgpu._errors import ConfigError

_MISSING = object()
_FN = os.path.join(os.path.dirname(__file__), "daskgpu.yaml")


# -- parsers: raw value -> checked value; a ValueError's text says what is wanted -----
def _bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0", ""):
            return False
    if value is None:
        return False
    raise ValueError("it must be true or false")


def parse_cc(value) -> tuple:
    """A compute capability from ``"8.0"``, ``80``, ``(8, 0)`` or ``"sm_80"``, as ``(8, 0)``.

    Raises ``ValueError`` saying what is wanted; the one reader of compute
    capabilities, for settings and the compiler's ``targets=`` alike.

    Examples
    --------
    >>> parse_cc("sm_90"), parse_cc(75), parse_cc("10.0")
    ((9, 0), (7, 5), (10, 0))
    """
    if isinstance(value, tuple | list) and len(value) == 2:
        value = f"{value[0]}.{value[1]}"
    text = str(value).strip().lower().removeprefix("sm_").removeprefix("compute_")
    m = re.fullmatch(r"(\d{1,2})\.(\d)", text) or re.fullmatch(r"(\d{1,2})(\d)", text)
    if m is None:
        raise ValueError('it must be a compute capability "major.minor", e.g. "7.5" '
                         '(or "sm_75")')
    return int(m.group(1)), int(m.group(2))


def _cc(value):
    major, minor = parse_cc(value)
    return f"{major}.{minor}"


def _optional_path(value):
    if value is None or value == "" or value is False:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ValueError("it must be a directory path, or null to turn it off")
    return os.fspath(value)


def _optional_key(value):
    if value is None or value == "":
        return None
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError("it must be a string (the secret key), or null")
    return value


def _count(low):
    def parse(value):
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"it must be a whole number of at least {low}")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"it must be a whole number of at least {low}") from None
        if number < low:
            raise ValueError(f"it must be at least {low}")
        return number
    return parse


def _bytes(low):
    def parse(value):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError('it must be a size: bytes, or a string such as "8GiB"')
        if isinstance(value, str):
            # Only a string needs dask's parser; plain numbers keep a bare worker dask-free.
            from dask.utils import parse_bytes

            try:
                value = parse_bytes(value)
            except ValueError:
                raise ValueError('it must be a size: bytes, or a string such as "8GiB" '
                                 'or "512 MB"') from None
        if value != int(value):
            raise ValueError("it must be a whole number of bytes")
        if value < low:
            raise ValueError(f"it must be at least {low} bytes")
        return int(value)
    return parse


#: Every ``daskgpu.*`` setting and its parser; daskgpu.yaml documents each.
SETTINGS = {
    "simulate": _bool,
    "target-cc": _cc,
    "cache-dir": _optional_path,
    "module-cache-size": _count(1),
    "pinned-pool-bytes": _bytes(0),
    "pinned-slot-bytes": _bytes(1),
    "copy-threads": _count(1),
    "pinned-output-bytes": _bytes(0),
    "pipeline-min-bytes": _bytes(0),
    "device-pool-bytes": _bytes(0),
    "fuse-chains": _bool,
    "bundle-key": _optional_key,
}


@functools.cache
def defaults() -> dict:
    """The packaged defaults, as ``{"daskgpu": {...}}``."""
    import yaml

    with open(_FN) as f:
        return yaml.safe_load(f)


@functools.cache
def _dask_config():
    import dask.config

    dask.config.update_defaults(defaults())
    return dask.config


def _raw(key: str):
    """The unparsed value of ``daskgpu.<key>``, or _MISSING."""
    if "dask" in sys.modules:
        config = _dask_config()
        # A plain dict read first: launches consult settings on the hot path,
        # and dask.config.get re-parses its key on every call.
        value = config.config.get("daskgpu", {}).get(key, _MISSING)
        if value is _MISSING:
            value = config.get(f"daskgpu.{key}", default=_MISSING)
        if value is _MISSING:  # defaults registered inside a dask.config.set block leave with it
            value = defaults()["daskgpu"].get(key, _MISSING)
        return value
    return _collected().get(key, defaults()["daskgpu"].get(key, _MISSING))


def _source(key: str) -> str:
    env = "DASK_DASKGPU__" + key.upper().replace("-", "_")
    return (f"set it in a dask config file, with the environment variable {env}, or "
            f"with dask.config.set({{'daskgpu.{key}': ...}})")


_parsed: dict = {}


def get(key: str, default=None):
    """``daskgpu.<key>``, parsed and checked; ``default`` for a key with no value.

    Raises
    ------
    ConfigError
        When the value cannot be used (the message names the value and the fix).

    Examples
    --------
    >>> get("module-cache-size")
    256
    >>> import dask.config
    >>> register()
    >>> with dask.config.set({"daskgpu.pinned-pool-bytes": "1GiB"}):
    ...     get("pinned-pool-bytes")
    1073741824
    """
    raw = _raw(key)
    if raw is _MISSING:
        return default
    parse = SETTINGS.get(key)
    if parse is None:
        return raw
    try:
        return _parsed[key, raw]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    try:
        value = parse(raw)
    except ValueError as exc:
        raise ConfigError(f"daskgpu setting {key!r} is {raw!r}, which daskgpu cannot use: "
                          f"{exc}; {_source(key)}") from None
    try:
        if len(_parsed) < 1024:
            _parsed[key, raw] = value
    except TypeError:
        pass
    return value


def flag(key: str, default: bool = False) -> bool:
    """Read a yes/no setting; the strings "false", "no", "off" and "0" are no.

    Environment variables arrive as strings where they are not Python
    literals: ``DASK_DASKGPU__SIMULATE=false`` must not read as true.

    Examples
    --------
    >>> import dask.config
    >>> register()  # before dask.config.set, so the defaults outlive its block
    >>> with dask.config.set({"daskgpu.simulate": "false"}):
    ...     flag("simulate")
    False
    >>> with dask.config.set({"daskgpu.simulate": "True"}):
    ...     flag("simulate")
    True
    """
    value = get(key, default)
    return value if isinstance(value, bool) else _bool(value)


def simulating() -> bool:
    """Whether kernels run in Numba's CUDA simulator in this process."""
    return flag("simulate")


def check() -> dict:
    """Every ``daskgpu.*`` setting, parsed; raises :class:`ConfigError` for the first bad one.

    Clients and workers call it as they start, so a bad value stops them
    there, not at the first launch.

    Examples
    --------
    >>> check()["module-cache-size"]
    256
    """
    return {key: get(key) for key in SETTINGS}


def register() -> None:
    """Register the defaults with dask.config (importing dask)."""
    _dask_config()


# -- dask.config's sources, read without importing dask --------------------------------
def _dask_paths() -> list:
    # As dask.config._get_paths: later paths take precedence.
    paths = [
        os.getenv("DASK_ROOT_CONFIG", "/etc/dask"),
        os.path.join(sys.prefix, "etc", "dask"),
        *[os.path.join(prefix, "etc", "dask") for prefix in site.PREFIXES],
        os.path.join(os.path.expanduser("~"), ".config", "dask"),
    ]
    if "DASK_CONFIG" in os.environ:
        paths.append(os.environ["DASK_CONFIG"])
    return list(reversed(list(dict.fromkeys(reversed(paths)))))


def _yaml_files(paths) -> list:
    files = []
    for path in paths:
        if os.path.isdir(path):
            try:
                files.extend(sorted(os.path.join(path, p) for p in os.listdir(path)
                                    if os.path.splitext(p)[1].lower()
                                    in (".json", ".yaml", ".yml")))
            except OSError:
                pass
        elif os.path.exists(path):
            files.append(path)
    return files


def _section(config) -> dict:
    """The ``daskgpu`` section of one config mapping, keys spelled with hyphens."""
    if not isinstance(config, dict):
        return {}
    out = {}
    for name, section in config.items():
        if str(name).replace("_", "-") == "daskgpu" and isinstance(section, dict):
            out.update({str(k).replace("_", "-"): v for k, v in section.items()})
    return out


def _interpret(value: str):
    # As dask.config.interpret_value.
    try:
        return ast.literal_eval(value)
    except (SyntaxError, ValueError):
        pass
    return {"none": None, "null": None, "false": False, "true": True}.get(value.lower(), value)


@functools.cache
def _collected() -> dict:
    """The ``daskgpu`` settings from dask's YAML files and environment, as dask merges them."""
    import yaml

    merged = {}
    for path in _yaml_files(_dask_paths()):
        try:
            with open(path) as f:
                merged.update(_section(yaml.safe_load(f.read())))
        except OSError:
            pass
        except yaml.YAMLError as exc:
            raise ConfigError(f"the dask config file {path!r} is malformed: {exc}") from None
    inherited = os.environ.get("DASK_INTERNAL_INHERIT_CONFIG")
    if inherited:  # what a parent process passes on, as dask.config.serialize writes it
        data = json.loads(base64.urlsafe_b64decode(inherited.encode()).decode())
        merged.update(_section(data))
        merged.update({k.split(".", 1)[1].replace("_", "-"): v for k, v in data.items()
                       if k.replace("_", "-").startswith("daskgpu.")})
    for name, value in os.environ.items():
        if name.startswith("DASK_DASKGPU__"):
            merged[name[len("DASK_DASKGPU__"):].lower().replace("_", "-")] = _interpret(value)
    return merged
