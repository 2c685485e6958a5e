"""Sphinx configuration: MyST markdown pages and an API reference from the docstrings.

Build: pip install -e ".[docs]" && sphinx-build -W -b html docs docs/_build/html
"""

project = "flax-transformer"
author = "the flax-transformer authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4  # Links to headings: [text](page.md#the-heading).
myst_enable_extensions = ["deflist"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "sphinx_book_theme"
html_title = "flax-transformer"
