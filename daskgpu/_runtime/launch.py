"""Launches, and the PTX-only kernel a worker receives.

Everything here is plain data plus dispatch; it imports neither numba nor a GPU
library at module level, so unpickling a launch is cheap and needs no device.
"""

from __future__ import annotations

import numpy as np

from daskgpu import _config
from daskgpu._errors import LaunchConfigError, PicklingError
from daskgpu._image.argspec import describe, mismatch, passed_value, signature_str
from daskgpu._image.array_info import Zeroed, array_info, has_layout
from daskgpu._image.launch_config import LaunchConfig
from daskgpu._image.random_states import RandomStates


def written_result(args, writes):
    """What a launch returns: ``None``, the one written array, or a tuple of them."""
    if not writes:
        return None
    if len(writes) == 1:
        return unwrap(args[writes[0]])
    return tuple(unwrap(args[i]) for i in writes)


def unwrap(arg):
    if type(arg) is Zeroed:
        return arg.array
    if type(arg).__module__ == "numba.cuda.args":  # cuda.In / Out / InOut
        return arg.value
    return arg


class Launch:
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

    __slots__ = ("kernel", "config", "_fast")

    def __init__(self, kernel, config: LaunchConfig):
        self.kernel = kernel
        self.config = config
        self._fast = None  # the runtime's fast function for repeats of the last launch

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:
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
        # must pick what select_image would.
        if image.py_func is None and not _config.simulating() and image is self.kernel.images[0]:
            from daskgpu._runtime.launcher import device_launch

            images = self.kernel.launch_images()
            self._fast = device_launch(image, self.config, infos, args, images)
        return result

    def __reduce__(self):
        return Launch, (self.kernel, self.config)

    def __repr__(self):
        return f"<Launch {self.kernel.__name__} {self.config!r}>"

    @property
    def __name__(self):  # Dask names tasks after their function
        return self.kernel.__name__


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
_LAUNCHES_KEPT = 64


class LaunchAPI:
    """Numba's launch syntax, shared by client and PTX-only kernels."""

    def __getitem__(self, config) -> Launch:
        """``kernel[griddim, blockdim]`` or ``kernel[griddim, blockdim, stream, sharedmem]``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise LaunchConfigError(
                "launch as kernel[griddim, blockdim] or "
                f"kernel[griddim, blockdim, stream, sharedmem], got kernel[{config!r}]"
            )
        return self.configure(*config)

    def _launch(self, key, make) -> Launch:
        """The :class:`Launch` for ``key``, made once per kernel and configuration.

        ``kernel[grid, block](...)`` in a loop then reuses one Launch and its
        fast path. Configurations with a stream (objects, kept alive by a
        cache) or unhashable dimensions are not cached. At most
        :data:`_LAUNCHES_KEPT` are; a full cache starts afresh, which, unlike
        evicting one entry, is safe while other threads use it.
        """
        cache = self.__dict__.setdefault("_launches", {})
        try:
            launch = cache.get(key)
        except TypeError:  # e.g. dimensions given as lists
            return make()
        if launch is None:
            launch = make()
            if len(cache) >= _LAUNCHES_KEPT:
                cache.clear()
            cache[key] = launch
        return launch

    def configure(self, griddim, blockdim, stream=0, sharedmem=0) -> Launch:
        """A :class:`Launch` of this kernel on ``griddim`` blocks of ``blockdim`` threads.

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
        def make():
            return Launch(self, LaunchConfig(griddim, blockdim, stream, sharedmem))

        if stream:
            return make()
        return self._launch(("grid", griddim, blockdim, sharedmem), make)

    def forall(self, ntasks, tpb=0, stream=0, sharedmem=0) -> Launch:
        """A :class:`Launch` covering ``ntasks`` threads, block size from occupancy.

        ``ntasks`` may be a tuple for kernels that use ``cuda.grid(2)`` or
        ``cuda.grid(3)``.

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
        def make():
            return Launch(self, LaunchConfig(ntasks=ntasks, tpb=tpb, stream=stream,
                                             sharedmem=sharedmem))

        if stream:
            return make()
        return self._launch(("forall", ntasks, tpb, sharedmem), make)

    # -- dispatch, shared by both kinds of kernel ----------------------------
    def _run(self, image, config, args, infos):
        if image.py_func is not None:
            from daskgpu._runtime import simulator

            simulator.run(image, config, args)
        else:
            from daskgpu._runtime.launcher import run

            run(image, config, args, infos)
        return written_result(args, image.writes)


def select_image(name, images, args, infos=None, unsafe=True):
    """The image that Numba's dispatcher would pick for ``args``; else ``TypeError``.

    ``infos`` are the arguments' :func:`array_info`, when already read. As
    Numba: an image that takes every argument as it is wins, the one needing
    the fewest and least lossy conversions first (a Python float takes float64
    over float32). With none, and ``unsafe`` (a kernel that cannot compile
    more signatures: Numba's eager dispatchers, every kernel on a worker), an
    image reached by unsafe casts is taken: integers of any width or sign
    wrap as C casts do, and an integer array is read as the signature's
    integer dtype of the same size (numba-cuda's single-signature kernels
    pass arrays unchecked; daskgpu reinterprets nothing else).
    """
    if infos is None:
        infos = [array_info(a) for a in args]
    best, best_cost = None, None
    for image in images:
        specs = image.args
        if len(specs) == len(args) and all(
            spec.matches(info, a) for spec, info, a in zip(specs, infos, args)
        ):
            if len(images) == 1:
                return image
            cost = conversion_cost(specs, infos, args)
            if best is None or cost < best_cost:
                best, best_cost = image, cost
                if not any(cost):
                    break
    if best is None and unsafe:
        for image in images:
            specs = image.args
            if len(specs) == len(args) and all(
                spec.matches(info, a) or _casts_unsafely(spec, info, a)
                for spec, info, a in zip(specs, infos, args)
            ):
                cost = (sum(not spec.matches(info, a) for spec, info, a in zip(specs, infos, args)),
                        conversion_cost(specs, infos, args))
                if best is None or cost < best_cost:
                    best, best_cost = image, cost
    if best is not None:
        return best
    received = "(" + ", ".join(describe(a) for a in args) + ")"
    shipped = "\n  ".join(
        signature_str(im.args) + _why_not(im, args) for im in images
    ) or "(none)"
    raise TypeError(
        # "No matching definition" first, as numba-cuda's message starts.
        f"No matching definition: no compiled signature of kernel {name!r} matches the "
        f"arguments {received}.\n"
        f"Compiled signatures:\n  {shipped}\n"
        "Pass arguments of one of these types (arrays of that dtype, rank and layout), "
        "or compile the signature on the client first: kernel.compile(sig) or "
        "kernel.specialize(*args)."
    )


# What each parameter kind takes by an unsafe cast, as numba-cuda's ctypes
# conversion of that value succeeds: Python and numpy numbers of these kinds.
_UNSAFE_SOURCES = {"i": "biu", "u": "biu", "f": "biuf", "c": "biufc"}


def _casts_unsafely(spec, info, value) -> bool:
    """Whether ``value`` reaches ``spec`` by one of Numba's unsafe casts."""
    if spec.enum:  # nothing converts to an enum member
        return False
    want = spec.np_dtype if spec.kind in ("array", "scalar") else None
    if spec.kind == "array":
        return (info is not None and len(info.shape) == spec.ndim
                and info.dtype.kind in "iu" and want.kind in "iu"
                and info.dtype.itemsize == want.itemsize
                and (spec.layout == "A" or has_layout(info.shape, info.strides, info.dtype.itemsize,
                                                       spec.layout)))
    if spec.kind == "tuple":
        members = spec.members
        value = passed_value(value)
        return info is None and isinstance(value, tuple) and len(value) == len(members) and all(
            m.matches(array_info(v), v) or _casts_unsafely(m, array_info(v), v)
            for m, v in zip(members, value))
    if spec.kind != "scalar" or info is not None:
        return False
    have = _numba_scalar_dtype(value)
    return have is not None and have.kind in _UNSAFE_SOURCES.get(want.kind, "")


def conversion_cost(specs, infos, args) -> tuple:
    """How far ``args`` are from ``specs``: counts of (unsafe, safe, promoting) casts.

    Python scalars are typed as Numba types them (int64, float64, complex128);
    an "A"-layout array parameter given a contiguous array counts as promoting.
    """
    unsafe = safe = promote = 0
    for spec, info, value in zip(specs, infos, args):
        if spec.kind == "array":
            if spec.layout == "A" and info is not None and len(info.shape) > 1:
                promote += 1
            continue
        if spec.kind != "scalar":
            continue
        have = _numba_scalar_dtype(value)
        want = spec.np_dtype
        if have is None or have == want:
            continue
        if np.can_cast(have, want, "safe"):
            if have.kind == want.kind or (have.kind in "iu" and want.kind in "iu"):
                promote += 1
            else:
                safe += 1
        else:
            unsafe += 1
    return (unsafe, safe, promote)


def _numba_scalar_dtype(value):
    if isinstance(value, (bool, np.bool_)):
        return np.dtype(bool)
    if isinstance(value, np.generic):
        return value.dtype
    if isinstance(value, int):
        return np.dtype(np.int64)
    if isinstance(value, float):
        return np.dtype(np.float64)
    if isinstance(value, complex):
        return np.dtype(np.complex128)
    return None


def _why_not(image, args) -> str:
    if len(image.args) != len(args):
        return f": takes {len(image.args)} arguments, got {len(args)}"
    for i, (spec, a) in enumerate(zip(image.args, args)):
        reason = mismatch(spec, a)
        if reason:
            return f": argument {i} {reason}"
    return ""


class PTXKernel(LaunchAPI):
    """A compiled kernel as plain data: its images, one per signature.

    This is what a client :class:`~daskgpu.Kernel` becomes when pickled and what
    :func:`daskgpu.load` returns. It launches like a Numba kernel but cannot
    compile new signatures.

    Attributes
    ----------
    images : tuple of KernelImage
        The compiled images, one per signature; a launch picks the one its
        arguments match.
    signatures : list of str
        Their signatures, as strings.
    __name__ : str
        The kernel's function name.

    Examples
    --------
    >>> import os, tempfile, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(int32[::1])")
    ... def count(x):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         x[i] = i
    >>> path = os.path.join(tempfile.mkdtemp(), "count.dgk")
    >>> _ = dg.save(count, path)
    >>> loaded = dg.load(path)  # no numba needed from here on
    >>> loaded
    <PTXKernel count signatures=['(int32[::1])']>
    >>> loaded.images[0].targets
    ((7, 5),)
    >>> loaded.forall(10)
    <Launch count LaunchConfig(ntasks=10)>
    """

    def __init__(self, images):
        images = tuple(images)
        if not images:
            raise PicklingError("a PTXKernel needs at least one compiled image")
        self.images = images
        self.__name__ = images[0].name.rpartition(".")[2]

    @property
    def signatures(self):
        """The compiled signatures, as strings, in image order."""
        return [im.signature for im in self.images]

    def select_image(self, args, infos=None):
        """The image a launch on ``args`` runs, as Numba's dispatcher picks it; else ``TypeError``.

        ``infos`` are the arguments' array facts, when already read.
        """
        return select_image(self.__name__, self.images, args, infos)

    def launch_images(self):
        """The container of this kernel's images (fixed: a PTXKernel compiles nothing)."""
        return self.images

    def __reduce__(self):
        return PTXKernel, (self.images,)

    def __repr__(self):
        return f"<PTXKernel {self.__name__} signatures={self.signatures}>"
