"""What a ``daskgpu batch`` job reads: zarr arrays and ``.npy`` files, checked.

Every input is checked before anything runs (shape, dtype, byte order,
chunking), and its path is made absolute here, on the client, once: the
tasks carry that path, so workers in another directory read the same array,
and the job's record (``job.json``) names it as read.
"""

from __future__ import annotations

import numbers
import os

import numpy as np

from daskgpu._errors import BatchError

__all__ = ["NpyFile", "as_paths", "import_zarr", "open_input", "open_inputs", "resolve_inputs"]

_NPY_MAGIC = b"\x93NUMPY"


def _npy_header(path):
    """``(shape, dtype)`` from a ``.npy`` file's header, reading nothing else."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise BatchError(
                    f"{path!r} is not a .npy file (it lacks the .npy header); give an "
                    "array written by numpy.save, or a zarr array directory")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except IsADirectoryError:
        raise BatchError(f"{path!r} is a directory, not a .npy file; a zarr input is a "
                         "directory without the .npy suffix") from None
    except FileNotFoundError:
        raise BatchError(f"no input at {path!r}: the file does not exist") from None
    except (OSError, ValueError) as exc:
        raise BatchError(f"cannot read {path!r} as a .npy file ({exc}); give an array "
                         "written by numpy.save") from None
    if dtype.hasobject:
        raise BatchError(f"{path!r} holds Python objects; batch reads numeric arrays only "
                         "(save them with a numeric dtype)")
    return tuple(shape), dtype


class NpyFile:
    """A ``.npy`` file read lazily through a memory map: a small picklable array source.

    ``dask.array.from_array(NpyFile(path), chunks)`` puts the path in the
    graph, not the data; each task maps the file on its worker and copies out
    its chunk, so workers must see the same path.

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(6.0).reshape(2, 3))
    >>> f = NpyFile(path)
    >>> f.shape, f.dtype
    ((2, 3), dtype('float64'))
    >>> f[1, 1:]
    array([4., 5.])
    """

    def __init__(self, path):
        self.path = os.path.abspath(os.fspath(path))
        self._map = None
        self.shape, self.dtype = _npy_header(self.path)
        self.ndim = len(self.shape)

    def __getitem__(self, index):
        if self._map is None:
            self._map = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return np.array(self._map[index])

    def __reduce__(self):
        return NpyFile, (self.path,)

    def __dask_tokenize__(self):
        st = os.stat(self.path)
        return "daskgpu.NpyFile", self.path, st.st_mtime_ns, st.st_size

    def __repr__(self):
        return f"NpyFile({self.path!r}, shape={self.shape}, dtype={self.dtype})"


def _open_source(path):
    """``(source, kind)``: an :class:`NpyFile` or a zarr array, checked, unchunked.

    The source holds the absolute path, which is what its tasks carry.
    """
    path = os.path.abspath(os.fspath(path))
    if path.endswith(".npy") or (os.path.isfile(path) and _is_npy(path)):
        return NpyFile(path), "npy"
    if not os.path.exists(path):
        raise BatchError(f"no input at {path!r}: give a zarr array directory or a .npy file")
    if os.path.isfile(path):
        raise BatchError(f"{path!r} is a file but neither a .npy file nor a zarr array "
                         "(a directory); give an array written by numpy.save, or a zarr "
                         "array")
    zarr = import_zarr()
    try:
        return zarr.open_array(path, mode="r"), "zarr"
    except Exception as exc:  # a group, or not zarr at all
        raise BatchError(f"cannot open {path!r} as a zarr array ({type(exc).__name__}: "
                         f"{exc}); give a zarr array, or a .npy file") from None


def _is_npy(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
    except OSError:
        return False


def open_input(path, chunks=None):
    """A dask array reading ``path``: a zarr array (directory) or a ``.npy`` file.

    ``chunks`` defaults to the zarr array's chunks, else dask's ``"auto"``.
    """
    import dask.array as da
    from dask.base import tokenize

    source, kind = _open_source(path)
    _check_dtype(path, source.dtype)
    if kind == "npy":
        meta = np.empty((0,) * source.ndim, source.dtype)
        return da.from_array(source, chunks=chunks or "auto", meta=meta,
                             name=f"npy-{tokenize(source, chunks)}")
    # As da.from_zarr reads it, which Dask's array expressions do not have.
    return da.from_array(source, chunks=chunks or source.chunks,
                         meta=np.empty((0,) * source.ndim, source.dtype),
                         name=f"from-zarr-{tokenize(source, chunks)}")


def _check_dtype(path, dtype):
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.kind not in "biufc":
        raise BatchError(f"input {os.fspath(path)!r} has dtype {dtype}; batch reads numeric "
                         "arrays (bool, integer, float or complex)")
    if not dtype.isnative:
        order = {">": "big-endian", "<": "little-endian"}[dtype.byteorder]
        raise BatchError(
            f"input {os.fspath(path)!r} is {order} ({dtype.str}), but kernels take this "
            f"machine's byte order ({dtype.newbyteorder('=').str}); convert it first, e.g. "
            f"numpy.save(path, a.astype({dtype.newbyteorder('=').str!r}))")


def import_zarr():
    """The zarr module, or a :class:`BatchError` saying how to install it."""
    try:
        import zarr
    except ModuleNotFoundError:
        raise BatchError("daskgpu batch stores its outputs with zarr, which is not "
                         "installed: pip install 'daskgpu[batch]'") from None
    return zarr


def _check_chunks(chunks, ndim):
    """``chunks`` as dask takes it, refused here when dask would fail obscurely."""
    if chunks is None or chunks == "auto":
        return chunks
    parts = chunks if isinstance(chunks, tuple | list) else (chunks,)
    if isinstance(chunks, tuple | list) and len(parts) != ndim:
        raise BatchError(f"chunks={tuple(chunks)!r} has {len(parts)} dimension(s), but the "
                         f"inputs have {ndim}; give one size per dimension, or one number")
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 1:
            raise BatchError(f"chunks={chunks!r}: each chunk size must be a whole number of "
                             "at least 1, e.g. chunks=1000 or chunks=(256, 256)")
    return tuple(int(p) for p in parts) if isinstance(chunks, tuple | list) else int(chunks)


def resolve_inputs(inputs) -> list:
    """The input paths made absolute against this process's directory, once.

    Relative paths would otherwise be opened where each worker runs.

    Examples
    --------
    >>> import os
    >>> resolve_inputs(["x.zarr"]) == [os.path.join(os.getcwd(), "x.zarr")]
    True
    """
    return [os.path.abspath(os.fspath(p)) for p in as_paths(inputs, "inputs")]


def as_paths(value, what):
    """A sequence of ``inputs`` / ``outputs``, never a lone path iterated by character."""
    if isinstance(value, str | bytes | os.PathLike):
        raise BatchError(f"{what} is a list of paths, got the single path {value!r}; write "
                         f"{what}=[{os.fspath(value)!r}]")
    try:
        return list(value)
    except TypeError:
        raise BatchError(f"{what} is a list of paths, got {value!r}") from None


def open_inputs(inputs, chunks) -> list:
    """The inputs as dask arrays of one shape and one chunking."""
    sources = [_open_source(p)[0] for p in inputs]
    first = sources[0]
    for path, s in zip(inputs, sources):
        _check_dtype(path, s.dtype)
        if tuple(s.shape) != tuple(first.shape):
            raise BatchError(f"input {os.fspath(path)!r} has shape {tuple(s.shape)}, but "
                             f"{os.fspath(inputs[0])!r} has {tuple(first.shape)}; batch "
                             "inputs share one shape")
    if not first.shape:
        raise BatchError(f"input {os.fspath(inputs[0])!r} is a 0-d array; batch runs over "
                         "arrays of at least one dimension")
    chunks = _check_chunks(chunks, len(first.shape))
    arrays = [open_input(p, chunks) for p in inputs]
    # By default the first zarr input's chunks, so that it is read as stored.
    target = next((a.chunks for p, a in zip(inputs, arrays)
                   if chunks is None and not isinstance(_open_source(p)[0], NpyFile)),
                  arrays[0].chunks)
    return [a if a.chunks == target else open_input(p, target)
            for p, a in zip(inputs, arrays)]
