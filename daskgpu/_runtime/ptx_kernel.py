"""The PTX-only kernel a worker receives: compiled images as plain data."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from daskgpu._errors import PicklingError
from daskgpu._runtime.dispatch import select_image
from daskgpu._runtime.launch import LaunchAPI

if TYPE_CHECKING:
    from daskgpu._image.image import KernelImage


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

    images: tuple[KernelImage, ...]

    def __init__(self, images: Iterable[KernelImage]) -> None:
        images = tuple(images)
        if not images:
            raise PicklingError("a PTXKernel needs at least one compiled image")
        self.images = images
        self.__name__ = images[0].name.rpartition(".")[2]

    @property
    def signatures(self) -> list[str]:
        """The compiled signatures, as strings, in image order."""
        return [im.signature for im in self.images]

    def select_image(self, args: Sequence[Any], infos: Sequence[Any] | None = None
                     ) -> KernelImage:
        """The image a launch on ``args`` runs, as Numba's dispatcher picks it; else ``TypeError``.

        ``infos`` are the arguments' array facts, when already read.
        """
        return select_image(self.__name__, self.images, args, infos)

    def launch_images(self) -> tuple[KernelImage, ...]:
        """The container of this kernel's images (fixed: a PTXKernel compiles nothing)."""
        return self.images

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise unconfigured(self.__name__)

    def __reduce__(self):
        return PTXKernel, (self.images,)

    def __repr__(self) -> str:
        return f"<PTXKernel {self.__name__} signatures={self.signatures}>"


def unconfigured(name: str) -> TypeError:
    """The error of calling a kernel without a launch configuration, locally or as a task."""
    return TypeError(
        f"kernel {name!r} must be launched with a configuration: {name}[griddim, blockdim]"
        f"(...) or {name}.forall(n)(...); to run it as a Dask task, submit the launch: "
        f"client.submit({name}.forall(n), *args) or client.submit({name}[griddim, blockdim], "
        "*args)"
    )


class UncompiledKernel:
    """What a kernel with no compiled signature pickles to: any use raises the fix.

    A lazy kernel that a task's own function launches (``da.map_blocks(f)``
    where ``f`` calls ``kernel[...]``) is pickled with ``f``, inside Dask's
    serialization, which would bury an error raised there under its own
    ("Could not serialize object of type ..."). It travels as this placeholder
    instead, and the task fails with the one error that names the fix.

    Examples
    --------
    >>> k = UncompiledKernel("double")
    >>> k.forall(4)
    Traceback (most recent call last):
    ...
    daskgpu._errors.PicklingError: kernel 'double' reached a Dask task with no compiled ...
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _refuse(self, *args, **kwargs):
        raise PicklingError(
            f"kernel {self.name!r} reached a Dask task with no compiled signature, and "
            f"workers do not compile: compile it on the client first, with "
            f"{self.name}.specialize(*example_args) (or dg.jit with a signature), or map it "
            f"with dg.map_kernel({self.name}, ...), which compiles for the chunks' types"
        )

    __call__ = __getitem__ = _refuse

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._refuse()

    def __reduce__(self):
        return UncompiledKernel, (self.name,)

    def __repr__(self):
        return f"<UncompiledKernel {self.name}>"
