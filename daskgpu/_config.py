"""The ``daskgpu`` section of ``dask.config``, registered once on import."""

from __future__ import annotations

import os

import dask.config
import yaml

_fn = os.path.join(os.path.dirname(__file__), "daskgpu.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


def get(key: str, default=None):
    """Read ``daskgpu.<key>`` from dask.config."""
    return dask.config.get(f"daskgpu.{key}", default=default)


def simulating() -> bool:
    """Whether kernels run in Numba's CUDA simulator in this process."""
    return bool(get("simulate", False))
