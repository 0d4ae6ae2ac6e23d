"""The PTX-only kernel a worker receives: compiled images as plain data."""

from __future__ import annotations

from daskgpu._errors import PicklingError
from daskgpu._runtime.dispatch import select_image
from daskgpu._runtime.launch import LaunchAPI


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
