"""Sphinx directives that generate daskgpu's reference from the code at build time.

- ``.. daskgpu-api::`` lists every name in ``daskgpu.__all__``, grouped by
  :data:`GROUPS`, each with its summary and a page of its own
  (``reference/api/daskgpu.NAME``, written when the build starts, documented with
  autodoc); a name no group lists still gets its page, under "Other names", so a
  name added to ``__all__`` is never left out.
- ``.. daskgpu-settings::`` documents every setting of ``daskgpu._config.SETTINGS``
  from the comments and defaults of the packaged ``daskgpu.yaml``; each entry is a
  ``setting`` object, which ``:setting:`daskgpu.simulate``` links to.
- ``.. daskgpu-cli::`` prints ``daskgpu --help`` and every subcommand's ``--help``,
  as the installed command line prints them now.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import pathlib
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: Sections of the API reference and the names each one holds, in reading order.
GROUPS = {
    "Kernels": ["jit", "kernel", "Kernel", "Launch", "LaunchConfig"],
    "Mapping over dask arrays": ["map_kernel", "Out", "offset", "random_states"],
    "Clusters and workers": ["LocalGPUCluster", "GPUWorkerPlugin", "device_info"],
    "Kernel files": ["save", "load", "PTXKernel", "KernelImage"],
    "Batch jobs": ["run_batch", "BatchReport", "BatchProgress"],
    "Errors": ["DaskGPUError", "BatchError", "BundleError", "CompileError", "ConfigError",
               "ContextLostError", "CUDAError", "DeviceError", "LaunchConfigError",
               "LaunchTimeoutError", "LinkError", "PTXVersionError", "PicklingError"],
    "Version": ["__version__"],
}

#: Exceptions show their docstring and bases; classes their public members.
_EXCEPTION_OPTIONS = ["   :show-inheritance:"]
_CLASS_OPTIONS = ["   :members:"]
#: Also the members a class inherits, when all its bases are daskgpu's own (Kernel's
#: ``configure`` and ``forall`` come from a base; LocalGPUCluster's many from distributed).
_OWN_BASES_OPTIONS = ["   :members:", "   :inherited-members:"]


def public_names() -> list:
    """``daskgpu.__all__``, read at build time."""
    import daskgpu

    return list(daskgpu.__all__)


def grouped_names() -> list:
    """``[(section title, [names])]`` covering every public name exactly once."""
    names = public_names()
    listed = set()
    sections = []
    for title, members in GROUPS.items():
        present = [n for n in members if n in names]
        listed.update(present)
        if present:
            sections.append((title, present))
    rest = [n for n in names if n not in listed]
    if rest:
        sections.append(("Other names", rest))
    return sections


def _autodoc_lines(name: str) -> list:
    import daskgpu

    value = getattr(daskgpu, name)
    if inspect.isclass(value) and issubclass(value, BaseException):
        return [f".. autoexception:: daskgpu.{name}", *_EXCEPTION_OPTIONS]
    if inspect.isclass(value):
        own = all(c.__module__.startswith("daskgpu") for c in value.__mro__[:-1])
        return [f".. autoclass:: daskgpu.{name}", *(_OWN_BASES_OPTIONS if own else _CLASS_OPTIONS)]
    if inspect.isfunction(value):
        return [f".. autofunction:: daskgpu.{name}"]
    if name == "__version__":
        return [f".. data:: daskgpu.{name}", "", f"   The installed version, ``{value!r}``."]
    # A module-level object (dg.offset): its class's docstring says what it stands for.
    doc = inspect.cleandoc(type(value).__doc__ or "")
    return [f".. data:: daskgpu.{name}", "", *("   " + line for line in doc.splitlines())]


#: Where each public name's page is written, relative to the docs folder.
API_PAGES = "reference/api"


def api_page(name: str) -> str:
    """The text of ``name``'s page: its title and its autodoc entry."""
    title = f"daskgpu.{name}"
    return "\n".join([
        ".. This page is written by docs/_ext/daskgpu_docs.py when the site is built.", "",
        title, "=" * len(title), "", *_autodoc_lines(name), ""])


def write_api_pages(app) -> None:
    """One page per public name under :data:`API_PAGES`, and no page of a name gone.

    A page is rewritten only when its text changes, so an incremental build reads
    only what changed.
    """
    folder = pathlib.Path(app.srcdir) / API_PAGES
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {f"daskgpu.{name}.rst": api_page(name) for name in public_names()}
    for stale in folder.glob("*.rst"):
        if stale.name not in wanted:
            stale.unlink()
    for filename, text in wanted.items():
        path = folder / filename
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)


class APIDirective(SphinxDirective):
    """Every name of ``daskgpu.__all__``, grouped, with its summary and its page."""

    def run(self):
        lines = []
        for title, names in grouped_names():
            lines += [title, "-" * len(title), ""]
            lines += [".. list-table::", "   :widths: 30 70", ""]
            for name in names:
                lines += [f"   * - :py:obj:`daskgpu.{name}`", f"     - {_summary(name)}"]
            lines.append("")
        lines += [".. toctree::", "   :hidden:", ""]
        lines += [f"   {API_PAGES.partition('/')[2]}/daskgpu.{name}" for _, names in
                  grouped_names() for name in names]
        return _parse(self, lines)


def _summary(name: str) -> str:
    import daskgpu

    if name == "__version__":
        return "The installed version."
    value = getattr(daskgpu, name)
    doc = (value.__doc__ if inspect.isclass(value) or inspect.isfunction(value)
           else type(value).__doc__) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return re.sub(r"\s+", " ", first)


# -- settings ---------------------------------------------------------------------------------
def setting_docs() -> dict:
    """``{key: (comment text, default)}`` from daskgpu.yaml: each key's comment, as written.

    A comment documents every key that follows it up to the next comment or blank
    line (the pinned pool's three keys share one).
    """
    from daskgpu import _config

    path = os.path.join(os.path.dirname(_config.__file__), "daskgpu.yaml")
    defaults = _config.defaults()["daskgpu"]
    docs, comment, after_key = {}, [], False
    with open(path) as f:
        for line in f:
            text = line.strip()
            if text.startswith("#"):
                if after_key:
                    comment, after_key = [], False
                comment.append(text[1:].strip())
            elif line.startswith("  ") and re.match(r"^[\w-]+:", text):
                key = text.split(":", 1)[0]
                docs[key] = (" ".join(comment), defaults.get(key))
                after_key = True
            elif not text:
                comment, after_key = [], False
    return docs


class SettingsDirective(SphinxDirective):
    """One ``setting`` entry per key of ``daskgpu._config.SETTINGS``."""

    def run(self):
        from daskgpu import _config

        docs = setting_docs()
        lines = []
        for key in _config.SETTINGS:
            text, default = docs.get(key, ("", None))
            env = "DASK_DASKGPU__" + key.upper().replace("-", "_")
            lines += [f".. setting:: daskgpu.{key}", ""]
            lines += [f"   {_escape(text) or 'See daskgpu/daskgpu.yaml.'}", ""]
            # As the YAML file spells it: false, null, "7.5".
            lines += [f"   :Default: ``{json.dumps(default)}``", f"   :Environment: ``{env}``", ""]
        return _parse(self, lines)


def _escape(text: str) -> str:
    return text.replace("*", r"\*").replace("`", r"\`").replace("|", r"\|")


# -- command line -----------------------------------------------------------------------------
def cli_help() -> list:
    """``[(command line, help text)]``: ``daskgpu --help``, then each subcommand's."""
    from daskgpu._cli.main import build_parser, main

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    out = [("daskgpu --help", _capture(main, ["--help"]))]
    for name in sub.choices:
        out.append((f"daskgpu {name} --help", _capture(main, [name, "--help"])))
    return out


def _capture(main, argv) -> str:
    buffer = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal; the page shows 80
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
            main(argv)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return buffer.getvalue().rstrip()


class CLIDirective(SphinxDirective):
    """Each command's ``--help``, generated when the site is built."""

    def run(self):
        lines = []
        for command, text in cli_help():
            title = "``" + command.removesuffix(" --help") + "``"
            lines += [title, "-" * len(title), "", f"``{command}``:", "",
                      ".. code-block:: text", ""]
            lines += [f"   {line}" if line else "" for line in text.splitlines()]
            lines.append("")
        return _parse(self, lines)


def _parse(directive, lines):
    node = nodes.section()
    node.document = directive.state.document
    nested_parse_with_titles(directive.state, StringList(lines, "daskgpu_docs"), node)
    return node.children


def _generated_pages(app, env, added, changed, removed):
    # Their text comes from the code, not from their source files: read them anew on
    # every build, or an incremental build would show the code as it once was.
    return [name for name in env.found_docs
            if name.startswith("reference/") and name != "reference/index"]


def setup(app):
    app.connect("builder-inited", write_api_pages)
    app.connect("env-get-outdated", _generated_pages)
    app.add_object_type("setting", "setting", objname="daskgpu setting",
                        indextemplate="pair: %s; daskgpu setting")
    app.add_directive("daskgpu-api", APIDirective)
    app.add_directive("daskgpu-settings", SettingsDirective)
    app.add_directive("daskgpu-cli", CLIDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
