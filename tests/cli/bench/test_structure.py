"""The bench package runs plain module code: no ``exec`` of source, no class-level state."""

import ast
import pathlib

import pytest

import daskgpu._cli.bench as bench

MODULES = sorted(pathlib.Path(bench.__file__).parent.glob("*.py"))


def _frozen_dataclass(cls: ast.ClassDef) -> bool:
    return any(isinstance(d, ast.Call) and getattr(d.func, "attr", getattr(d.func, "id", ""))
               == "dataclass" and any(k.arg == "frozen" and getattr(k.value, "value", False)
                                      for k in d.keywords)
               for d in cls.decorator_list)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_runs_source_from_strings(path):
    calls = [node.func.id for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in ("exec", "eval", "compile")]
    assert not calls, f"{path.name} calls {calls}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_class_keeps_state_in_class_attributes(path):
    # Fields of a frozen dataclass are defaults of instances that cannot change.
    wrong = [f"{cls.name}.{ast.unparse(stmt).split('=')[0].strip()}"
             for cls in ast.walk(ast.parse(path.read_text()))
             if isinstance(cls, ast.ClassDef) and not _frozen_dataclass(cls)
             for stmt in cls.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))]
    assert not wrong, f"{path.name}: class-level attributes {wrong}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_imports_a_private_name_of_another(path):
    wrong = [f"{node.module}.{alias.name}" for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(bench.__name__)
             for alias in node.names if alias.name.startswith("_")]
    assert not wrong, f"{path.name} imports {wrong}"
