"""Kernel files: :func:`save` a compiled kernel to a bundle, :func:`load` it back.

The file format (JSON data only, an integrity hash, an optional HMAC, bounds on
size and nesting, every field validated) is :mod:`daskgpu._image.bundle`; this
module turns kernels into bundles and bundles into :class:`PTXKernel`. It
imports neither numba nor a GPU library, so loading works on a worker that has
neither a compiler nor numba.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from daskgpu._errors import PicklingError
from daskgpu._files import atomic_write
from daskgpu._image.bundle import (
    BundleInfo,
    bundle_bytes,
    decode_bundle,
    encode_bundle,
    read_bundle_bytes,
    signing_key,
)
from daskgpu._runtime.kernel_kinds import KernelKind, kind_of
from daskgpu._runtime.ptx_kernel import PTXKernel

if TYPE_CHECKING:
    from daskgpu._runtime.launch import Launchable

__all__ = ["BundleInfo", "load", "read", "save"]


def save(kernel: Launchable, path: str | os.PathLike[str], *,
         key: str | bytes | None = None) -> str:
    """Write a compiled kernel to a bundle file: data only, with an integrity hash.

    The bundle holds every compiled signature of the kernel as PTX text and
    argument specs, never the Python function, and loads with
    :func:`load` on any machine, with or without numba.

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        A kernel from :func:`daskgpu.jit` / :func:`daskgpu.kernel` with at
        least one compiled signature, or a kernel from :func:`load`.
    path : str or os.PathLike
        The file to write (by convention ``*.dgk``); replaced atomically.
    key : str or bytes, optional
        A secret to sign the bundle with (HMAC-SHA256), so that :func:`load`
        with the same key detects tampering. Default: the ``daskgpu.bundle-key``
        setting; unsigned when neither is set.

    Returns
    -------
    str
        The bundle's sha256, as stored in the file.

    Raises
    ------
    PicklingError
        When the kernel has no compiled signature (the message says how to
        give one).

    Examples
    --------
    >>> import os, tempfile, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1])")
    ... def fill(out):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = i
    >>> path = os.path.join(tempfile.mkdtemp(), "fill.dgk")
    >>> digest = dg.save(fill, path)
    >>> dg.load(path).signatures
    ['(float32[::1])']
    """
    images = _images_of(kernel)
    path = os.fspath(path)
    content = encode_bundle(images, path)
    data, digest = bundle_bytes(content, signing_key(key))
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write the bundle {path!r}: the directory "
                                f"{directory!r} does not exist")
    atomic_write(path, data)
    return digest


def _images_of(kernel) -> tuple:
    kind = kind_of(kernel)
    if kind is KernelKind.PTX:
        return kernel.images
    if kind is KernelKind.KERNEL:
        if not kernel.images:
            kernel.ptx_kernel()  # raises PicklingError naming the fix
        # Its compiled images, PTX only: ptx_kernel() adds the Python function
        # while daskgpu.simulate is on, and a bundle never holds it.
        return kernel.images
    if kind is KernelKind.DISPATCHER:
        raise PicklingError(
            f"dg.save takes a daskgpu kernel, got a numba dispatcher "
            f"{getattr(kernel, '__name__', kernel)!r}; wrap it first: "
            "dg.save(dg.kernel(dispatcher, ['void(float32[::1])']), path)"
        )
    raise PicklingError(
        f"dg.save takes a daskgpu Kernel or PTXKernel, got {type(kernel).__name__}; "
        "compile a function with dg.jit('void(...)') first"
    )


def load(path: str | os.PathLike[str], *, key: str | bytes | None = None) -> PTXKernel:
    """Read a kernel bundle written by :func:`save`.

    The file is parsed as JSON only (nothing is unpickled or executed), after
    its size and nesting depth are checked; its integrity hash is checked, its
    HMAC too when a key is set, and every field is validated before the kernel
    is rebuilt. The hash detects corruption; only the key detects tampering.
    Loading needs neither numba nor a GPU; the returned kernel launches like a
    Numba kernel on any machine with a driver.

    Parameters
    ----------
    path : str or os.PathLike
    key : str or bytes, optional
        The secret the bundle was signed with; a bundle without a matching
        HMAC is refused. Default: the ``daskgpu.bundle-key`` setting; with
        neither set, signatures are not checked.

    Returns
    -------
    PTXKernel

    Raises
    ------
    BundleError
        When the file is not a daskgpu bundle, was written by a newer daskgpu,
        is too large or too deeply nested, is corrupt, fails its HMAC, or
        holds an invalid field.

    Examples
    --------
    >>> import os, tempfile, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit("void(float32[::1])")
    ... def fill(out):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = i
    >>> path = os.path.join(tempfile.mkdtemp(), "fill.dgk")
    >>> _ = dg.save(fill, path)
    >>> k = dg.load(path)
    >>> k
    <PTXKernel fill signatures=['(float32[::1])']>
    >>> k.images[0].writes
    (0,)
    """
    return read(path, key=key)[0]


def read(path, *, key=None) -> tuple:
    """``(PTXKernel, BundleInfo)`` of a bundle file; what :func:`load` and the CLI use."""
    path = os.fspath(path)
    secret = signing_key(key)
    images, info = decode_bundle(read_bundle_bytes(path), path, secret)
    return PTXKernel(images), info
