"""The repeat-launch function generated per signature, without a GPU.

It must pack, byte for byte, what the general path packs (``flatten`` into
:class:`ParamLayout`), and hand everything else back (``NotImplemented``) to
the general path. The driver call is the one thing replaced here: by a
function that keeps the parameter bytes it is given.
"""

import ctypes
import threading
import types

import numpy as np
import pytest

from daskgpu._image.argspec import ArgSpec
from daskgpu._image.array_info import array_info
from daskgpu._runtime.dispatch import conversion_cost
from daskgpu._runtime.gpu.driver import SUCCESS
from daskgpu._runtime.gpu.fast_path import (
    FastFactories,
    device_array_info,
    fast_constants,
    fast_source,
    fast_struct,
    launch_failed,
)
from daskgpu._runtime.gpu.marshal import ParamLayout, flatten


class CAIArray:
    """A device array as any CUDA array interface producer exports it."""

    def __init__(self, dtype, shape, strides=None, ptr=0x7F00_0000_1000):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": np.dtype(dtype).str, "version": 3,
            "strides": strides, "data": (ptr, False), "stream": None,
        }


class CupyLike:
    """The attributes the CuPy branch reads, as cupy.ndarray has them."""

    def __init__(self, dtype, shape, strides=None, ptr=0x7F00_0000_2000):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.strides = strides or np.empty(shape, dtype).strides
        self.data = types.SimpleNamespace(ptr=ptr)


class NumbaLike:
    """The attributes the Numba branch reads, as numba's DeviceNDArray has them."""

    def __init__(self, dtype, shape, strides=None, ptr=0x7F00_0000_3000, stream=0):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.strides = strides or np.empty(shape, dtype).strides
        self.device_ctypes_pointer = ctypes.c_void_p(ptr)
        self.stream = stream


def general_bytes(specs, args) -> bytes:
    layout = ParamLayout(specs)
    values = []
    for spec, a in zip(specs, args):
        if spec.is_array:
            if type(a) is CupyLike:
                dtype, shape, strides, ptr = a.dtype, a.shape, a.strides, a.data.ptr
            elif type(a) is NumbaLike:
                ptr = a.device_ctypes_pointer.value or 0
                dtype, shape, strides = a.dtype, a.shape, a.strides
            else:
                dtype, shape, strides, ptr = array_info(a)
            flatten(spec, (ptr, shape, strides, dtype.itemsize), values)
        else:
            flatten(spec, a, values)
    layout.pack(values)
    return layout.buffers()[0].tobytes()


def fast_function(specs, writes=(), synced=None, images=(None,), exact=False):
    """The generated function for ``specs``, and the parameter bytes of each launch."""
    layout = ParamLayout(specs)
    sent = []
    state = object()

    def launch(function, g0, g1, g2, b0, b1, b2, shm, stream, address, extra):
        data, _, buf_address = layout.buffers()
        assert address == buf_address
        sent.append(((g0, g1, g2, b0, b1, b2, shm), data.tobytes()))
        return (SUCCESS,)

    make = FastFactories().get(fast_source(specs, writes, exact))
    fast = make(
        kernel=None, state=state, device_thread=types.SimpleNamespace(state=state),
        local=threading.local(), layout=layout, buffers=lambda: layout.buffers()[::2],
        pack_into=fast_struct(specs).pack_into, launch=launch, function=None, stream=0,
        g0=4, g1=1, g2=1, b0=256, b1=1, b2=1, shm=0, name="k", images=images, CUPY=CupyLike,
        NUMBA=NumbaLike, device_info=device_array_info,
        sync_producer=synced.append if synced is not None else None, failed=launch_failed,
        SUCCESS=SUCCESS,
        **fast_constants(specs, exact))
    return fast, sent


SCALARS = [
    ("int8", -7), ("int16", -300), ("int32", -70000), ("int64", -(2**40)),
    ("uint8", 200), ("uint16", 60000), ("uint32", 4_000_000_000), ("uint64", 2**63 + 5),
    ("float16", 1.5), ("float32", 2.25), ("float64", 3.125), ("float32", np.float32(0.5)),
    ("float64", np.float32(0.5)), ("int32", np.int16(-3)), ("int64", np.int64(9)),
    ("complex64", 1 + 2j), ("complex128", 3 - 4j), ("bool", True), ("bool", np.bool_(False)),
    ("float64", 7), ("datetime64[ns]", np.datetime64(5, "ns")),
]


@pytest.mark.parametrize("dtype,value", SCALARS, ids=str)
def test_scalars_pack_as_the_general_path_packs(dtype, value):
    specs = [ArgSpec("array", "float32", 1, "C"), ArgSpec("scalar", dtype)]
    args = (CupyLike(np.float32, (10,)), value)
    fast, sent = fast_function(specs, writes=(0,))
    assert fast(args) is args[0]
    assert sent[-1][1] == general_bytes(specs, args)


ARRAYS = [
    (ArgSpec("array", "float32", 1, "C"), (np.float32, (1000,), None)),
    (ArgSpec("array", "float32", 1, "C"), (np.float32, (1,), (12,))),  # one element: any stride
    (ArgSpec("array", "float32", 1, "A"), (np.float32, (500,), (8,))),
    (ArgSpec("array", "int8", 2, "C"), (np.int8, (3, 5), None)),
    (ArgSpec("array", "float64", 2, "F"), (np.float64, (3, 5), (8, 24))),
    (ArgSpec("array", "complex128", 3, "A"), (np.complex128, (2, 3, 4), (16, 64, 384))),
    (ArgSpec("array", "float32", 3, "C"), (np.float32, (2, 0, 4), (0, 0, 4))),
]


@pytest.mark.parametrize("make_array", [CAIArray, CupyLike, NumbaLike],
                         ids=["cai", "cupy", "numba"])
@pytest.mark.parametrize("spec,array", ARRAYS, ids=lambda a: str(a))
def test_arrays_pack_as_the_general_path_packs(spec, array, make_array):
    specs = [spec, ArgSpec("scalar", "int32"), spec]
    args = (make_array(*array), 5, make_array(*array, ptr=0x7F00_0000_8000))
    array_info(args[0])  # the general path, which runs first, has seen the type
    fast, sent = fast_function(specs, writes=(0, 2))
    assert fast(args) == (args[0], args[2])
    assert sent[-1] == ((4, 1, 1, 256, 1, 1, 0), general_bytes(specs, args))


MISSES = [
    ("another dtype", (CAIArray(np.float64, (10,)), 1.0)),
    ("another rank", (CAIArray(np.float32, (2, 5)), 1.0)),
    ("strided for a C-contiguous parameter", (CupyLike(np.float32, (10,), (8,)), 1.0)),
    ("a host array", (np.ones(10, np.float32), 1.0)),
    ("an unseen type", (object(), 1.0)),
    ("a scalar for an array", (1.0, 1.0)),
    ("an array for a scalar", (CupyLike(np.float32, (10,)), CupyLike(np.float32, (10,)))),
    ("a complex for a float", (CupyLike(np.float32, (10,)), 1j)),
    ("too few arguments", (CupyLike(np.float32, (10,)),)),
    ("too many arguments", (CupyLike(np.float32, (10,)), 1.0, 1.0)),
]


@pytest.mark.parametrize("why,args", MISSES, ids=[m[0] for m in MISSES])
def test_what_the_function_does_not_cover_goes_to_the_general_path(why, args):
    specs = [ArgSpec("array", "float32", 1, "C"), ArgSpec("scalar", "float32")]
    array_info(args[0])  # the general path has seen the type: the fast one may read it
    fast, sent = fast_function(specs, writes=(0,))
    assert fast(args) is NotImplemented
    assert not sent


class _Colour(__import__("enum").Enum):
    RED = 1


class _Level(__import__("enum").IntEnum):
    LOW = 1


def test_an_enum_parameter_takes_members_of_its_class_only():
    specs = [ArgSpec("scalar", "int64", enum=f"{__name__}._Colour")]
    fast, sent = fast_function(specs)
    for other in (1, np.int64(1), _Level.LOW):  # equal values, but not a _Colour
        assert fast((other,)) is NotImplemented
    assert not sent
    assert fast((_Colour.RED,)) is None
    assert sent[0][1] == general_bytes(specs, (_Colour.RED,))


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, True, 1.5])
def test_integers_out_of_range_or_of_other_kinds_go_to_the_general_path(value):
    specs = [ArgSpec("scalar", "int32")]
    fast, sent = fast_function(specs)
    assert fast((value,)) is NotImplemented and not sent
    assert fast((2**31 - 1,)) is None and len(sent) == 1


def test_another_thread_on_another_device_goes_to_the_general_path():
    fast, sent = fast_function([ArgSpec("scalar", "int32")])
    results = []
    t = threading.Thread(target=lambda: results.append(fast((1,))))
    t.start()
    t.join()
    assert results == [None] and len(sent) == 1  # the same device state: it launches
    device_thread = threading.local()  # a thread whose device is not the bound one
    specs = [ArgSpec("scalar", "int32")]
    layout = ParamLayout(specs)
    fast = FastFactories().get(fast_source(specs, ())) (
        kernel=None, state=object(), device_thread=device_thread, local=threading.local(),
        layout=layout, buffers=lambda: layout.buffers()[::2],
        pack_into=fast_struct(specs).pack_into, launch=None, function=None, stream=0,
        g0=1, g1=1, g2=1, b0=1, b1=1, b2=1, shm=0, name="k", images=(None,), CUPY=CupyLike,
        NUMBA=NumbaLike, device_info=device_array_info, sync_producer=None,
        failed=launch_failed, SUCCESS=SUCCESS,
        **fast_constants(specs))
    assert fast((1,)) is NotImplemented


def test_no_arguments():
    fast, sent = fast_function([])
    assert fast(()) is None and len(sent) == 1
    assert fast((1,)) is NotImplemented


def test_one_factory_per_shape_of_signature():
    factories = FastFactories()
    a = [ArgSpec("array", "float32", 1, "C")] * 3
    b = [ArgSpec("array", "float64", 1, "C")] * 3  # another dtype, another itemsize
    c = [ArgSpec("array", "int32", 1, "C")] * 3  # another dtype, the same itemsize
    assert factories.get(fast_source(a, (0,))) is factories.get(fast_source(c, (0,)))
    assert factories.get(fast_source(a, (0,))) is not factories.get(fast_source(b, (0,)))
    assert factories.get(fast_source(a, (0,))) is not factories.get(fast_source(a, (1,)))


def test_a_numba_array_bound_to_a_stream_waits_for_it_and_an_unbound_one_does_not():
    specs = [ArgSpec("array", "float32", 1, "C")] * 2
    synced = []
    fast, sent = fast_function(specs, writes=(0,), synced=synced)
    bound, unbound = NumbaLike(np.float32, (8,), stream=1234), NumbaLike(np.float32, (8,))
    assert fast((unbound, unbound)) is unbound and synced == []
    assert fast((bound, unbound)) is bound and synced == [bound]
    assert len(sent) == 2


def test_an_empty_numba_array_has_a_null_pointer():
    specs = [ArgSpec("array", "float32", 1, "C")]
    fast, sent = fast_function(specs)
    empty = NumbaLike(np.float32, (0,), ptr=None)
    assert fast((empty,)) is None
    assert sent[-1][1] == general_bytes(specs, (empty,))


EXACT = [
    ("float64", 1.0), ("float32", 1.0), ("float32", np.float32(1)), ("float64", np.float32(1)),
    ("int64", 5), ("int32", 5), ("int32", np.int32(5)), ("int64", np.int16(5)), ("uint64", 5),
    ("float64", 7), ("bool", True), ("bool", np.bool_(True)), ("complex128", 1j),
    ("complex64", 1j), ("complex64", np.complex64(1j)), ("complex128", 1.0),
    ("datetime64[ns]", np.datetime64(5, "ns")), ("timedelta64[s]", np.timedelta64(5, "s")),
]


@pytest.mark.parametrize("dtype,value", EXACT, ids=str)
def test_with_several_images_a_scalar_is_taken_only_when_it_needs_no_conversion(dtype, value):
    # Then select_image picks the first image, whichever others there are.
    specs = [ArgSpec("scalar", dtype)]
    assert specs[0].matches(None, value)
    fast, sent = fast_function(specs, images=(None, None), exact=True)
    taken = fast((value,)) is not NotImplemented
    assert taken == (conversion_cost(specs, [None], [value]) == (0, 0, 0))
    if taken:
        assert sent[-1][1] == general_bytes(specs, (value,))


def test_a_kernel_that_compiled_another_image_since_goes_to_the_general_path():
    images = {"float32": None}  # a client kernel's images by signature
    fast, sent = fast_function([ArgSpec("scalar", "float32")], images=images)
    assert fast((1.0,)) is None
    images["float64"] = None  # a Python float now picks the float64 image
    assert fast((1.0,)) is NotImplemented and len(sent) == 1
