"""Map a kernel over dask arrays: one forall-style launch per chunk.

:func:`map_kernel` validates its arguments, compiles (or selects) one kernel
image on the client, and builds the graph with ``da.map_blocks`` (after
``unify_chunks`` and, for halos, ``da.overlap.overlap``). Each task holds a
:class:`~daskgpu._dask.chunk_task.ChunkLaunch`, what runs on the worker; a
``map_kernel`` over the output of another runs both launches in one task per
chunk (:class:`~daskgpu._dask.chunk_task.Fused`; setting
``daskgpu.fuse-chains``), intermediates on the GPU.
"""

from __future__ import annotations

import math
import operator
import sys
import threading
from contextlib import nullcontext
from numbers import Integral, Number

import numpy as np

from daskgpu import _config
from daskgpu._dask import reduction
from daskgpu._dask.chunk_task import (
    CHUNK, OFFSET, OUT, PER_CHUNK, RANDOM, VALUE, WHOLE, ChunkLaunch, Fused, is_cupy,
)
from daskgpu._image.random_states import STATE_DTYPE, RandomStates
from daskgpu._runtime.launch import PTXKernel

__all__ = ["Out", "map_kernel", "offset"]


class _Offset:
    """``dg.offset``: stands for a chunk's global start index in :func:`map_kernel`.

    Each occurrence expands to one ``int64`` kernel parameter per array
    dimension, in axis order: a 1-D map passes one ``int64``, a 2-D map two
    (row, column). The value is the global index of element 0 of the chunk the
    kernel sees; with ``depth`` that is the start of the extended chunk
    (negative at the lower edge unless ``boundary="none"``).

    Examples
    --------
    >>> import daskgpu as dg, pickle
    >>> dg.offset
    daskgpu.offset
    >>> pickle.loads(pickle.dumps(dg.offset)) is dg.offset
    True
    """

    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self):
        return "offset"  # pickled by reference to the module-level singleton

    def __repr__(self):
        return "daskgpu.offset"

    def __dask_tokenize__(self):
        return "daskgpu.offset"


offset = _Offset()


class Out:
    """An output array of :func:`map_kernel`, allocated per chunk on the worker.

    Parameters
    ----------
    dtype : numpy dtype
        Element type of the output. Required.
    like : array, optional
        Take the shape, and for a dask array also the chunks and the array type
        (NumPy or CuPy), from ``like``. It need not be an argument of the kernel.
    shape : tuple of int, optional
        The shape, when there is no ``like``.
    chunks : optional
        Dask chunks (anything ``dask.array`` accepts). Default: ``like``'s
        chunks, else one chunk that takes the chunking of the arrays it is
        aligned with.
    per_chunk : int or tuple of int, optional
        Instead of an output aligned with the chunks, give every launch its own
        output of this shape. The result has shape ``numblocks + per_chunk``:
        one block per launch, in chunk order. The launch still covers the
        mapped chunk; per-chunk outputs do not change its size.
    combine : str, ufunc or callable, optional
        With ``per_chunk``: reduce the per-chunk outputs across chunks with a
        tree reduction (``split_every=`` on :func:`map_kernel`); the result
        has shape ``per_chunk``. ``"sum"``, ``"prod"``, ``"min"``, ``"max"``,
        a NumPy ufunc of two inputs (``np.add``, ``np.maximum``, ...), or a
        function ``f(a, b) -> array`` of two partials. Partials are NumPy, or
        CuPy (and stay on the device) when the chunks are CuPy.
    fill : number, optional
        With ``per_chunk``: the value each launch's output starts from, which
        must fit ``dtype``. Default: the combine's identity (0 for ``"sum"``,
        1 for ``"prod"``, the dtype's largest value or ``inf`` for ``"min"``,
        its smallest for ``"max"``), else 0.

    Each chunk of an aligned output is allocated zero-filled (NumPy, or CuPy
    when the chunks are CuPy arrays) in the layout the kernel's signature asks
    for.

    Examples
    --------
    >>> import numpy as np, dask.array as da, daskgpu as dg
    >>> x = da.ones(10, chunks=5)
    >>> dg.Out(np.float32, like=x)
    Out(float32, shape=(10,), chunks=((5, 5),))
    >>> dg.Out("int64", shape=(4, 6), chunks=(2, 3))
    Out(int64, shape=(4, 6), chunks=((2, 2), (3, 3)))
    >>> dg.Out(np.int64, per_chunk=256, combine="sum")
    Out(int64, per_chunk=(256,), combine='sum', fill=0)
    """

    __slots__ = ("dtype", "shape", "chunks", "meta", "per_chunk", "combine", "fill", "fold")

    def __init__(self, dtype=None, like=None, shape=None, chunks=None, *, per_chunk=None,
                 combine=None, fill=None):
        import dask.array as da
        from dask.array.core import normalize_chunks
        from dask.array.utils import meta_from_array

        if dtype is None:
            raise TypeError(
                "dg.Out needs a dtype: write dg.Out(np.float32, like=x) or "
                "dg.Out(np.float32, shape=(n,), chunks=c)"
            )
        try:
            self.dtype = np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"dg.Out got dtype {dtype!r}, which numpy cannot read: {exc}") from None
        self.meta = None
        self.per_chunk = self.combine = self.fill = self.fold = None
        if per_chunk is not None:
            self._init_per_chunk(per_chunk, like, shape, chunks, combine, fill)
            return
        if combine is not None or fill is not None:
            raise TypeError(
                "dg.Out(combine=..., fill=...) applies to per-chunk outputs: write "
                "dg.Out(dtype, per_chunk=shape, combine=..., fill=...)"
            )
        if like is not None:
            if shape is not None:
                raise TypeError("dg.Out takes like= or shape=, not both")
            shape = getattr(like, "shape", None)
            if shape is None:
                raise TypeError(
                    f"dg.Out(like=...) needs an array with a shape, got {type(like).__name__}"
                )
            if isinstance(like, da.Array):
                if chunks is None:
                    chunks = like.chunks
                self.meta = meta_from_array(like._meta, len(like.shape), self.dtype)
        elif shape is None:
            raise TypeError(
                "dg.Out needs like= (an array to copy shape and chunks from) or shape="
            )
        shape = (shape,) if isinstance(shape, Integral) else tuple(shape)
        if any(not isinstance(n, Integral) or n < 0 for n in shape):
            raise ValueError(
                f"dg.Out needs a known, non-negative shape, got {shape!r}; for a dask "
                "array of unknown chunk sizes call x.compute_chunk_sizes() first"
            )
        self.shape = tuple(int(n) for n in shape)
        self.chunks = normalize_chunks(
            self.shape if chunks is None else chunks, self.shape, dtype=self.dtype
        )
        if any(math.isnan(c) for dim in self.chunks for c in dim):
            raise ValueError(
                "dg.Out needs known chunk sizes; call x.compute_chunk_sizes() on `like` first"
            )

    def _init_per_chunk(self, per_chunk, like, shape, chunks, combine, fill):
        if like is not None or shape is not None or chunks is not None:
            raise TypeError(
                "dg.Out(per_chunk=shape) takes no like=, shape= or chunks=: a per-chunk "
                "output has its own shape, one per launch"
            )
        shape = (per_chunk,) if isinstance(per_chunk, Integral) else tuple(per_chunk)
        if any(not isinstance(n, Integral) or n < 0 for n in shape):
            raise ValueError(
                f"dg.Out(per_chunk=...) needs a non-negative int or tuple of ints, got "
                f"{per_chunk!r}"
            )
        self.shape = self.per_chunk = tuple(int(n) for n in shape)
        self.chunks = tuple((n,) for n in self.shape)
        if combine is not None:
            self.fold = reduction.check_combine(combine)
            self.combine = combine
        if fill is None:
            fill = reduction.default_fill(combine, self.dtype)
        self.fill = reduction.check_fill(fill, self.dtype).item()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _placeholder(self):
        """A dask array of this shape and chunks that costs no memory per chunk."""
        import dask.array as da

        # Only its chunks are read (to align them): a graph without tasks
        # costs a fraction of da.broadcast_to's (0.16 against 0.03 ms here).
        return da.Array({}, "daskgpu-out-placeholder", self.chunks,
                        meta=np.empty((0,) * len(self.shape), np.bool_))

    def __dask_tokenize__(self):
        from dask.base import tokenize

        meta = None if self.meta is None else type(self.meta).__module__
        return ("daskgpu.Out", self.dtype.str, self.shape, self.chunks, meta, self.per_chunk,
                None if self.combine is None else tokenize(self.combine), self.fill)

    def __repr__(self):
        if self.per_chunk is not None:
            combine = "" if self.combine is None else f", combine={_combine_name(self.combine)}"
            return f"Out({self.dtype.name}, per_chunk={self.per_chunk}{combine}, fill={self.fill!r})"
        return f"Out({self.dtype.name}, shape={self.shape}, chunks={self.chunks})"


def _combine_name(combine) -> str:
    if isinstance(combine, str):
        return repr(combine)
    if isinstance(combine, np.ufunc):
        return f"np.{combine.__name__}"
    return getattr(combine, "__qualname__", repr(combine))


# -- building the graph -------------------------------------------------------

def workers_info(client) -> dict:
    """Every worker's scheduler info (address to dict) from a synchronous client."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed before 2025 lists every worker by default
        info = client.scheduler_info()
    return info.get("workers", {})


class _GPUClusters:
    """Scheduler addresses whose workers were seen offering a ``GPU`` resource.

    Deciding the annotation asks the scheduler for its workers, a round trip
    of a few milliseconds on every ``map_kernel`` call; once a cluster has
    shown GPU workers, its graphs are annotated without asking again (if they
    all leave, annotated tasks wait for one to come back, where plain tasks
    would fail on a worker without a GPU). A cluster seen without any is asked
    again next time, since GPU workers may join it. Bounded by ``size``.
    """

    def __init__(self, size: int = 64):
        self.size = size
        self._seen = set()
        self._lock = threading.Lock()

    def __contains__(self, address) -> bool:
        return address in self._seen

    def add(self, address) -> None:
        with self._lock:
            if len(self._seen) >= self.size:
                self._seen.clear()
            self._seen.add(address)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


#: Clusters known to offer GPUs, by scheduler address (client side).
gpu_clusters = _GPUClusters()


def _gpu_annotation():
    """``dask.annotate(resources={"GPU": 1})`` when the current cluster offers GPUs."""
    import dask

    if "distributed" not in sys.modules:  # no client can be current
        return nullcontext()
    try:
        from distributed import get_client

        client = get_client()
        if client.asynchronous:  # its cached scheduler info lists no workers
            return nullcontext()
        address = client.scheduler.address
        if address in gpu_clusters:
            return dask.annotate(resources={"GPU": 1})
        workers = workers_info(client)
    except Exception:  # no client, or it is gone: build the plain graph
        return nullcontext()
    if any((w.get("resources") or {}).get("GPU") for w in workers.values()):
        gpu_clusters.add(address)
        return dask.annotate(resources={"GPU": 1})
    return nullcontext()


def _check_kernel(kernel):
    if isinstance(kernel, PTXKernel) or (
        hasattr(kernel, "ptx_kernel") and hasattr(kernel, "_select")
    ):
        return
    hint = ""
    if hasattr(kernel, "py_func"):
        hint = " Wrap a numba.cuda.jit dispatcher with dg.kernel(dispatcher) first."
    raise TypeError(
        "map_kernel takes a daskgpu kernel (made by dg.jit or dg.kernel, or loaded "
        f"by dg.load), got {type(kernel).__name__}.{hint}"
    )


def _classify(args):
    """The role of each argument, and the dask arrays and :class:`Out` among them.

    Returns ``(roles, arrays)``: one ``(kind, value)`` per argument, where
    ``value`` indexes ``arrays`` for dask arrays and outputs.
    """
    import dask.array as da
    from dask.base import is_dask_collection

    roles, arrays = [], []
    for pos, a in enumerate(args):
        if isinstance(a, da.Array):
            if any(math.isnan(c) for dim in a.chunks for c in dim):
                raise ValueError(
                    f"map_kernel argument {pos} has unknown chunk sizes {a.chunks}; "
                    "call x.compute_chunk_sizes() first"
                )
            roles.append((CHUNK, len(arrays)))
            arrays.append(a)
        elif isinstance(a, Out) and a.per_chunk is not None:
            roles.append((PER_CHUNK, a))
        elif isinstance(a, Out):
            roles.append((OUT, len(arrays)))
            arrays.append(a)
        elif a is offset:
            roles.append((OFFSET, None))
        elif isinstance(a, RandomStates):
            if a.n is not None or a.start:
                raise TypeError(
                    f"map_kernel argument {pos} is {a!r}; in map_kernel write "
                    f"dg.random_states({a.seed}) without n or start: each chunk gets the "
                    "states of its elements' global indices"
                )
            roles.append((RANDOM, a))
        elif isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__"):
            roles.append((WHOLE, a))
        elif isinstance(a, (Number, np.generic)) and not is_dask_collection(a):
            roles.append((VALUE, a))
        else:
            raise TypeError(
                f"map_kernel argument {pos} is a {type(a).__name__}; pass dask arrays, "
                "numpy or device arrays (passed whole to every chunk), numbers, "
                "dg.Out(dtype, like=x) outputs, dg.offset or dg.random_states(seed)"
            )
    if not arrays:
        raise ValueError(
            "map_kernel needs at least one dask array or dg.Out among the arguments "
            "to take its chunks from (an aligned one: a per-chunk output has no chunks); "
            "for a single launch use kernel.forall(n)(...)"
        )
    return roles, arrays


def _align(arrays, ndim):
    """Unify chunks as ``da.blockwise`` does (right-aligned broadcasting)."""
    from dask.array.core import unify_chunks

    dask_arrays = [a._placeholder() if isinstance(a, Out) else a for a in arrays]
    pairs = []
    for a in dask_arrays:
        pairs += [a, tuple(reversed(range(a.ndim)))]
    try:
        chunkss, aligned = unify_chunks(*pairs, warn=False)
    except ValueError as exc:
        shapes = ", ".join(
            f"{'Out' if isinstance(a, Out) else 'array'} {tuple(a.shape)}" for a in arrays
        )
        raise ValueError(
            f"map_kernel cannot align the chunks of its arrays ({shapes}): {exc}. "
            "Give arrays and outputs shapes that broadcast together."
        ) from None
    out_chunks = tuple(chunkss[ndim - 1 - ax] for ax in range(ndim))
    return list(aligned), out_chunks


def _halo(aligned, out_chunks, ndim, depth, boundary):
    """Overlap every array as ``map_overlap`` does; return them and the halo spec."""
    from dask.array.overlap import coerce_boundary, coerce_depth, overlap

    depth = coerce_depth(ndim, depth)
    boundary = coerce_boundary(ndim, boundary)
    for ax, d in depth.items():
        if not isinstance(d, Integral) or d < 0:
            raise ValueError(
                f"map_kernel takes a non-negative integer depth per axis, got {d!r} for "
                f"axis {ax}"
            )
    if not any(depth.values()):
        return aligned, (0,) * ndim, (False,) * ndim, None
    for a in aligned:
        if a.ndim != ndim:
            raise ValueError(
                f"with depth, every array of map_kernel must be {ndim}-D like its outputs; "
                f"got one of shape {a.shape}. Broadcast it first (da.broadcast_to)."
            )
    for ax, d in depth.items():
        smallest = min(out_chunks[ax]) if out_chunks[ax] else 0
        if d > smallest:
            raise ValueError(
                f"map_kernel depth {d} on axis {ax} is deeper than the smallest chunk "
                f"({smallest} elements; chunks {out_chunks[ax]}). Rechunk so every chunk "
                f"on axis {ax} has at least {d} elements (x.rechunk(...)), or use a "
                "smaller depth."
            )
    overlapped = [overlap(a, depth=depth, boundary=boundary, allow_rechunk=False)
                  for a in aligned]
    left = tuple(boundary[ax] != "none" for ax in range(ndim))
    return overlapped, tuple(int(depth[ax]) for ax in range(ndim)), left, (depth, boundary)


def _examples(roles, arrays, ndim):
    """One argument per kernel parameter that has the chunk's type."""
    out = []
    for kind, value in roles:
        if kind in (CHUNK, OUT):
            a = arrays[value]
            rank = ndim if kind == OUT else a.ndim
            out.append(np.empty((1,) * rank, dtype=a.dtype))
        elif kind == OFFSET:
            out.extend([np.int64(0)] * ndim)
        elif kind == PER_CHUNK:
            out.append(np.empty((1,) * value.ndim, dtype=value.dtype))
        elif kind == RANDOM:
            out.append(np.empty(1, dtype=STATE_DTYPE))
        else:
            out.append(value)
    return tuple(out)


def _select(kernel, examples):
    try:
        return kernel.select_image(examples)
    except TypeError as exc:
        raise TypeError(
            "map_kernel passes each chunk as a C-contiguous array of its dask array's "
            f"dtype and rank, and dg.offset as int64 (one per dimension).\n{exc}"
        ) from None


def _shipped(kernel, image) -> PTXKernel:
    """The PTX-only kernel holding just ``image`` (with its function if simulating)."""
    ptx = kernel.ptx_kernel() if not isinstance(kernel, PTXKernel) else kernel
    images = tuple(im for im in ptx.images if im == image)
    if _config.simulating() and images[0].py_func is None:
        raise TypeError(
            f"kernel {ptx.__name__!r} was loaded without its Python function, so it "
            "cannot run in the CUDA simulator; turn daskgpu.simulate off and run it on "
            "a GPU, or map the client kernel (dg.jit) instead"
        )
    return PTXKernel(images)


def _meta_base(arrays):
    for a in arrays:
        meta = a.meta if isinstance(a, Out) else a._meta
        if meta is not None and is_cupy(meta):
            return meta
    return None


def map_kernel(kernel, *args, depth=None, boundary=None, tpb=0, name=None, grid_ndim=None,
               split_every=None, token=None):
    """Launch ``kernel`` once per chunk of dask arrays; return its outputs lazily.

    Parameters
    ----------
    kernel : Kernel or PTXKernel
        A kernel from :func:`daskgpu.jit` / :func:`daskgpu.kernel`, or one loaded
        by :func:`daskgpu.load`. A lazy kernel (no signature) is compiled here,
        on the client, for the chunks' dtypes and ranks (C-contiguous).
    *args
        The kernel's arguments, in order:

        - dask arrays: one chunk per launch, chunks aligned and broadcast as
          ``da.blockwise`` does (lower-rank or size-1 arrays arrive with their
          own chunk shape);
        - :class:`Out`: an output allocated per chunk on the worker, aligned
          with the chunks, or one per launch (``per_chunk=``), optionally
          combined across chunks (``combine=``);
        - :data:`offset`: the chunk's global start index, one ``int64`` per
          dimension;
        - :func:`random_states` ``(seed)``: the chunk's xoroshiro128+ states,
          one per element of the launch, state *g* for global (row-major flat)
          element *g*, so the numbers do not depend on the chunking;
        - numpy or device arrays: passed whole to every launch (a copy, if the
          kernel writes it; those writes are not returned);
        - numbers.
    depth, boundary
        Halos, as in ``da.map_overlap``: each chunk is extended by ``depth``
        elements per side (an int, or a per-axis tuple or dict), ``boundary``
        fills the outer edges (``"none"`` by default, or ``"reflect"``,
        ``"periodic"``, ``"nearest"``, a constant). Outputs are allocated like
        the extended chunk and trimmed afterwards.
    tpb : int
        Threads per block; 0 asks the occupancy API.
    name : str, optional
        Prefix of the key names: the launch tasks are named ``{name}-{token}``,
        the token hashing the image and the arguments, so equal calls give
        equal keys and two different calls never share one (several outputs
        are named ``{name}-{token}-out{i}``). Default: the kernel's name.
    grid_ndim : int, optional
        Launch rank. Default: the rank of the kernel's ``cuda.grid(n)`` /
        ``cuda.gridsize(n)`` calls, else 1. Rank 1 launches ``chunk.size``
        threads; rank 2 or 3 launches ``chunk.shape`` threads (axis 0 is x).
    token : str, optional
        The full key name instead, used as given: two calls with the same
        ``token`` share their results, so make it unique. (``da.map_blocks``
        has the same two options the other way round: there ``token`` is the
        prefix and ``name`` the full name.)
    split_every : int or dict, optional
        For outputs with ``combine=``: how many partials one combine task
        folds, as in ``da.reduction`` (default: dask's ``split_every``).

    Returns
    -------
    dask.array.Array or tuple of them
        The :class:`Out` arrays in argument order, then every dask input the
        kernel writes, as new arrays (the inputs themselves are never
        modified). One result comes back bare. Results are CuPy-backed when
        the inputs are.

    Notes
    -----
    Each chunk's task holds only PTX and plain data (plus, while
    ``daskgpu.simulate`` is on, the Python function for the simulator).

    When a distributed client is current and its workers offer a ``GPU``
    resource, the launch tasks are annotated ``resources={"GPU": 1}``. Dask's
    low-level task fusion drops annotations (dask/dask#7036), so on a cluster
    that mixes GPU and CPU workers compute with
    ``dask.config.set({"optimization.fuse.active": False})``; on one where
    every worker has a GPU, placement needs no annotation.

    A dask array that an earlier ``map_kernel`` returned (its one aligned
    output, without ``depth``), passed here unchanged and once, is fused: each
    task runs both launches on the same chunk, and on host chunks the
    intermediate stays on the GPU while each input crosses PCIe once. The
    intermediate array's own tasks are then not in this graph; computing it as
    well runs its launches a second time, with the same results. The setting
    ``daskgpu.fuse-chains`` (default true) turns this off.

    Examples
    --------
    >>> import dask, numpy as np, dask.array as da, daskgpu as dg
    >>> from numba import cuda
    >>> @dg.jit
    ... def saxpy(out, a, x, y):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = a * x[i] + y[i]
    >>> x = da.arange(8, chunks=4, dtype=np.float32)
    >>> with dask.config.set({"daskgpu.simulate": True}):   # no GPU needed
    ...     z = dg.map_kernel(saxpy, dg.Out(np.float32, like=x), np.float32(2), x, x)
    ...     z.compute()
    array([ 0.,  3.,  6.,  9., 12., 15., 18., 21.], dtype=float32)

    Global indices with :data:`offset` and a halo with ``depth``:

    >>> @dg.jit
    ... def index(out, start):
    ...     i = cuda.grid(1)
    ...     if i < out.size:
    ...         out[i] = start + i
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.map_kernel(index, dg.Out(np.int64, shape=(6,), chunks=3), dg.offset).compute()
    array([0, 1, 2, 3, 4, 5])

    A per-chunk output, summed across chunks (a histogram):

    >>> @dg.jit
    ... def hist(counts, x):
    ...     i = cuda.grid(1)
    ...     if i < x.size:
    ...         cuda.atomic.add(counts, x[i] % 4, 1)
    >>> x = da.arange(10, chunks=3)
    >>> with dask.config.set({"daskgpu.simulate": True}):
    ...     dg.map_kernel(hist, dg.Out(np.int64, per_chunk=4, combine="sum"), x).compute()
    array([3, 3, 2, 2])
    """
    _check_kernel(kernel)
    if operator.index(tpb) < 0:
        raise ValueError(f"tpb must be 0 (automatic) or positive, got {tpb!r}")
    roles, arrays = _classify(args)
    ndim = _mapped_rank(arrays)
    _check_extras(roles, ndim, depth)
    image, rank = _select_image(kernel, roles, arrays, ndim, grid_ndim)
    ship = _shipped(kernel, image)
    params, returns = _plan_params(kernel.__name__, image, roles, arrays, ndim)
    if token is not None:
        if name is not None:
            raise TypeError("map_kernel takes name= (a prefix, a token of the arguments "
                            "is added) or token= (the full key name), not both")
        name = str(token)
    else:
        from dask.base import tokenize

        name = f"{name or kernel.__name__}-" + tokenize(
            image.hash, kernel.__name__, args, depth, boundary, int(tpb), rank,
            _config.simulating())
    results = _build_graph(ship, roles, arrays, ndim, params, returns,
                           rank=rank, tpb=int(tpb), depth=depth, boundary=boundary, name=name)
    return _combined(results, roles, returns, ndim, split_every, name)


def _mapped_rank(arrays) -> int:
    """The rank of the mapped chunks: the highest of the arrays', which outputs must have."""
    ndim = max(len(a.shape) for a in arrays)
    for a in arrays:
        if isinstance(a, Out) and a.ndim != ndim:
            raise ValueError(
                f"map_kernel outputs must have the rank of the mapped arrays ({ndim}-D), "
                f"got {a!r}"
            )
    if ndim == 0:
        raise ValueError("map_kernel maps over arrays of at least one dimension")
    return ndim


def _select_image(kernel, roles, arrays, ndim, grid_ndim):
    """The image that takes the chunks' types, and the rank of its launch grid."""
    image = _select(kernel, _examples(roles, arrays, ndim))
    rank = (image.grid_ndim or 1) if grid_ndim is None else operator.index(grid_ndim)
    if rank not in (1, ndim) or not 1 <= rank <= 3:
        raise ValueError(
            f"kernel {kernel.__name__!r} launches a {rank}-D grid over {ndim}-D chunks; "
            f"map_kernel launches 1-D over the chunk's elements or {ndim}-D over its "
            "shape (up to 3-D). Pass grid_ndim=1 to index the chunk's flat elements."
        )
    return image, rank


def _plan_params(kernel_name, image, roles, arrays, ndim):
    """What each kernel parameter is per chunk, and which of them a task returns.

    Returns ``(params, returns)``: one entry per kernel parameter, with
    ``dg.offset`` expanded to one int64 per axis, for :class:`ChunkLaunch`;
    and ``(parameter index, dtype)`` of the outputs, then of the dask inputs
    the kernel writes.
    """
    specs = iter(image.args)
    params, returns, written_inputs = [], [], []
    for kind, value in roles:
        if kind == OFFSET:
            params += [(OFFSET, ax, None) for ax in range(ndim)]
            for _ in range(ndim):
                next(specs)
            continue
        spec, index = next(specs), len(params)
        written = index in image.writes
        if kind == CHUNK:
            params.append((CHUNK, spec.layout, written))
            if written:
                written_inputs.append((index, arrays[value].dtype))
        elif kind == OUT:
            params.append((OUT, arrays[value].dtype.str, spec.layout))
            returns.append((index, arrays[value].dtype))
        elif kind == PER_CHUNK:
            params.append((PER_CHUNK, (value.dtype.str, value.per_chunk, value.fill),
                           spec.layout))
            returns.append((index, value.dtype))
        elif kind == RANDOM:  # scratch: the kernel's writes to its states are not returned
            params.append((RANDOM, value.seed, _states_builder()))
        elif kind == WHOLE:
            params.append((WHOLE, written, None))
        else:
            params.append((VALUE, None, None))
    returns += written_inputs
    if not returns:
        raise ValueError(
            f"kernel {kernel_name!r} has nothing to return: give an output "
            "dg.Out(dtype, like=x), or pass a dask array that the kernel writes"
        )
    return tuple(params), tuple(returns)


def _build_graph(ship, roles, arrays, ndim, params, returns, *, rank, tpb, depth, boundary,
                 name):
    """One launch task per chunk, on ``da.map_blocks``; the results as dask arrays."""
    import dask.array as da
    from dask.array.core import broadcast_chunks
    from dask.array.overlap import trim_internal
    from dask.array.utils import meta_from_array

    aligned, out_chunks = _align(arrays, ndim)
    blocks, halo, left, trim = _halo(aligned, out_chunks, ndim, depth, boundary)
    starts = tuple(tuple(int(s) for s in np.cumsum((0,) + c[:-1])) for c in out_chunks)
    base = _meta_base(arrays)
    # Outputs are allocated in the task that launches on them: a task per
    # output chunk would double the graph and the scheduler's work.
    block_chunks = broadcast_chunks(*(b.chunks for b in blocks))
    fn = ChunkLaunch(ship, params, tuple(i for i, _ in returns), rank, tpb,
                      block_chunks, starts, halo, left, base is not None)

    task_args = []
    for kind, value in roles:
        if kind == CHUNK:
            task_args.append(blocks[value])
        elif kind in (WHOLE, VALUE):
            task_args.append(value)
    if not any(halo) and _config.flag("fuse-chains", True):
        fn, task_args = _fuse(fn, task_args, roles, arrays, blocks, params, ndim, block_chunks)

    meta_of = (lambda dt, nd: meta_from_array(base, nd, dt)) if base is not None else (
        lambda dt, nd: np.empty((0,) * nd, dtype=dt))
    # Per result: its shape per launch, when it is a per-chunk output.
    per_chunk = [params[i][1][1] if params[i][0] == PER_CHUNK else None for i, _ in returns]
    with _gpu_annotation():
        if len(returns) == 1:
            results = [da.map_blocks(fn, *task_args, name=name,
                                     meta=meta_of(returns[0][1], ndim + len(per_chunk[0] or ())),
                                     **_block_layout(block_chunks, per_chunk[0]))]
        else:
            launched = da.map_blocks(fn, *task_args, name=name, chunks=block_chunks,
                                     meta=np.empty((0,) * ndim, dtype=object))
            results = [
                launched.map_blocks(operator.getitem, i, name=f"{name}-out{i}",
                                    meta=meta_of(dt, ndim + len(per or ())),
                                    **_block_layout(block_chunks, per))
                for i, ((_, dt), per) in enumerate(zip(returns, per_chunk))
            ]
    if trim is not None:
        results = [trim_internal(r, *trim) for r in results]
    elif len(returns) == 1 and params[returns[0][0]][0] == OUT:
        # A later map_kernel over this result may fuse its launches with these.
        results[0]._daskgpu_chain = (fn, tuple(task_args), params[returns[0][0]][2])
    return results[0] if len(results) == 1 else tuple(results)


def _fuse(fn, task_args, roles, arrays, blocks, params, ndim, block_chunks):
    """Fuse the launches of earlier map_kernels whose outputs this one reads.

    An input qualifies when it is the very array an earlier ``map_kernel``
    returned, as its one aligned output without halos, read here unchanged
    (same chunks, no halo, not written, a compatible layout) and only once.
    Its task then runs that ``map_kernel``'s launch first, in the same task,
    on that one's own inputs: the intermediate chunk exists only there (on
    the GPU for host chunks), and the earlier array's tasks are not in this
    graph. If it is also computed on its own, its launches run twice, with
    equal results; set ``daskgpu.fuse-chains`` to false to keep them apart.
    """
    found, pos, index = [], 0, 0
    names = [arrays[v].name for kind, v in roles if kind == CHUNK]
    for kind, value in roles:
        if kind == CHUNK:
            a = arrays[value]
            link = getattr(a, "_daskgpu_chain", None)
            _, layout, written = params[index]
            if (link is not None and not written and names.count(a.name) == 1
                    and blocks[value].name == a.name and a.ndim == ndim
                    and a.chunks == block_chunks
                    and (layout == "A" or (layout == "F") == (link[2] == "F"))):
                found.append((pos, link))
        if kind in (CHUNK, WHOLE, VALUE):
            pos += 1
        index += ndim if kind == OFFSET else 1
    for pos, (first, first_args, _) in reversed(found):  # later slots first: earlier ones stay put
        fn = Fused(first, fn, pos, len(first_args))
        task_args = task_args[:pos] + list(first_args) + task_args[pos + 1:]
    return fn, task_args


def _block_layout(block_chunks, per_chunk):
    """``map_blocks`` keywords of a result: aligned, or one block of ``per_chunk`` a launch."""
    if per_chunk is None:
        return {"chunks": block_chunks}
    ndim = len(block_chunks)
    return {"chunks": tuple((1,) * len(c) for c in block_chunks) + tuple((n,) for n in per_chunk),
            "new_axis": list(range(ndim, ndim + len(per_chunk)))}


def _check_extras(roles, ndim, depth):
    """Refuse per-chunk outputs and random states where they have no meaning."""
    kinds = {kind for kind, _ in roles}
    halo = depth is not None and any(
        depth.values() if isinstance(depth, dict) else np.atleast_1d(depth).tolist())
    if halo and PER_CHUNK in kinds:
        raise ValueError(
            f"map_kernel got depth={depth!r} with a per-chunk output (dg.Out(per_chunk=...)). "
            "Halos overlap neighbouring chunks, so their elements would count in two "
            "per-chunk results; map without depth, or use an aligned output "
            "(dg.Out(dtype, like=x)) and reduce it afterwards"
        )
    if halo and RANDOM in kinds:
        raise ValueError(
            f"map_kernel got depth={depth!r} with dg.random_states: a halo element "
            "belongs to two chunks and would draw from one state twice; map without depth"
        )
    if RANDOM in kinds and ndim > 3:
        raise ValueError(
            f"dg.random_states numbers the elements of maps of up to 3 dimensions; this "
            f"map is {ndim}-D. Reshape the arrays to at most 3 dimensions first"
        )


def _states_builder():
    """The PTX-only states kernel, compiled here on the client; None while simulating."""
    if _config.simulating():
        return None  # simulated workers build states on the host, from the same table
    from daskgpu._compiler.random_states import builder

    return builder()


def _combined(results, roles, returns, ndim, split_every, name):
    """The results, each per-chunk output with a ``combine`` reduced across chunks."""
    by_index, index = {}, 0  # kernel parameter index -> its per-chunk Out
    for kind, value in roles:
        if kind == PER_CHUNK:
            by_index[index] = value
        index += ndim if kind == OFFSET else 1
    many = isinstance(results, tuple)
    done = []
    for k, (result, (i, _)) in enumerate(zip(results if many else (results,), returns)):
        out = by_index.get(i)
        if out is not None and out.fold is not None:
            result = reduction.combine_partials(result, ndim, out.fold, split_every,
                                                name=f"{name}-combine{k}")
        done.append(result)
    return tuple(done) if many else done[0]
