"""Sphinx configuration of daskgpu's documentation (``sphinx-build -W -b html docs OUT``)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))

import daskgpu  # noqa: E402

project = "daskgpu"
copyright = "the daskgpu developers"
author = "the daskgpu developers"
release = version = daskgpu.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "daskgpu_docs",  # the API list from daskgpu.__all__, the settings, the command line
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The docstrings are numpydoc; autodoc documents what daskgpu.__all__ names.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# No network at build time: links to other projects' documentation are plain URLs.
intersphinx_mapping = {}

html_theme = "pydata_sphinx_theme"
html_title = f"daskgpu {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"index": []}
html_show_sourcelink = False
