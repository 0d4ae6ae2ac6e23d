"""A fused chain of launches captured once as a CUDA graph, and replayed per chunk.

A chain of ``map_kernel`` launches fused into one task costs the host, per
kernel and per chunk, a launch's work (matching and packing the arguments,
``cuLaunchKernel``) and an allocation per intermediate: on small chunks, most
of the task. Here the chain is captured once per key (the launches, the
chunk's shape, its values' shapes, dtypes and layouts, its scalars; and the
device) into a CUDA graph that holds everything the device does for a chunk:
the copies of the inputs from page-locked staging buffers, the zero fill of
every output, every kernel, and the copies of the results back into staging
buffers. The buffers belong to the graph, at fixed addresses, so the graph
never changes: a chunk then costs the host a copy of its inputs into staging,
one ``cuGraphLaunch``, one wait, and a copy of its results out.

A key is captured the second time it is seen. A shape seen once (an edge
chunk) pays for no capture and holds no memory, and by then the first chunk
has linked every kernel and checked every configuration, so that the capture
meets no first-time work. A chain that cannot be captured as it is (an input
broadcast to the chunk's shape, which the staging does not reproduce, say) is
remembered as refused, and launched one by one.

Capture runs the chain's own launch code on a :class:`GraphChain` in place of
a :class:`~daskgpu._runtime.gpu.chains.device_chain.DeviceChain`, on the
calling thread's stream in relaxed capture mode, in which the buffers may be
allocated while the stream captures (as PyTorch's allocator does); nothing
runs on the device until the graph is launched.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np
from cuda.bindings import driver

from daskgpu import _config
from daskgpu._bounded import BoundedCache
from daskgpu._image.array_info import c_strides
from daskgpu._runtime import metrics
from daskgpu._runtime.gpu import device as _device
from daskgpu._runtime.gpu.chains.device_chain import DeviceView, zeroed
from daskgpu._runtime.gpu.copy_pipeline import PinnedSlot, memory_order
from daskgpu._runtime.gpu.driver import SUCCESS, check

__all__ = ["GRAPHS_KEPT", "GRAPH_BYTES", "REFUSED", "SEEN", "ChainGraph", "ChainGraphs",
           "GraphChain", "Refused", "capture_graph", "chain_graphs"]

#: The most device memory a chunk of a captured chain may need (its inputs,
#: intermediates and outputs). Above it, the kernels and copies of a chunk take long
#: enough that launching one by one costs little beside them (a launch costs the
#: host tens of microseconds; 4 MiB cross PCIe in about 200), and each cached graph
#: holds its buffers, on the device and page-locked on the host, for good.
GRAPH_BYTES = 4 << 20

#: The most keys the process's :class:`ChainGraphs` keeps: graphs, and keys seen
#: once or refused. Graphs hold at most ``GRAPHS_KEPT * GRAPH_BYTES`` of device
#: memory (128 MiB), and as much page-locked host memory, well within the margin a
#: GPU worker keeps out of its offer (``daskgpu.device-memory-margin``).
GRAPHS_KEPT = 32

#: A key's entry after its first chunk: the next one of that key is captured.
SEEN = "seen once"
#: A key's entry when its chain cannot be captured: it is launched one by one.
REFUSED = "refused"


class Refused(Exception):
    """The chain cannot be captured as it is, for the reason given."""


class GraphChain:
    """What a fused chain's launches are given as their chain while it is captured.

    It offers what a :class:`~daskgpu._runtime.gpu.chains.device_chain.DeviceChain`
    does (``handle``, the stream the launches go on; ``to_device``; ``zeros``),
    but every buffer is the graph's own, allocated once, and a host input goes to
    the device from a page-locked staging buffer that each replay fills from the
    task's values.

    Parameters
    ----------
    stream : CUstream
        The capturing stream.
    values : tuple
        The task's values.
    sources : tuple of int
        For the ``k``-th call of :meth:`to_device`, the position among ``values``
        of the array it is given, as laid out for its kernel: the value itself, a
        contiguous copy of it, or a flat one. One array at several positions (a
        chunk that several launches read) is staged once, as a DeviceChain copies
        it once: the key of the graph says which positions hold one array.
    """

    def __init__(self, stream, values, sources):
        self.stream = stream
        self.handle = int(stream)
        self.values, self.sources = values, tuple(sources)
        self.calls = 0  # of to_device
        self._staged = {}  # (id(value), shape, dtype, order) -> its DeviceView
        self.fills = []  # (staging array, position of the task value it is filled from)
        self.outs = []  # staging arrays the results come back into
        self.pinned = []  # the PinnedSlots of both
        self.allocations = []  # device pointers
        self.nbytes = 0

    def _allocate(self, nbytes: int) -> int:
        self.nbytes += nbytes
        if self.nbytes > GRAPH_BYTES:
            raise Refused(f"the chunk needs more than {GRAPH_BYTES} bytes on the device")
        dptr = int(check(driver.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))
        self.allocations.append(dptr)
        return dptr

    def _staging(self, shape, dtype, order: str):
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        slot = PinnedSlot(max(nbytes, 1))
        self.pinned.append(slot)
        return slot, slot.array[:nbytes].view(dtype).reshape(shape, order=order)

    def to_device(self, host: np.ndarray) -> DeviceView:
        """``host``, an input laid out for its kernel, on the device, staged from its value."""
        k = self.calls
        if k >= len(self.sources):
            raise Refused("the chain copies more host arrays than it has array values")
        self.calls += 1
        position = self.sources[k]
        value = self.values[position]
        if not (host.flags.c_contiguous or host.flags.f_contiguous) or host.dtype != value.dtype:
            raise Refused("an input is laid out in a way the staging does not reproduce")
        order = memory_order(host)
        staged = (id(value), host.shape, host.dtype, order)
        if staged in self._staged:  # the same array, laid out alike, for another launch
            return self._staged[staged]
        slot, staging = self._staging(host.shape, host.dtype, order)
        if host.shape == value.shape:  # the value itself, or a contiguous copy
            fill = staging
        elif host.ndim == 1 and host.size == value.size:  # a flat C-ordered copy
            fill = staging.reshape(value.shape)
        else:
            raise Refused("an input is broadcast to the chunk's shape")
        np.copyto(fill, value, casting="no")
        # What a replay will stage must be what the chain's own code laid out.
        if not np.array_equal(_bytes(staging), _bytes(host)):
            raise Refused("an input is laid out in a way the staging does not reproduce")
        dptr = self._allocate(host.nbytes)
        if host.nbytes:
            check(driver.cuMemcpyHtoDAsync(dptr, slot.ptr, host.nbytes, self.stream),
                  "cuMemcpyHtoDAsync")
        self.fills.append((fill, position))
        view = self._staged[staged] = DeviceView(dptr, host.shape, host.dtype, order)
        return view

    def zeros(self, shape, dtype, order: str = "C") -> DeviceView:
        """A zero-filled device array, filled anew by every replay (the fill is recorded)."""
        return zeroed(self._allocate, self.stream, shape, dtype, order)

    def copy_back(self, results) -> None:
        """Queue the copies of ``results``, the chain's outputs on the device, to staging."""
        for result in results:
            if not isinstance(result, DeviceView) or result.ptr not in self.allocations:
                raise Refused("a result of the chain is not one of its device outputs")
            order = "C" if result.strides == c_strides(result.shape, result.dtype.itemsize) else "F"
            slot, staging = self._staging(result.shape, result.dtype, order)
            if result.nbytes:
                check(driver.cuMemcpyDtoHAsync(slot.ptr, result.ptr, result.nbytes, self.stream),
                      "cuMemcpyDtoHAsync")
            self.outs.append(staging)

    def free(self) -> None:
        """Free the buffers of a capture that came to nothing."""
        _release(None, self.allocations, self.pinned, None)


def _bytes(array: np.ndarray) -> np.ndarray:
    # A contiguous array's bytes in memory order.
    return array.ravel(order="K").view(np.uint8)


class ChainGraph:
    """A fused chain captured for one key: its executable graph, its buffers, its replay.

    Replays of one graph run one at a time (a lock): they share its buffers. Its
    memory is freed once nothing holds it, after its cache let it go.
    """

    def __init__(self, chain: GraphChain, graph_exec, context):
        self.fills, self.outs = tuple(chain.fills), tuple(chain.outs)
        self.nbytes = chain.nbytes
        self.launches = 0
        self._exec = graph_exec
        self._lock = threading.Lock()
        weakref.finalize(self, _release, graph_exec, list(chain.allocations),
                         list(chain.pinned), context)

    def replay(self, values, name: str = "fused") -> tuple:
        """The chain's results for a chunk whose task values are ``values``, as new arrays.

        While someone looks (:data:`daskgpu._runtime.metrics.hook`), the host's
        time filling the staging buffers is reported under ``name`` as ``copy-in``,
        the graph's run as ``kernel``, and copying the results out as ``copy-out``.
        """
        start = metrics.clock()
        with self._lock:
            stream = _device.thread_stream()
            for fill, position in self.fills:
                np.copyto(fill, values[position], casting="no")
            staged = metrics.clock()
            check(driver.cuGraphLaunch(self._exec, stream), "cuGraphLaunch")
            check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
            ran = metrics.clock()
            results = tuple(out.copy(order="K") for out in self.outs)
            self.launches += 1
        meter = metrics.hook
        if meter is not None:
            meter.record(name, "copy-in", staged - start)
            meter.record(name, "kernel", ran - staged)
            meter.record(name, "copy-out", metrics.clock() - ran)
        return results

    def __repr__(self):
        return (f"<ChainGraph of {len(self.fills)} inputs and {len(self.outs)} outputs, "
                f"{self.nbytes} device bytes>")


def _release(graph_exec, allocations, pinned, context) -> None:
    # Unchecked: this also runs after a failed capture, and at exit, when a
    # context that is gone has nothing left to free.
    pushed = context is not None and driver.cuCtxPushCurrent(context)[0] == SUCCESS
    try:
        if graph_exec is not None:
            driver.cuGraphExecDestroy(graph_exec)
        for dptr in allocations:
            driver.cuMemFree(dptr)
        for slot in pinned:
            slot.free()
    finally:
        if pushed:
            driver.cuCtxPopCurrent()


def capture_graph(values, sources, launch_chain):
    """A :class:`ChainGraph` of ``launch_chain(chain)``, captured on this thread's stream;
    :data:`REFUSED` where it cannot be.

    ``launch_chain`` runs the chain's launches on the :class:`GraphChain` it is
    given, its outputs kept on the device, and returns them. Whatever goes wrong
    while capturing (a refusal, or an error of the chain's own, which launching
    it one by one then meets again with its own message) refuses the key.
    """
    state = _device.current()
    stream = _device.thread_stream()
    chain = GraphChain(stream, values, sources)
    relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    graph = None
    try:
        check(driver.cuStreamBeginCapture(stream, relaxed), "cuStreamBeginCapture")
        try:
            chain.copy_back(launch_chain(chain))
        finally:  # the stream captures no more, whatever happened
            err, graph = driver.cuStreamEndCapture(stream)
            if err != SUCCESS or not int(graph):  # a call that capture cannot take
                graph = None
        if graph is None:
            raise Refused(f"the capture was invalidated ({err})")
        if chain.calls != len(chain.sources):
            raise Refused("the chain copied fewer host arrays than it has array values")
        graph_exec = check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    except BaseException as exc:
        chain.free()
        if not isinstance(exc, Exception):
            raise
        return REFUSED
    finally:
        if graph is not None:  # the executable graph holds all it needs
            driver.cuGraphDestroy(graph)
    return ChainGraph(chain, graph_exec, state.context)


class ChainGraphs:
    """This process's fused chains captured as CUDA graphs.

    Keyed by ``(chain key, device id)``: the chain key says everything a graph
    holds fixed (the Dask layer's ``Fused.graph_key``: the chain's launches, the
    chunk's shape, each value's shape, dtype and layout, each scalar), and the
    device is the calling thread's. At most ``maxsize`` keys, the least recently
    used out; an evicted graph's memory is freed once no replay holds it. A
    key's entry is :data:`SEEN` after its first chunk, then its
    :class:`ChainGraph` (the second chunk captures it) or :data:`REFUSED`.

    Parameters
    ----------
    maxsize : int
        The most keys kept.
    capture : callable
        ``capture(values, sources, launch_chain)``: a key's graph, or
        :data:`REFUSED` (:func:`capture_graph`).
    device : callable
        The id of the calling thread's device.

    Attributes
    ----------
    captures : int
        Graphs captured so far, refusals not counted.
    """

    def __init__(self, maxsize: int = GRAPHS_KEPT, capture=capture_graph, device=None):
        self._entries = BoundedCache(maxsize, "fused chains captured as CUDA graphs")
        self._capture = capture
        self._device = device or (lambda: _device.current().id)
        self._lock = threading.Lock()
        self.captures = 0

    @staticmethod
    def pays(launches: int, nbytes: int) -> bool:
        """Whether a chain of ``launches`` whose chunk needs ``nbytes`` of device memory is
        replayed as a graph: at least ``daskgpu.chain-graphs`` launches (0: never), at
        most :data:`GRAPH_BYTES`."""
        least = _config.get("chain-graphs", 0)
        return 0 < least <= launches and nbytes <= GRAPH_BYTES

    def run(self, key, values, sources, launch_chain, name: str = "fused"):
        """The chain's results for this chunk, replayed from the graph of ``key``; None
        where the chain is to be launched one by one (a key's first chunk, or refused).

        ``values`` are the task's, ``sources`` and ``launch_chain`` what
        :func:`capture_graph` takes.
        """
        key = (key, self._device())
        entry = self._entries.lookup(key)
        if entry is None:
            self._entries.put(key, SEEN)
            return None
        if entry is SEEN:
            with self._lock:  # one capture at a time: a second thread finds the graph
                entry = self._entries.lookup(key)
                if entry is SEEN or entry is None:
                    entry = self._capture(values, sources, launch_chain)
                    if entry is not REFUSED:
                        self.captures += 1
                    self._entries.put(key, entry)
        if entry is REFUSED:
            return None
        return entry.replay(values, name)

    def entry(self, key, device_id: int):
        """What is kept for ``key`` on device ``device_id``: None, SEEN, REFUSED or its graph."""
        return self._entries.lookup((key, device_id))

    @property
    def maxsize(self) -> int:
        """The most keys kept."""
        return self._entries.maxsize

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every key; graphs are freed once no replay holds them."""
        self._entries.clear()

    def __repr__(self):
        return (f"<ChainGraphs: {len(self)}/{self.maxsize} keys, "
                f"{self.captures} captured>")


#: The process's captured chains (worker side); see :class:`ChainGraphs`.
chain_graphs = ChainGraphs()
