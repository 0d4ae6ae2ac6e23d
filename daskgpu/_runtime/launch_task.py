"""The contract of a task that runs a launch: what it asks of the scheduler and its worker.

Every callable that launches a kernel inside a Dask task (a submitted
:class:`~daskgpu._runtime.launch.Launch`, a ``map_kernel`` chunk launch, a
fused pair of them) is a :class:`LaunchTask`. The scheduler's placement reads
it to keep the task on GPU workers and to ask for the device memory it needs;
the worker's launch watch reads it for the time limit. Both find it through
one walk over Dask's task specs (:func:`daskgpu._dask.launch_core.walk.launches_in`),
by type, never by probing attributes.
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["LaunchTask"]


class LaunchTask(abc.ABC):
    """A callable that launches a kernel in a Dask task.

    Examples
    --------
    >>> class Sleep(LaunchTask):
    ...     kernel_name, timeout = "sleep", 2.0
    ...     def device_bytes(self, block=None, argument_bytes=0):
    ...         return argument_bytes
    ...     def __call__(self, *args):
    ...         return None
    >>> Sleep().device_bytes(argument_bytes=64), isinstance(Sleep(), LaunchTask)
    (64, True)
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def kernel_name(self) -> str:
        """The kernel's name, for messages, metrics and the time limit's error."""

    @property
    @abc.abstractmethod
    def timeout(self) -> float | None:
        """The most seconds the launch may run on a GPU worker; None: the worker's
        ``daskgpu.launch-timeout``."""

    @abc.abstractmethod
    def device_bytes(self, block: tuple | None = None, argument_bytes: int = 0) -> int:
        """The device memory the task needs, in bytes.

        ``block`` is the shape of a ``map_kernel`` task's block (from its
        place), None where unknown (then the map's largest block);
        ``argument_bytes`` the size of the task's arguments as the scheduler
        knows them, for a launch that puts its arguments on the device.
        """

    @abc.abstractmethod
    def __call__(self, *args: Any) -> Any:
        """Run the launch on the task's arguments."""
