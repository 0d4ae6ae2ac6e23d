"""The kernels of numba-cuda's test modules as plain data, and back, without a GPU.

The conformance run on the GPU machine records every kernel it compiles
through daskgpu (``--daskgpu-manifest``): where its function is defined (the
module, and for a function defined inside a test, its line and its closure's
values), its numba argument types and its ``cuda.jit`` options. Nothing of
that is code: the argument types pickle as numba's type objects, closure
values as plain values or as references to other functions. The no-GPU CI
check (``test_kernels_compile.py``) rebuilds each function from the installed
module's source, with test modules imported on a fake device, and compiles it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import pickle
import types as pytypes

#: cuda.jit options that a record keeps (the ones that change the compiled code).
OPTIONS = ("fastmath", "debug", "lineinfo", "max_registers", "opt", "lto", "link",
           "launch_bounds", "inline", "forceinline")


class Unencodable(Exception):
    """A kernel whose function cannot be named as plain data (its closure holds
    something that only exists in the process that ran the test)."""


# -- recording (on the GPU machine, in the test's process) ----------------------------------------


def record(py_func, argtypes, targetoptions) -> bytes:
    """One kernel compile, as the pickled plain-data record the manifest keeps."""
    entry = {"function": None, "argtypes": tuple(argtypes), "module": py_func.__module__,
             "qualname": py_func.__qualname__,
             "options": {k: targetoptions[k] for k in OPTIONS
                         if targetoptions.get(k) not in (None, False, (), [])}}
    if "link" in entry["options"]:
        entry["options"]["link"] = [_portable_path(p) for p in entry["options"]["link"]]
    try:
        entry["function"] = encode_function(py_func)
    except Unencodable as exc:
        entry["why"] = str(exc)
    return _plain_pickle(entry)


_TESTS_DIR = "/numba/cuda/tests/"


def _portable_path(path):
    # Link files of numba-cuda's tests, wherever numba-cuda is installed.
    path = str(path)
    if _TESTS_DIR in path.replace(os.sep, "/"):
        return ("numba-cuda-tests", path.replace(os.sep, "/").split(_TESTS_DIR, 1)[1])
    return path


def local_path(path):
    """A recorded link path on this machine."""
    if isinstance(path, tuple) and path[0] == "numba-cuda-tests":
        import numba.cuda.tests

        return os.path.join(os.path.dirname(numba.cuda.tests.__file__), *path[1].split("/"))
    return path


def encode_function(fn) -> dict:
    if not isinstance(fn, pytypes.FunctionType):
        raise Unencodable(f"{fn!r} is not a Python function")
    code = fn.__code__
    if not fn.__module__:
        raise Unencodable(f"{fn.__qualname__} was made by exec, from no module's source")
    ref = {"module": fn.__module__, "qualname": fn.__qualname__, "name": fn.__name__,
           "line": code.co_firstlineno}
    if "<locals>" not in fn.__qualname__ and fn.__name__ != "<lambda>":
        ref["global"] = True
        return ref
    cells = fn.__closure__ or ()
    ref["freevars"] = {name: encode_value(cell.cell_contents)
                       for name, cell in zip(code.co_freevars, cells)}
    if fn.__defaults__:
        ref["defaults"] = [encode_value(v) for v in fn.__defaults__]
    return ref


def encode_value(value) -> dict:
    py_func = getattr(value, "py_func", None)
    if py_func is not None and hasattr(value, "targetoptions"):  # a numba-cuda dispatcher
        options = {k: value.targetoptions[k] for k in ("device", *OPTIONS)
                   if value.targetoptions.get(k) not in (None, False, (), [])}
        return {"dispatcher": encode_function(py_func), "options": options}
    dispatcher = getattr(value, "_dispatcher", None)  # a routed kernel
    if dispatcher is not None and hasattr(dispatcher, "py_func"):
        return encode_value(dispatcher)
    if isinstance(value, pytypes.FunctionType):
        return {"function": encode_function(value)}
    if isinstance(value, pytypes.ModuleType):
        return {"module": value.__name__}
    if isinstance(value, type) and value.__module__ == "numba.cuda.stubs":
        # numba-cuda's vector types (float32x2, ...) are classes made at import:
        # by name, they exist only in its table.
        return {"vector_type": value.__name__}
    try:
        return {"value": _plain_pickle(value)}
    except Exception as exc:
        raise Unencodable(f"closure value {type(value).__name__} ({exc})") from None


def _plain_pickle(value) -> bytes:
    # Functions and classes pickle by name, so a value that needs code from the
    # test's own process fails here, not when CI loads it.
    data = pickle.dumps(value, protocol=4)
    pickle.loads(data)
    return data


# -- rebuilding (in CI, without a GPU) ------------------------------------------------------------


class FakeDevice:
    """What numba-cuda's test modules ask of the device when they are imported."""

    compute_capability = (9, 0)
    name = b"no GPU: compile only"
    id = 0

    def __getattr__(self, name):  # attributes such as MAX_THREADS_PER_BLOCK
        return 0


class _FakeContext:
    device = FakeDevice()

    def __getattr__(self, name):
        raise RuntimeError(f"no GPU here: the compile-only check needs no {name}")


@contextlib.contextmanager
def no_gpu_imports():
    """Import numba-cuda's test modules with no driver: device queries see a fake
    device, and eager ``cuda.jit(sig)`` kernels stay lazy (numba would compile
    them for the current device)."""
    import numba.cuda
    import numba.cuda.api as api
    import numba.cuda.decorators as decorators
    from numba.cuda.core import sigutils
    from numba.cuda.cudadrv import devices

    original = decorators.jit
    original = getattr(original, "__wrapped__", original)

    def jit(func_or_sig=None, *args, **kws):
        if sigutils.is_signature(func_or_sig) or isinstance(func_or_sig, list):
            return lambda fn: original(fn, **kws)
        return original(func_or_sig, *args, **kws)

    jit.__wrapped__ = original
    saved = [(numba.cuda, "jit"), (decorators, "jit"), (numba.cuda, "get_current_device"),
             (numba.cuda, "current_context"), (api, "get_current_device"),
             (api, "current_context"), (devices, "get_context")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in saved]
    try:
        numba.cuda.jit = decorators.jit = jit
        numba.cuda.get_current_device = api.get_current_device = lambda: _FakeContext.device
        numba.cuda.current_context = api.current_context = lambda *a: _FakeContext()
        devices.get_context = lambda devnum=None: _FakeContext()
        yield original
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


class Rebuilder:
    """Functions of recorded kernels, made again from the installed modules' source."""

    def __init__(self, jit):
        self.jit = jit  # numba-cuda's own cuda.jit, for device functions in closures
        self._trees: dict = {}

    def function(self, ref: dict):
        if not ref["module"]:
            raise LookupError(f"{ref['qualname']} was made by exec, from no module's source")
        module = importlib.import_module(_importable(ref["module"]))
        if ref.get("global"):
            obj = module
            for part in ref["qualname"].split("."):
                obj = getattr(obj, part)
            return getattr(obj, "py_func", obj)
        node = self._find(module, ref)
        names = list(ref.get("freevars", {}))
        inner = ast.fix_missing_locations(_undecorated(node))
        factory = ast.FunctionDef(
            name="__daskgpu_factory",
            args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names],
                               kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[inner, ast.Return(value=ast.Name(id=node.name, ctx=ast.Load()))],
            decorator_list=[], returns=None, **_TYPE_PARAMS)
        ast.copy_location(factory, node)
        tree = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
        namespace: dict = {}
        # The module's own globals: the function sees its module-level names live.
        exec(compile(tree, module.__file__, "exec"), module.__dict__, namespace)  # noqa: S102
        fn = namespace["__daskgpu_factory"](
            *[self.value(v) for v in ref.get("freevars", {}).values()])
        if ref.get("defaults"):
            fn.__defaults__ = tuple(self.value(v) for v in ref["defaults"])
        fn.__qualname__ = ref["qualname"]
        return fn

    def value(self, encoded: dict):
        if "dispatcher" in encoded:
            return self.jit(self.function(encoded["dispatcher"]), **encoded["options"])
        if "function" in encoded:
            return self.function(encoded["function"])
        if "module" in encoded:
            return importlib.import_module(_importable(encoded["module"]))
        if "vector_type" in encoded:
            from numba.cuda.vector_types import vector_types

            return vector_types[encoded["vector_type"]].user_facing_object
        return pickle.loads(encoded["value"])

    def _find(self, module, ref):
        tree = self._trees.get(module.__file__)
        if tree is None:
            with open(module.__file__) as f:
                tree = self._trees[module.__file__] = ast.parse(f.read(), module.__file__)
        line = ref["line"]
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == ref["name"] and (
                    node.lineno == line or any(d.lineno == line for d in node.decorator_list)):
                return node
        raise LookupError(f"no def {ref['name']} at line {line} of {module.__file__}")


def _importable(name: str) -> str:
    # pytest's importlib mode names numba-cuda's test modules from its rootdir
    # (cuda.tests.cudapy.test_x); installed, they are numba.cuda.tests.cudapy.test_x.
    if name.startswith("cuda.tests."):
        return "numba." + name
    return name


_TYPE_PARAMS = {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}


def _undecorated(node):
    copy = ast.FunctionDef(name=node.name, args=node.args, body=node.body, decorator_list=[],
                           returns=node.returns, type_comment=None, **_TYPE_PARAMS)
    return ast.copy_location(copy, node)
