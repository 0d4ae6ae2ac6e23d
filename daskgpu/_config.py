"""The ``daskgpu`` section of ``dask.config``.

The defaults live in the packaged ``daskgpu.yaml`` and are registered with
``dask.config.update_defaults``. A bare process that only unpickles and runs a
launch may never import dask (importing it costs about 0.4 s, more than the
rest of a cold start); there settings come from the same defaults and the same
``DASK_DASKGPU__*`` environment variables that dask.config reads.
"""

from __future__ import annotations

import ast
import functools
import os
import sys

_MISSING = object()
_FN = os.path.join(os.path.dirname(__file__), "daskgpu.yaml")


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


def get(key: str, default=None):
    """Read ``daskgpu.<key>``: from dask.config where dask is loaded, else env and defaults."""
    if "dask" in sys.modules:
        config = _dask_config()
        # A plain dict read first: launches consult settings on the hot path,
        # and dask.config.get re-parses its key on every call.
        value = config.config.get("daskgpu", {}).get(key, _MISSING)
        if value is _MISSING:
            value = config.get(f"daskgpu.{key}", default=_MISSING)
        if value is not _MISSING:
            return value
        # Defaults registered inside a dask.config.set block leave with it.
        return defaults()["daskgpu"].get(key, default)
    env = os.environ.get("DASK_DASKGPU__" + key.upper().replace("-", "_"))
    if env is not None:
        try:
            return ast.literal_eval(env)
        except (ValueError, SyntaxError):
            return env
    return defaults()["daskgpu"].get(key, default)


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
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "off", "0", "")
    return bool(value)


def simulating() -> bool:
    """Whether kernels run in Numba's CUDA simulator in this process."""
    return flag("simulate")


def register() -> None:
    """Register the defaults with dask.config (importing dask)."""
    _dask_config()
