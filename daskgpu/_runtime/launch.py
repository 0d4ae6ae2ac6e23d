"""Launches: a kernel with a launch configuration, a picklable callable.

Everything here is plain data plus dispatch; it imports neither numba nor a GPU
library, so unpickling a launch is cheap and needs no device. Where a launch
runs is the backend's decision (:mod:`daskgpu._runtime.backends`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from daskgpu._bounded import BoundedCache
from daskgpu._errors import LaunchConfigError, PicklingError
from daskgpu._image.array_info import Zeroed, array_info
from daskgpu._image.launch_config import LaunchConfig
from daskgpu._image.random_states import RandomStates
from daskgpu._runtime import backends, launch_runs
from daskgpu._runtime.launch_task import LaunchTask

if TYPE_CHECKING:
    from daskgpu._image.image import KernelImage

#: Grid, block or forall task counts: an int, or 1 to 3 of them.
Dims = int | Sequence[int]


class Launchable(Protocol):
    """What a :class:`Launch` needs of its kernel (a ``Kernel`` or a ``PTXKernel``)."""

    __name__: str

    @property
    def images(self) -> tuple[KernelImage, ...]: ...

    def select_image(self, args: Sequence[Any], infos: Sequence[Any] | None = None
                     ) -> KernelImage: ...

    def launch_images(self) -> Collection[KernelImage]: ...

    def _run(self, image: KernelImage, config: LaunchConfig, args: Sequence[Any],
             infos: Sequence[Any]) -> Any: ...


def written_result(args: Sequence[Any], writes: Sequence[int]) -> Any:
    """What a launch returns: ``None``, the one written array, or a tuple of them."""
    if not writes:
        return None
    if len(writes) == 1:
        return unwrap(args[writes[0]])
    return tuple(unwrap(args[i]) for i in writes)


def unwrap(arg: Any) -> Any:
    if type(arg) is Zeroed:
        return arg.array
    if type(arg).__module__ == "numba.cuda.args":  # cuda.In / Out / InOut
        return arg.value
    return arg


class Launch(LaunchTask):
    """A kernel with a launch configuration: a picklable callable.

    Calling it launches the kernel and returns what the kernel wrote: one array,
    a tuple of arrays in argument order, or None. Pickled, it carries only the
    kernel's compiled images (PTX and argument specs).

    Attributes
    ----------
    kernel : Kernel or PTXKernel
        The kernel to launch; pickled, a :class:`PTXKernel`.
    config : LaunchConfig
        Grid and block dimensions, stream and shared memory, or a forall's
        number of tasks.
    timeout : float or None
        Seconds a Dask task running this launch may take; None: the worker's
        ``daskgpu.launch-timeout``.

    Examples
    --------
    Made by ``kernel[griddim, blockdim]``, :meth:`~LaunchAPI.configure` or
    :meth:`~LaunchAPI.forall`; a launch travels to Dask workers as PTX-only data.

    >>> import pickle, numpy as np, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1], float32[::1])")
    ... def double(out, x):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         out[i] = 2 * x[i]
    >>> launch = double[4, 256]
    >>> launch
    <Launch double LaunchConfig(griddim=(4, 1, 1), blockdim=(256, 1, 1))>
    >>> pickle.loads(pickle.dumps(launch)).kernel
    <PTXKernel double signatures=['(float32[::1], float32[::1])']>
    >>> x = np.arange(1000, dtype=np.float32)
    >>> out = launch(np.empty_like(x), x)  # doctest: +SKIP
    >>> fut = client.submit(launch, np.empty_like(x), x)  # doctest: +SKIP
    """

    __slots__ = ("kernel", "config", "timeout", "_fast")

    kernel: Launchable
    config: LaunchConfig
    timeout: float | None

    def __init__(self, kernel: Launchable, config: LaunchConfig,
                 timeout: float | None = None) -> None:
        self.kernel = kernel
        self.config = config
        #: Seconds a Dask task running this launch may take before its GPU worker fails
        #: it and replaces its process; None: the worker's ``daskgpu.launch-timeout``.
        self.timeout = timeout
        # The runtime's fast function for repeats of the last launch.
        self._fast: Callable[[tuple], Any] | None = None

    def __call__(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None:
            if launch_runs.watching:  # linked already: its own run starts now
                launch_runs.began()
            result = fast(args)
            if result is not NotImplemented:
                return result
        if any(type(a) is RandomStates for a in args):
            return _with_states(self, args)
        # Each argument's array facts are read once, for matching and marshalling.
        infos = [array_info(a) for a in args]
        image = self.kernel.select_image(args, infos)
        result = self.kernel._run(image, self.config, args, infos)
        # Only the first image may take the fast path: matching one image alone
        # must pick what select_image would. The simulator has none.
        if image is self.kernel.images[0]:
            self._fast = backends.for_image(image).repeat_launch(
                image, self.config, infos, args, self.kernel.launch_images())
        return result

    def __reduce__(self):
        if not self.kernel.images:
            # A lazy kernel not yet compiled, submitted the Numba way. The arguments are
            # not at hand here and workers cannot compile; failing inside Dask's pickling
            # would bury the fix under its serialization errors, so the task carries a
            # placeholder whose one error names the fix.
            return Uncompiled, (self.kernel.__name__,)
        return Launch, (self.kernel, self.config, self.timeout)

    def __repr__(self) -> str:
        limit = "" if self.timeout is None else f" timeout={self.timeout:g}s"
        return f"<Launch {self.kernel.__name__} {self.config!r}{limit}>"

    @property
    def __name__(self) -> str:  # Dask names tasks after their function
        return self.kernel.__name__

    @property
    def kernel_name(self) -> str:
        """The kernel's name."""
        return self.kernel.__name__

    def device_bytes(self, block: tuple | None = None, argument_bytes: int = 0) -> int:
        """What the task's arguments take: the launch copies host arrays to the device."""
        return int(argument_bytes)


class Uncompiled(LaunchTask):
    """What a launch of a kernel with no compiled signature pickles to: calling it raises
    :class:`~daskgpu.PicklingError` naming ``specialize``, as workers cannot compile."""

    __slots__ = ("name",)
    timeout = None

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        raise PicklingError(
            f"kernel {self.name!r} was shipped with no compiled signature, and workers "
            f"do not compile: specialize it on the client first, "
            f"client.submit({self.name}.specialize(*args)[griddim, blockdim], *args), or "
            f"give dg.jit a signature")

    def __reduce__(self):
        return Uncompiled, (self.name,)

    @property
    def kernel_name(self) -> str:
        return self.name

    def device_bytes(self, block=None, argument_bytes=0) -> int:
        return 0  # it fails at once, launching nothing

    @property
    def __name__(self):
        return self.name


def _with_states(launch, args):
    """Call ``launch`` with its :func:`~daskgpu.random_states` built on this device.

    The states are scratch: the kernel's writes to them are not returned.
    """
    from daskgpu._runtime.random_states import expand

    placeholders = {i for i, a in enumerate(args) if type(a) is RandomStates}
    args = expand(args)
    infos = [array_info(a) for a in args]
    image = launch.kernel.select_image(args, infos)
    launch.kernel._run(image, launch.config, args, infos)
    return written_result(args, [i for i in image.writes if i not in placeholders])


#: Launches a kernel keeps for reuse, one per configuration (LaunchAPI._launch).
LAUNCHES_KEPT = 64


class LaunchAPI:
    """Numba's launch syntax, shared by client and PTX-only kernels."""

    #: The kernel's function name (set by each kind of kernel).
    __name__: str

    def __getitem__(self, config: tuple[Any, ...]) -> Launch:
        """``kernel[griddim, blockdim]`` or ``kernel[griddim, blockdim, stream, sharedmem]``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise LaunchConfigError(
                "launch as kernel[griddim, blockdim] or "
                f"kernel[griddim, blockdim, stream, sharedmem], got kernel[{config!r}]"
            )
        return self.configure(*config)

    def _launch(self, key: Hashable, make: Callable[[], Launch]) -> Launch:
        """The :class:`Launch` for ``key``, made once per kernel and configuration.

        ``kernel[grid, block](...)`` in a loop then reuses one Launch and its
        fast path. The kernel's ``_launches`` cache is a
        :class:`~daskgpu._bounded.BoundedCache` keyed by ``("grid", griddim,
        blockdim, sharedmem)`` or ``("forall", ntasks, tpb, sharedmem)``, of at
        most :data:`LAUNCHES_KEPT` launches, the least recently made out.
        Configurations with a stream (objects, kept alive by a cache) or
        unhashable dimensions are not cached.
        """
        cache = self.__dict__.get("_launches")
        if cache is None:
            cache = self.__dict__.setdefault("_launches", BoundedCache(LAUNCHES_KEPT, "launches"))
        try:
            return cache.get(key, make)
        except TypeError:  # e.g. dimensions given as lists
            return make()

    def configure(self, griddim: Dims, blockdim: Dims, stream: object = 0, sharedmem: int = 0,
                  timeout: float | None = None) -> Launch:
        """A :class:`Launch` of this kernel on ``griddim`` blocks of ``blockdim`` threads.

        ``timeout`` (seconds) bounds a Dask task that runs the launch on a GPU
        worker, in place of the worker's ``daskgpu.launch-timeout``: over it, the
        task fails naming the kernel and the limit, and the worker's process is
        replaced, freeing the GPU of a kernel that would not end.

        Examples
        --------
        >>> import daskgpu as dg
        >>> from numba import cuda
        >>> @dg.jit("void(float32[::1])")
        ... def fill(out):
        ...     i = cuda.grid(1)
        ...     if i < out.size:
        ...         out[i] = i
        >>> fill.configure(4, 256)
        <Launch fill LaunchConfig(griddim=(4, 1, 1), blockdim=(256, 1, 1))>
        """
        def make() -> Launch:
            return Launch(self._launchable(), LaunchConfig(griddim, blockdim, stream, sharedmem),
                          check_timeout(timeout))

        if stream or timeout is not None:
            return make()
        return self._launch(("grid", griddim, blockdim, sharedmem), make)

    def forall(self, ntasks: Dims, tpb: int = 0, stream: object = 0, sharedmem: int = 0,
               timeout: float | None = None) -> Launch:
        """A :class:`Launch` covering ``ntasks`` threads, block size from occupancy.

        ``ntasks`` may be a tuple for kernels that use ``cuda.grid(2)`` or
        ``cuda.grid(3)``. ``timeout`` as for :meth:`configure`.

        Examples
        --------
        >>> import daskgpu as dg
        >>> from numba import cuda
        >>> @dg.jit("void(float32[::1])")
        ... def fill(out):
        ...     i = cuda.grid(1)
        ...     if i < out.size:
        ...         out[i] = i
        >>> fill.forall(1000)
        <Launch fill LaunchConfig(ntasks=1000)>
        """
        def make() -> Launch:
            return Launch(self._launchable(), LaunchConfig(ntasks=ntasks, tpb=tpb, stream=stream,
                                             sharedmem=sharedmem), check_timeout(timeout))

        if stream or timeout is not None:
            return make()
        return self._launch(("forall", ntasks, tpb, sharedmem), make)

    def _launchable(self) -> Launchable:
        # Each kind of kernel mixing this in has the images and dispatch a Launch uses.
        return cast("Launchable", self)

    # -- dispatch, shared by both kinds of kernel ----------------------------
    def _run(self, image: KernelImage, config: LaunchConfig, args: Sequence[Any],
             infos: Sequence[Any]) -> Any:
        backends.for_image(image).run(image, config, args, infos)
        return written_result(args, image.writes)


def check_timeout(seconds: object) -> float | None:
    """A launch's time limit checked: None, or a finite number of seconds above 0.

    Any real number serves, NumPy's included (``np.float32(2)``, ``np.int64(5)``);
    booleans, NaN, 0, negatives and infinity are refused, as ``socket.settimeout``
    and ``threading.Lock.acquire`` refuse what they cannot wait: no limit is said
    one way, None.

    Examples
    --------
    >>> import numpy as np
    >>> check_timeout(np.int64(5)), check_timeout(np.float32(2.5)), check_timeout(None)
    (5.0, 2.5, None)
    >>> check_timeout(float("inf"))
    Traceback (most recent call last):
    ...
    daskgpu._errors.LaunchConfigError: timeout=inf: give the most seconds a task running ...
    """
    import math
    import numbers

    if seconds is None:
        return None
    if (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
            or not 0 < float(seconds) < math.inf):  # NaN fails the comparison too
        raise LaunchConfigError(
            f"timeout={seconds!r}: give the most seconds a task running the launch may "
            "take, a finite number above 0, or None for the worker's daskgpu.launch-timeout")
    return float(seconds)
