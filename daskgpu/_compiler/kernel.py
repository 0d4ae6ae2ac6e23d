"""The client-side kernel: compiles signatures, launches locally, ships PTX-only."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

from daskgpu._compiler.compile import CompileOptions, compile_image
from daskgpu._compiler.signatures import normalize, typeof_args
from daskgpu._errors import PicklingError
from daskgpu._runtime import backends
from daskgpu._runtime.dispatch import select_image
from daskgpu._runtime.launch import LaunchAPI, written_result
from daskgpu._runtime.ptx_kernel import PTXKernel, UncompiledKernel, unconfigured

if TYPE_CHECKING:
    from daskgpu._image.image import KernelImage
    from daskgpu._image.launch_config import LaunchConfig

#: A compute capability: ``"8.0"``, ``"sm_80"``, ``80`` or ``(8, 0)``.
ComputeCapability = str | int | tuple[int, int]
#: A Numba signature: a string such as ``"void(float32[::1])"`` or a tuple of
#: argument types. Signature objects (``numba.void(numba.float32[::1])``) are
#: taken too; numba's hints make them ``Any``, which passes.
Signature = str | tuple[Any, ...]
#: ``jit(inline=)``: Numba's ``"never"``, ``"always"`` or a cost-model function.
Inline = Literal["never", "always"] | Callable[..., bool]


class Kernel(LaunchAPI):
    """A Numba CUDA kernel compiled on the client, one :class:`KernelImage` per signature.

    Made by :func:`jit` or :func:`kernel`. Launch it as in Numba
    (``k[griddim, blockdim](*args)``), or make a :class:`Launch` with
    :meth:`configure` / :meth:`forall` to ship to Dask workers. Pickled, it
    becomes a :class:`PTXKernel`: the compiled signatures as plain data.

    Attributes
    ----------
    py_func : function
        The Python function, compiled here; it never travels (unless simulating).
    options : CompileOptions
        The ``jit`` options: targets, fastmath, debug, lineinfo, max_registers.
    images : tuple of KernelImage
        One compiled image per signature, in compile order.
    signatures : list of str
        The compiled signatures, as strings.

    Examples
    --------
    Compiling needs no GPU: the PTX is made for ``daskgpu.target-cc``.

    >>> import numpy as np, pickle, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1], float32)")
    ... def scale(x, a):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         x[i] *= a
    >>> scale
    <daskgpu.Kernel scale signatures=['(float32[::1], float32)']>
    >>> scale.images[0].writes  # inferred from the typed IR: x is written
    (0,)
    >>> scale.forall(1000)
    <Launch scale LaunchConfig(ntasks=1000)>
    >>> pickle.loads(pickle.dumps(scale))  # what travels to a worker
    <PTXKernel scale signatures=['(float32[::1], float32)']>
    >>> x = np.ones(1000, np.float32)
    >>> scale[4, 256](x, 2.0)  # doctest: +SKIP
    >>> float(x[0])  # doctest: +SKIP
    2.0
    """

    py_func: Callable[..., Any]
    options: CompileOptions

    def __init__(self, py_func: Callable[..., Any], signatures: Iterable[Signature] = (),
                 options: CompileOptions | None = None) -> None:
        self.py_func = py_func
        self.options = options or CompileOptions()
        self._images: dict[tuple[Any, ...], KernelImage] = {}
        self._lock = threading.Lock()
        # Numba compiles new signatures on demand only for lazily jitted kernels.
        self._lazy = not signatures
        functools.update_wrapper(self, py_func)
        for sig in signatures:
            self.compile(sig)

    # -- compiling ----------------------------------------------------------
    def compile(self, sig: Signature) -> KernelImage:
        """Compile ``sig`` (a Numba signature) if not yet compiled; return its image.

        Examples
        --------
        >>> import daskgpu as dg
        >>> from numba import cuda
        >>> @dg.jit
        ... def double(x):
        ...     i = cuda.grid(1)
        ...     if i < x.size:
        ...         x[i] *= 2
        >>> double.compile("void(float64[::1])").signature
        '(float64[::1])'
        """
        argtypes = normalize(sig)
        with self._lock:
            image = self._images.get(argtypes)
            if image is None:
                image = compile_image(self.py_func, argtypes, self.options)
                self._images[argtypes] = image
        return image

    def specialize(self, *args: Any) -> Kernel:
        """A kernel compiled for exactly the types of ``args``, as Numba's ``specialize``.

        Examples
        --------
        >>> import numpy as np, daskgpu as dg
        >>> from numba import cuda
        >>> @dg.jit
        ... def double(x):
        ...     i = cuda.grid(1)
        ...     if i < x.size:
        ...         x[i] *= 2
        >>> double.specialize(np.zeros(4, np.float32)).signatures
        ['(float32[::1])']
        """
        return Kernel(self.py_func, [typeof_args(args)], self.options)

    def launch_images(self) -> Collection[KernelImage]:
        """The live container of this kernel's images: it grows as the kernel compiles.

        A launch's repeat path watches its length to know when another image
        could take its arguments.
        """
        return self._images.values()

    @property
    def images(self) -> tuple[KernelImage, ...]:
        """The compiled :class:`KernelImage` objects, in compile order."""
        return tuple(self._images.values())

    @property
    def argtypes(self) -> list[tuple[Any, ...]]:
        """The compiled signatures as tuples of Numba types, in compile order."""
        return list(self._images)

    @property
    def signatures(self) -> list[str]:
        """The compiled signatures, as strings."""
        return [im.signature for im in self.images]

    @functools.cached_property
    def parameter_names(self) -> tuple[str, ...] | None:
        """The names of the kernel's parameters, from its Python function (Numba makes
        each one a parameter of the kernel); None where they are not plain positional
        ones."""
        import inspect

        try:
            params = inspect.signature(self.py_func).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
            return None
        return tuple(p.name for p in params)

    def select_image(self, args: Sequence[Any], infos: Sequence[Any] | None = None
                     ) -> KernelImage:
        """The image a launch on ``args`` runs, as Numba's dispatcher picks it.

        A lazy kernel compiles a new signature for arguments no image takes
        (as Numba's lazy dispatchers do); an eager one casts or raises
        ``TypeError``. ``infos`` are the arguments' array facts, when already read.

        Examples
        --------
        >>> import numpy as np, daskgpu as dg
        >>> from numba import cuda
        >>> @dg.jit
        ... def double(x):
        ...     i = cuda.grid(1)
        ...     if i < x.size:
        ...         x[i] *= 2
        >>> double.select_image((np.zeros(4, np.float32),)).signature
        '(float32[::1])'
        """
        try:
            # A lazy kernel compiles for new types where an eager one casts, as in Numba.
            return select_image(self.__name__, self.images, args, infos, unsafe=not self._lazy,
                                names=self.parameter_names)
        except TypeError:
            if not self._lazy:
                raise
        return self.compile(typeof_args(args))

    def _run(self, image: KernelImage, config: LaunchConfig, args: Sequence[Any],
             infos: Sequence[Any]) -> Any:
        # The simulator runs the live function; the GPU the image's PTX.
        backends.current().run(image, config, args, infos, function=self.py_func)
        return written_result(args, image.writes)

    def ptx_kernel(self, with_function: bool | None = None) -> PTXKernel:
        """This kernel as shipped: its compiled images, PTX-only.

        With ``with_function`` (by default, while ``daskgpu.simulate`` is on)
        the images also carry the Python function, so that simulated workers
        can run it.
        """
        images = self.images
        if not images:
            raise PicklingError(
                f"kernel {self.__name__!r} has no compiled signature to ship. Give one "
                f"(dg.jit('void(float32[::1], ...)')), call {self.__name__}.compile(sig), "
                f"or {self.__name__}.specialize(*args) with example arguments."
            )
        if with_function is None:
            with_function = backends.current().simulated
        if with_function:  # simulated workers run the Python function
            blob = function_blob(self.py_func)
            images = tuple(im.with_py_func(blob) for im in images)
        return PTXKernel(images)

    def __reduce__(self):
        if not self.images:
            # Reached from a task's own function (da.map_blocks(f), f launching it): failing
            # in Dask's serialization would bury the fix under its errors; the placeholder
            # fails the task with it.
            return UncompiledKernel, (self.__name__,)
        return PTXKernel, (self.ptx_kernel().images,)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise unconfigured(self.__name__)

    def __repr__(self) -> str:
        return f"<daskgpu.Kernel {self.__name__} signatures={self.signatures}>"


#: Serialises changes to cloudpickle's process-wide by-value registry.
_BY_VALUE_LOCK = threading.Lock()


def function_blob(fn: Callable[..., Any]) -> bytes:
    """``fn`` pickled by value, with what it reaches in its own module.

    cloudpickle pickles a function of an importable module by reference, and a
    long-lived worker then runs its own copy of the module, imported before the
    client's source was edited: stale code under the new image's hash.
    """
    import cloudpickle

    module = sys.modules.get(fn.__module__)
    if module is None or module.__name__ == "__main__":
        return cloudpickle.dumps(fn)  # by value already
    with _BY_VALUE_LOCK:
        registered = module.__name__ in cloudpickle.list_registry_pickle_by_value()
        if not registered:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(fn)
        finally:
            if not registered:
                cloudpickle.unregister_pickle_by_value(module)


@overload
def jit(signature_or_function: Callable[..., Any], *, targets: Iterable[ComputeCapability] = (),
        fastmath: bool = False, debug: bool = False, lineinfo: bool = False,
        max_registers: int | None = None, opt: bool = True,
        link: Iterable[str | os.PathLike[str]] = (), device: bool = False, lto: bool = False,
        launch_bounds: int | tuple[int, ...] | None = None,
        shared_memory_carveout: str | int | None = None, inline: Inline = "never",
        forceinline: bool = False, cache: bool = False,
        extensions: Sequence[object] | None = None) -> Kernel: ...


@overload
def jit(signature_or_function: Signature | list[Signature] | None = None, *,
        targets: Iterable[ComputeCapability] = (),
        fastmath: bool = False, debug: bool = False, lineinfo: bool = False,
        max_registers: int | None = None, opt: bool = True,
        link: Iterable[str | os.PathLike[str]] = (), device: bool = False, lto: bool = False,
        launch_bounds: int | tuple[int, ...] | None = None,
        shared_memory_carveout: str | int | None = None, inline: Inline = "never",
        forceinline: bool = False, cache: bool = False,
        extensions: Sequence[object] | None = None) -> Callable[[Callable[..., Any]], Kernel]: ...


def jit(signature_or_function: Any = None, *, targets: Iterable[ComputeCapability] = (),
        fastmath: bool = False, debug: bool = False, lineinfo: bool = False,
        max_registers: int | None = None, opt: bool = True,
        link: Iterable[str | os.PathLike[str]] = (), device: bool = False, lto: bool = False,
        launch_bounds: int | tuple[int, ...] | None = None,
        shared_memory_carveout: str | int | None = None, inline: Inline = "never",
        forceinline: bool = False, cache: bool = False,
        extensions: Sequence[object] | None = None,
        ) -> Kernel | Callable[[Callable[..., Any]], Kernel]:
    """Compile a Python function as a CUDA kernel that ships to Dask workers as PTX.

    Used like ``numba.cuda.jit``: with signatures the kernel compiles eagerly,
    without them on first launch (or :meth:`Kernel.specialize`). Compiling needs
    no GPU.

    Parameters
    ----------
    signature_or_function : str, list of str, or function, optional
        Numba signature(s) such as ``"void(float32[::1], float32)"``, or the
        function itself when used as a bare decorator.
    targets : sequence of compute capabilities, optional
        PTX targets, such as ``["7.5", "9.0"]``. Each worker links the highest
        target at or below its GPU's. Default: ``daskgpu.target-cc`` (7.5), a
        portable PTX that links on every GPU at or above it. A kernel that uses
        numba-cuda's bfloat16 functions is compiled for 8.0 or above, the GPUs
        numba-cuda supports bfloat16 on.
    fastmath, debug, lineinfo, max_registers, opt
        As in ``numba.cuda.jit``.
    link : sequence of paths
        ``.ptx``, ``.cubin``, ``.fatbin``, ``.ltoir``, ``.o``, ``.a`` or ``.cu``
        files to link in; their bytes travel with the kernel (``.cu`` is
        compiled to PTX here first). What numba-cuda links by itself (the
        float16/bfloat16 shims, NRT, cudadevrt for cooperative groups) is
        added as it would be.
    lto, launch_bounds, shared_memory_carveout, inline, forceinline
        As in ``numba.cuda.jit``: ``lto`` links with link-time optimisation
        (``.cu`` inputs become LTO-IR); the others shape the compiled code or,
        for the carveout, are set on each worker's loaded kernel.
    cache : bool
        numba-cuda's on-disk cache; here the workers' linked kernels are kept
        in daskgpu's disk cache (``daskgpu.cache-dir``) when that is set, and
        this flag is accepted for compatibility.
    extensions : sequence, optional
        numba-cuda argument extensions run Python code at each launch, which
        a PTX-only worker cannot; only an empty sequence is accepted.

    Returns
    -------
    Kernel

    Examples
    --------
    >>> import daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1], float32, float32[::1], float32[::1])")
    ... def saxpy(out, a, x, y):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = a * x[i] + y[i]
    >>> saxpy.signatures
    ['(float32[::1], float32, float32[::1], float32[::1])']
    >>> saxpy.images[0].writes        # only `out` is written
    (0,)
    """
    if device:
        raise TypeError(
            "daskgpu.jit makes kernels; write device functions with "
            "numba.cuda.jit(device=True) and call them from a daskgpu kernel"
        )
    if extensions:
        raise TypeError(
            f"daskgpu.jit cannot ship numba-cuda argument extensions ({list(extensions)!r}): "
            "their prepare_args is Python code run at every launch, and workers run "
            "PTX-only data. Convert such arguments to arrays or numbers before launching."
        )
    options = CompileOptions(
        targets=tuple(targets), fastmath=fastmath, debug=debug, lineinfo=lineinfo,
        max_registers=max_registers, opt=opt, link=tuple(link), lto=lto,
        launch_bounds=launch_bounds, shared_memory_carveout=shared_memory_carveout,
        inline=inline, forceinline=forceinline, cache=cache,
    )
    if callable(signature_or_function):
        return Kernel(signature_or_function, (), options)
    sigs = signature_or_function
    if sigs is None:
        sigs = []
    elif isinstance(sigs, (str, tuple)) or not isinstance(sigs, list):
        sigs = [sigs]
    return lambda fn: Kernel(fn, sigs, options)


def kernel(dispatcher: Any, signatures: Signature | Iterable[Signature] | None = None,
           **options: Any) -> Kernel:
    """Wrap an existing ``numba.cuda.jit`` dispatcher as a daskgpu :class:`Kernel`.

    Parameters
    ----------
    dispatcher : numba.cuda dispatcher
        A kernel made with ``@cuda.jit`` (lazy: an eager one already needed a GPU).
    signatures : list, optional
        Signatures to compile; default: those the dispatcher has compiled.
    **options
        Overrides of the dispatcher's options, as :func:`jit` takes them.

    Examples
    --------
    >>> import daskgpu as dg
    >>> from numba import cuda
    >>> @cuda.jit
    ... def scale(x, a):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         x[i] *= a
    >>> k = dg.kernel(scale, ["void(float64[:], float64)"])
    >>> k.signatures
    ['(float64[:], float64)']
    """
    py_func = getattr(dispatcher, "py_func", None)
    if py_func is None:
        raise TypeError(
            f"dg.kernel takes a numba.cuda.jit dispatcher, got {type(dispatcher).__name__}; "
            "for a plain function use dg.jit"
        )
    if getattr(dispatcher, "targetoptions", {}).get("device"):
        raise TypeError("dg.kernel takes a kernel, not a device function (device=True)")
    numba_opts = getattr(dispatcher, "targetoptions", {})
    merged = {k: numba_opts[k] for k in ("fastmath", "debug", "lineinfo", "max_registers", "opt",
                                          "lto", "launch_bounds", "shared_memory_carveout",
                                          "inline", "forceinline", "cache", "extensions")
              if numba_opts.get(k) is not None}
    if numba_opts.get("link"):
        merged["link"] = tuple(numba_opts["link"])
    merged.update(options)
    if signatures is None:
        signatures = list(getattr(dispatcher, "overloads", {}).keys())
    sigs = [signatures] if isinstance(signatures, str) else list(signatures)
    k = jit(sigs, **merged) if sigs else jit(**merged)
    return k(py_func)
