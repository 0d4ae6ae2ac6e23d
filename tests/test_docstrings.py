"""The objects users meet first have numpydoc examples and documented attributes."""

import inspect

import pytest

from daskgpu._compiler.kernel import Kernel
from daskgpu._image.image import KernelImage
from daskgpu._runtime.launch import Launch, LaunchAPI
from daskgpu._runtime.ptx_kernel import PTXKernel

CLASSES = [Kernel, Launch, PTXKernel, KernelImage]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_class_docstring_has_examples_and_attributes(cls):
    doc = inspect.getdoc(cls)
    assert "Examples\n--------\n>>> " in doc or "Examples\n--------\n" in doc and ">>> " in doc
    assert "Attributes\n----------" in doc


@pytest.mark.parametrize("cls", [*CLASSES, LaunchAPI], ids=lambda c: c.__name__)
def test_public_methods_and_properties_have_docstrings(cls):
    missing = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        func = value.fget if isinstance(value, property) else value
        if callable(func) and not inspect.getdoc(func):
            missing.append(name)
    assert not missing, f"{cls.__name__}: {missing}"
