"""The ``daskgpu`` section of ``dask.config``: every setting read, parsed and checked here.

The defaults live in the packaged ``daskgpu.yaml`` and are registered with
``dask.config.update_defaults``. A bare process that only unpickles and runs a
launch may never import dask (importing it costs about 0.1 s, more than the
rest of a cold start); there the settings come from the same YAML files and
``DASK_*`` environment variables that ``dask.config`` reads, collected the
way dask collects them, so a value reads the same before and after
``import dask``. Every value goes through one parser per setting
(:data:`SETTINGS`), which checks ranges as well as types; a bad one raises
:class:`ConfigError` naming the setting, the value (a secret's only by its
type), what it must be and how to set it. ``bundle-key`` is off only when it
is ``false``: None, null or empty is refused, never read as "no key".
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
from numbers import Real

from daskgpu._errors import ConfigError

_MISSING = object()
_FN = os.path.join(os.path.dirname(__file__), "daskgpu.yaml")

#: The major versions of a compute capability that daskgpu reads.
CC_MAJORS = range(3, 20)
#: The largest size setting: 1 PiB, beyond any machine's memory, below size_t's range.
MAX_SIZE = 1 << 50
#: The most copy threads: more only contend for a GPU's few copy engines.
MAX_COPY_THREADS = 256
#: The most linked modules a worker keeps: a bound on nonsense, not on memory.
MAX_MODULE_CACHE_SIZE = 1_000_000
#: The largest ``chain-graphs``: a bound on nonsense (no chain is that long).
MAX_CHAIN_GRAPH_LAUNCHES = 1_000_000


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
    capabilities, for settings and the compiler's ``targets=`` alike. The
    major version must be in :data:`CC_MAJORS` (GPUs so far are 3.0 to 12.x),
    so that a slip such as ``"75.5"`` is caught here.

    Examples
    --------
    >>> parse_cc("sm_90"), parse_cc(75), parse_cc("10.0")
    ((9, 0), (7, 5), (10, 0))
    """
    if isinstance(value, tuple | list) and len(value) == 2:
        value = f"{value[0]}.{value[1]}"
    text = str(value).strip().lower().removeprefix("sm_").removeprefix("compute_")
    m = re.fullmatch(r"(\d{1,2})\.(\d)", text) or re.fullmatch(r"(\d{1,2})(\d)", text)
    if m is None or int(m.group(1)) not in CC_MAJORS:
        raise ValueError('it must be a compute capability "major.minor" with a major version '
                         f'from {CC_MAJORS.start} to {CC_MAJORS.stop - 1}, e.g. "7.5" '
                         '(or "sm_75")')
    return int(m.group(1)), int(m.group(2))


def _cc(value):
    major, minor = parse_cc(value)
    return f"{major}.{minor}"


def _cache_dir(value):
    """A directory path, or None (no disk cache); refused where no directory can be."""
    if value is None or value == "" or value is False:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ValueError("it must be a directory path, or null to turn it off")
    path = os.fspath(value)
    blocker = _first_non_directory(path)
    if blocker == path:
        raise ValueError("it names a file, not a directory; name a directory (it is created "
                         "if missing), or null to turn the disk cache off")
    if blocker is not None:
        raise ValueError(f"{blocker!r} is a file, so no directory can be made below it")
    return path


def _first_non_directory(path: str):
    """``path``, or the parent of it that exists, when that is not a directory; else None."""
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    if os.path.isdir(current):
        return None
    return path if current == os.path.abspath(path) else current


def _bundle_key(value):
    """The signing secret, or None when signing is explicitly off (``false``).

    None, ``null``, ``~`` and empty values are refused, not read as "no key": a
    secret that failed to arrive (``DASK_DASKGPU__BUNDLE_KEY=$UNSET``, a
    template left empty, the text ``None``) must not turn signature checks off.
    """
    if value is False:
        return None
    if isinstance(value, str | bytes) and not _no_value(value):
        return value
    if value is not None and not isinstance(value, str | bytes):
        # Dask reads environment variables and YAML as literals: 123 becomes a number.
        raise ValueError(
            f"it must be the secret key as a string, but it was read as type "
            f"{type(value).__name__}: Dask reads an unquoted number (or true, or a list) in "
            "YAML and environment variables as one; quote the key inside the value: "
            "DASK_DASKGPU__BUNDLE_KEY='\"<key>\"' in a shell, or bundle-key: \"<key>\" in a "
            "dask config file")
    raise ValueError("it must be the secret key (a non-empty string), or false for no key; "
                     "an empty value, None or null is refused so that a key that failed to "
                     "arrive does not turn signature checks off")


def _no_value(value) -> bool:
    """Whether ``value`` is a spelling of nothing: None, empty, or the text none/null/~."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value is None or (isinstance(value, str)
                             and value.strip().lower() in ("", "none", "null", "~"))


def _count(low, high):
    wanted = f"a whole number from {low} to {high}"

    def parse(value):
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"it must be {wanted}")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"it must be {wanted}") from None
        if not low <= number <= high:
            raise ValueError(f"it must be {wanted}")
        return number
    return parse


def _bytes(low):
    wanted = f"a size from {low} to {MAX_SIZE} bytes (1 PiB)"

    def parse(value):
        if isinstance(value, bool) or not isinstance(value, Real | str):
            raise ValueError(f'it must be {wanted}: bytes, or a string such as "8GiB"')
        if isinstance(value, str):
            # Only a string needs dask's parser; plain numbers keep a bare worker dask-free.
            from dask.utils import parse_bytes

            try:
                value = parse_bytes(value)
            except (ValueError, OverflowError):
                raise ValueError(f'it must be {wanted}, such as "8GiB" or "512 MB"') from None
        if not low <= value <= MAX_SIZE:  # before int(): inf and nan fail here
            raise ValueError(f"it must be {wanted}")
        if value != int(value):
            raise ValueError("it must be a whole number of bytes")
        return int(value)
    return parse


def _optional_bytes(low):
    parse_bytes = _bytes(low)

    def parse(value):
        return None if _no_value(value) else parse_bytes(value)
    return parse


def _seconds(optional: bool):
    wanted = ("a time, in seconds or a string such as \"30s\" or \"5 minutes\""
              + (", or null for none" if optional else ""))

    def parse(value):
        if optional and _no_value(value):
            return None
        if isinstance(value, bool) or not isinstance(value, Real | str):
            raise ValueError(f"it must be {wanted}")
        if isinstance(value, str):
            from dask.utils import parse_timedelta

            try:
                value = parse_timedelta(value.strip(), default="seconds")
            except (ValueError, KeyError):
                raise ValueError(f"it must be {wanted}") from None
        if not 0 < value < float("inf"):
            raise ValueError(f"it must be {wanted}, more than 0")
        return float(value)
    return parse


#: Every ``daskgpu.*`` setting and its parser; daskgpu.yaml documents each.
SETTINGS = {
    "simulate": _bool,
    "target-cc": _cc,
    "cache-dir": _cache_dir,
    "cache-bytes": _bytes(1),
    "module-cache-size": _count(1, MAX_MODULE_CACHE_SIZE),
    "pinned-pool-bytes": _bytes(1),
    "pinned-slot-bytes": _bytes(1),
    "copy-threads": _count(1, MAX_COPY_THREADS),
    "pinned-output-bytes": _bytes(0),
    "pipeline-min-bytes": _bytes(0),
    "device-pool-bytes": _bytes(0),
    "fuse-chains": _bool,
    "launch-bytes": _bytes(0),
    "chain-graphs": _count(0, MAX_CHAIN_GRAPH_LAUNCHES),
    "bundle-key": _bundle_key,
    "launch-timeout": _seconds(optional=True),
    "device-memory": _optional_bytes(1),
    "device-memory-margin": _bytes(0),
    "cancel-grace": _seconds(optional=False),
    "no-worker-timeout": _seconds(optional=True),
}
#: Settings whose values no message shows.
SECRET_SETTINGS = frozenset({"bundle-key"})


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


def _shown(key: str, raw) -> str:
    """``raw`` as a message shows it: a secret setting's value only by its type."""
    if key in SECRET_SETTINGS and not _no_value(raw):
        return f"a value of type {type(raw).__name__} (not shown: it may be a secret)"
    return repr(raw)


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
    # Keyed by type too: False == 0 == 0.0 as dict keys, but 0 is no way to say "no key".
    memo = (key, type(raw), raw)
    try:
        return _parsed[memo]
    except (KeyError, TypeError):  # not seen yet, or unhashable
        pass
    try:
        value = parse(raw)
    except ValueError as exc:
        raise ConfigError(f"daskgpu setting {key!r} is {_shown(key, raw)}, which daskgpu "
                          f"cannot use: {exc}; {_source(key)}") from None
    try:
        if len(_parsed) < 1024:
            _parsed[memo] = value
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


def check() -> dict:
    """Every ``daskgpu.*`` setting, parsed; raises :class:`ConfigError` for the first bad one.

    Clients and workers call it as they start, so a bad value stops them
    there, not at the first launch.

    Examples
    --------
    >>> check()["module-cache-size"]
    256
    """
    values = {key: get(key) for key in SETTINGS}
    _check_pinned_sizes(values["pinned-slot-bytes"], values["pinned-pool-bytes"])
    return values


def _check_pinned_sizes(slot: int, pool: int) -> None:
    # The pinned pool is made of whole slots: one larger than the pool fails every copy.
    if slot > pool:
        raise ConfigError(
            f"daskgpu setting 'pinned-slot-bytes' is {slot}, more than 'pinned-pool-bytes' "
            f"({pool}), but the pool is made of whole slots: make the slot smaller or the "
            f"pool larger; {_source('pinned-slot-bytes')}")


def memory_margin(total: int) -> int:
    """``daskgpu.device-memory-margin``, checked against a device of ``total`` bytes.

    A margin at or above the device's memory would leave launches nothing to
    share (an offer of 0, which turns sharing off without a word): it is
    refused, naming the setting, the device's memory and the margin, so that
    the worker does not start so.

    Examples
    --------
    >>> register()
    >>> memory_margin(80 * 2**30) == 2 * 2**30
    True
    >>> memory_margin(2**30)
    Traceback (most recent call last):
    ...
    daskgpu._errors.ConfigError: daskgpu setting 'device-memory-margin' is 2147483648 bytes ...
    """
    margin = get("device-memory-margin")
    if margin >= total:
        raise ConfigError(
            f"daskgpu setting 'device-memory-margin' is {margin} bytes ({_gib(margin)}), at "
            f"or above this worker's device memory, {total} bytes ({_gib(total)}), which "
            "would leave launches none of it to share: set the margin below the device's "
            "memory, or set daskgpu.device-memory to the bytes the worker offers; "
            f"{_source('device-memory-margin')}")
    return margin


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def is_set(key: str) -> bool:
    """Whether ``daskgpu.<key>`` was given a value rather than left at its packaged default:
    in a dask config file, a ``DASK_DASKGPU__*`` variable (as those are now), or with
    ``dask.config.set`` (there only a value other than the default shows).

    Examples
    --------
    >>> import dask.config
    >>> register()
    >>> is_set("copy-threads")
    False
    >>> with dask.config.set({"daskgpu.copy-threads": 2}):
    ...     is_set("copy-threads")
    True
    """
    if key in _collected.__wrapped__():  # read afresh: the environment may have changed
        return True
    if "dask" in sys.modules:
        raw = _raw(key)
        return raw is not _MISSING and raw != defaults()["daskgpu"].get(key, _MISSING)
    return False


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
