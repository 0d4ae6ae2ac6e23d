"""The package's import graph: layers depend one way, and no module imports in a loop.

Every ``import`` is counted, at module level and inside functions alike: a
lazy import still ties two modules together. Third-party imports are held to
each layer's list too, and no module reaches for another module's private
(underscore) names.
"""

import ast
import pathlib
import sys

import daskgpu

PACKAGE = pathlib.Path(daskgpu.__file__).parent

#: Each layer, and the layers it may import. The CLI sits on top; the base
#: (config, errors, files) imports no other daskgpu module.
LAYERS = {
    "_cli": {"_cli", "_dask", "_compiler", "_runtime", "_image", "base"},
    "_dask": {"_dask", "_compiler", "_runtime", "_image", "base"},
    "_compiler": {"_compiler", "_runtime", "_image", "base"},
    "_runtime": {"_runtime", "_image", "base"},
    "_image": {"_image", "base"},
    "base": {"base"},
}


#: The third-party packages each layer may import (the standard library is free).
#: The plain-data image and the worker runtime know nothing of Dask: a worker
#: plugin in the Dask layer decides what a worker does about a failed launch.
#: Only the simulator backend of the runtime imports numba (it runs kernels in
#: Numba's CUDA simulator); the GPU half never does (tests/test_worker_half.py).
THIRD_PARTY = {
    "_image": {"numpy"},
    "_runtime": {"numpy", "cuda", "nvtx"},  # nvtx: optional, imported under a profiler
    "_compiler": {"numpy", "numba", "numba_cuda", "llvmlite", "cuda", "cloudpickle"},
    "_dask": {"numpy", "dask", "distributed", "cupy", "zarr", "tqdm", "prometheus_client",
              "tornado"},  # tornado: distributed's event loop, for a worker's periodic callback
    "_cli": None,  # the command line may use anything
    "base": {"yaml", "dask"},  # the settings register with dask.config when it is there
}
SIMULATOR_THIRD_PARTY = {"numpy", "cuda", "numba", "cloudpickle"}


def _module_name(path: pathlib.Path) -> str:
    parts = ["daskgpu", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict:
    """``{module: {daskgpu modules it imports}}``, from the source of every module."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    head = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(head + ([base] if base else []))
                for alias in node.names:  # `from pkg import module` imports the module
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    if module == "daskgpu" or parts[1] in ("__main__",):
        return "top"
    return parts[1] if parts[1] in LAYERS else "base"


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # The backend reaches the GPU launch only when a launch runs on a GPU.
    assert "daskgpu._runtime.gpu.run" in graph["daskgpu._runtime.backends.gpu"]


def test_no_module_imports_another_in_a_loop():
    graph = import_graph()
    # The package's __init__ serves names lazily from the layers; leave it out,
    # as `import daskgpu` by a module means the public API, not a loop.
    graph = {m: {t for t in ts if t != "daskgpu"} for m, ts in graph.items() if m != "daskgpu"}
    state, loops = {}, []

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                loops.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(loop) for loop in loops)


#: Outside the runtime, the GPU is reached through its backend
#: (``daskgpu._runtime.backends``); only the bench measures the GPU modules themselves.
GPU_MODULES_OPEN_TO = ("daskgpu._runtime.", "daskgpu._cli.bench")


def test_only_the_runtime_and_the_bench_reach_into_the_gpu_modules():
    wrong = []
    for module, targets in import_graph().items():
        if module.startswith(GPU_MODULES_OPEN_TO) or module == "daskgpu._runtime":
            continue
        wrong += [f"{module} imports {t}" for t in targets
                  if t == "daskgpu._runtime.gpu" or t.startswith("daskgpu._runtime.gpu.")]
    assert not wrong, "use daskgpu._runtime.backends instead:\n" + "\n".join(sorted(wrong))


def test_the_gpu_rule_sees_a_reach_around_the_backend():
    graph = import_graph()
    # The bench may; nothing in the Dask layer or the rest of the CLI does.
    assert any(t.startswith("daskgpu._runtime.gpu.") for t in graph["daskgpu._cli.bench.host"])
    assert not any(t.startswith("daskgpu._runtime.gpu")
                   for m in graph if m.startswith(("daskgpu._dask", "daskgpu._cli.main",
                                                    "daskgpu._cli.info"))
                   for t in graph[m])


def test_layers_import_only_downwards():
    wrong = []
    for module, targets in import_graph().items():
        layer = _layer(module)
        if layer == "top":
            continue
        for target in targets:
            if target != "daskgpu" and _layer(target) not in LAYERS[layer]:
                wrong.append(f"{module} ({layer}) imports {target} ({_layer(target)})")
    assert not wrong, "\n".join(wrong)


#: Within the Dask layer, what the shared parts never import (a prefix each). The launch
#: core sits below everything that shares it, as distributed's ``shuffle/_core.py``
#: sits below its plugins; the scheduler plugin and the worker parts import the core,
#: never a feature; the worker's parts never import the scheduler's plugin.
_DASK = "daskgpu._dask."
_FEATURES = (_DASK + "map_kernel", _DASK + "batch")
NEVER = {
    _DASK + "launch_core": (*_FEATURES, _DASK + "placement", _DASK + "workers",
                            _DASK + "cluster"),
    _DASK + "placement": (*_FEATURES, _DASK + "workers", _DASK + "cluster"),
    _DASK + "workers": (*_FEATURES, _DASK + "placement", _DASK + "cluster"),
    # The client's arguments borrow nothing from what a task runs on a worker.
    _DASK + "map_kernel.arguments": (_DASK + "map_kernel.chunk_params",
                                     _DASK + "map_kernel.chunk_task"),
}


def _never_broken(graph) -> list:
    wrong = []
    for module, targets in graph.items():
        for below, forbidden in NEVER.items():
            if module == below or module.startswith(below + "."):
                wrong += [f"{module} imports {t}" for t in sorted(targets)
                          if any(t == f or t.startswith(f + ".") for f in forbidden)]
    return wrong


def test_the_launch_core_and_the_plugins_import_no_feature():
    wrong = _never_broken(import_graph())
    assert not wrong, "import the launch core (daskgpu._dask.launch_core) instead:\n" + \
        "\n".join(wrong)


def test_the_feature_rule_sees_an_import_of_a_feature():
    graph = {"daskgpu._dask.workers.watchdog": {"daskgpu._dask.placement"},
             "daskgpu._dask.placement": {"daskgpu._dask.map_kernel.chunk_task"},
             "daskgpu._dask.launch_core.walk": {"daskgpu._dask.launch_core.task"},
             "daskgpu._dask.map_kernel.api": {"daskgpu._dask.placement"}}
    assert _never_broken(graph) == [
        "daskgpu._dask.workers.watchdog imports daskgpu._dask.placement",
        "daskgpu._dask.placement imports daskgpu._dask.map_kernel.chunk_task"]


def test_each_layer_is_a_folder_of_a_few_modules():
    for layer in set(LAYERS) - {"base"}:
        assert (PACKAGE / layer).is_dir(), layer
    crowded = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]:
        modules = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        if folder.name != "__pycache__" and not 1 <= len(modules) <= 12:
            crowded[str(folder.relative_to(PACKAGE.parent))] = sorted(modules)
    assert not crowded, f"folders need 1 to 12 modules: {crowded}"


def _third_party(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names
            and n not in ("daskgpu", "__future__")}


def test_layers_import_only_their_third_party_packages():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        layer = _layer(module)
        allowed = THIRD_PARTY.get(layer)
        if module == "daskgpu._runtime.simulator":
            allowed = SIMULATOR_THIRD_PARTY
        if allowed is None:
            continue
        extra = _third_party(ast.parse(path.read_text())) - allowed
        if extra:
            wrong.append(f"{module} ({layer}) imports {sorted(extra)}")
    assert not wrong, "\n".join(wrong)


def _private_names_used(tree, modules) -> list:
    """Underscore names this module takes from other daskgpu modules."""
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("daskgpu"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:  # `from pkg import module`
                    aliases[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and f"{aliases[node.value.id]}.{node.attr}" not in modules):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for use in _private_names_used(ast.parse(path.read_text()), modules):
            wrong.append(f"{_module_name(path)}: {use}")
    assert not wrong, "private names used across modules:\n" + "\n".join(sorted(set(wrong)))


def test_the_private_name_check_sees_both_spellings():
    modules = {"daskgpu._runtime.device", "daskgpu._runtime"}
    tree = ast.parse("from daskgpu._runtime.device import _state\n"
                     "from daskgpu._runtime import device as _device\n"
                     "_device._thread\n")
    assert _private_names_used(tree, modules) == [
        "from daskgpu._runtime.device import _state", "daskgpu._runtime.device._thread"]


def _undocumented_modules() -> dict:
    """``{package: [its modules and subpackages that its docstring does not name]}``."""
    missing = {}
    for init in PACKAGE.rglob("__init__.py"):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = [p.stem for p in folder.glob("*.py") if p.name != "__init__.py"]
        names += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
        unnamed = sorted(n for n in names if n not in doc)
        if unnamed:
            missing[_module_name(init)] = unnamed
    return missing


def test_every_package_docstring_names_its_modules():
    # A folder's map: a newcomer reads the package's docstring to find a module.
    assert _undocumented_modules() == {}
