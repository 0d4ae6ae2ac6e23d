"""The launch vocabulary: the resources a GPU worker offers and a launch task asks for.

The scheduler plugin asks them (:mod:`daskgpu._dask.placement`), the worker
offers them (:mod:`daskgpu._dask.workers`), and ``map_kernel`` annotates its
launch layer with them, where no plugin is.
"""

from __future__ import annotations

__all__ = ["GPU", "GPU_MEMORY", "LAUNCH_SHARE", "memory_offer"]

#: The resource a GPU worker offers, one per GPU.
GPU = "GPU"

#: What a launch task asks of its worker's ``GPU``: a share, not the whole GPU.
#: The restriction keeps launches on GPU workers; how many run at once is the
#: worker's thread count, as for any Dask task (one by default, as dask-cuda
#: has it). Asking ``GPU=1`` ran them one at a time whatever the threads, while
#: ``map_blocks`` of the same work used them all. A power of two, so that the
#: scheduler's sums of it are exact.
LAUNCH_SHARE = 2.0 ** -10

#: The resource a GPU worker offers as its device's memory, in bytes
#: (:func:`memory_offer`); a launch asks for what its chunk needs on the device.
GPU_MEMORY = "GPU-memory"


def memory_offer(total: int | None, simulated: bool) -> int | None:
    """The ``GPU-memory`` a worker offers: ``daskgpu.device-memory`` when set, else its
    device's ``total`` less ``daskgpu.device-memory-margin``; simulated, only the setting
    (None: no offer, so launches are not sized).

    Examples
    --------
    >>> memory_offer(141 * 2**30, simulated=False) == 139 * 2**30
    True
    >>> memory_offer(None, simulated=True) is None
    True
    """
    from daskgpu import _config

    given = _config.get("device-memory")
    if given is not None:
        return given
    if simulated or not total:
        return None
    return int(total) - _config.memory_margin(int(total))
