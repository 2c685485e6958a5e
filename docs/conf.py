"""Sphinx configuration: MyST markdown pages and an API reference from the docstrings.

Build (CI runs exactly this): pip install -e ".[docs]" &&
  sphinx-build -W --keep-going -q -b html docs /tmp/docs_out
"""

import dataclasses
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "flax-transformer"
author = "the flax-transformer authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.autosummary",
              "sphinx.ext.napoleon", "public_api"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4  # Links to headings: [text](page.md#the-heading).
myst_enable_extensions = ["deflist"]
# The docstrings are Google style ("Args:", "Returns:"), read by napoleon; type hints go into the
# parameter list, not the signature, so that long signatures stay readable.
default_role = "literal"  # `name` in a docstring is code, as it reads in the source.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "sphinx_book_theme"
html_title = "flax-transformer"
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # Wide code blocks and tables scroll instead of being cut off.
html_theme_options = {"show_toc_level": 2}


def _default(field: dataclasses.Field) -> object:
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


class _ShortMystConfigLine(logging.Filter):
  """myst-parser logs its whole configuration as one long line at every build: keep its version
  and the settings this file changes."""

  def filter(self, record: logging.LogRecord) -> bool:
    if isinstance(record.msg, str) and "myst v%s" in record.msg and len(record.args or ()) == 2:
      version, config = record.args
      changed = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)
                 if getattr(config, field.name) != _default(field)}
      record.msg, record.args = "myst v%s, settings changed: %s", (version, changed)
    return True


logging.getLogger("sphinx.myst_parser.sphinx_ext.main").addFilter(_ShortMystConfigLine())
