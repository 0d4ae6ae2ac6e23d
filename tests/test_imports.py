"""The package's import graph: layers depend one way, and no module imports in a loop.

Every ``import`` is counted, at module level and inside functions alike: a
lazy import still ties two modules together.
"""

import ast
import pathlib

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
    # launch.py reaches the launcher only when a launch runs on a GPU.
    assert "daskgpu._runtime.launcher" in graph["daskgpu._runtime.launch"]


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


def test_each_layer_is_a_folder_of_a_few_modules():
    for layer in set(LAYERS) - {"base"}:
        modules = [p for p in (PACKAGE / layer).glob("*.py") if p.name != "__init__.py"]
        assert 1 <= len(modules) <= 13, (layer, sorted(p.name for p in modules))
