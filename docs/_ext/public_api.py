"""The `public-api` directive: one package's `__all__`, each name with its signature and docstring.

  ```{public-api} flax_transformer.model
  ```

renders the package's docstring, a summary table of its public names and one of its public modules,
then every function,
class (with its public methods) and constant it lists, in `__all__`'s order, under its public
path (`flax_transformer.model.Transformer`, not the module that defines it). The names
come from the package itself, so a name added to `__all__` appears without editing the page.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import PycodeError
from sphinx.ext.autodoc import ClassDocumenter
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles


def _kind(value: object) -> str:
  if isinstance(value, types.ModuleType):
    return "module"
  if inspect.isclass(value):
    return "class"
  if callable(value):
    return "function"
  return "data"


class ReexportedClassDocumenter(ClassDocumenter):
  """A class documented again on another package's page (`flax_transformer.Translator` beside
  `flax_transformer.serving.Translator`): without the canonical name (the defining module's),
  which belongs to the page of the package that defines the class, so that the two entries do
  not both claim it."""

  objtype = "reexportedclass"
  directivetype = "class"
  priority = -10  # Never chosen for members; only through its directive.

  def get_canonical_fullname(self) -> str | None:
    return None


def _defined_in(value: object, package: str) -> bool:
  """Whether `value` is defined by a module of `package` itself (not of a subpackage)."""
  return getattr(value, "__module__", "").rpartition(".")[0] == package


def _constant_doc(package: str, name: str, value: object) -> list[str]:
  """The comment (`#:`) or docstring under a constant's assignment in the module that defines
  it (a constant has no `__doc__` of its own: autodoc would show its type's, `dict`'s)."""
  top = package.split(".")[0]
  for module_name, module in sorted(sys.modules.items()):
    if not (module_name == top or module_name.startswith(top + ".")):
      continue
    if getattr(module, name, None) is not value:
      continue
    try:
      docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
    except PycodeError:  # No source (a compiled module): no comment to read.
      continue
    if ("", name) in docs:
      return list(docs[("", name)])
  return []


def _constant_rst(package: str, name: str, value: object) -> list[str]:
  lines = [f".. py:data:: {name}", f"   :module: {package}", f"   :type: {type(value).__name__}"]
  shown = repr(value)
  if len(shown) <= 60:
    lines.append(f"   :value: {shown}")
  lines.append("")
  lines += [f"   {line}" for line in _constant_doc(package, name, value)]
  return lines + [""]


def public_api_rst(package: str) -> list[str]:
  """The reStructuredText of `package`'s reference: summary, then one entry per public name."""
  module = importlib.import_module(package)
  names = list(module.__all__)
  values = {name: getattr(module, name) for name in names}
  lines = [f".. automodule:: {package}", "   :no-members:", ""]
  objects = [name for name in names if _kind(values[name]) != "module"]
  summarized = [name for name in objects if _kind(values[name]) != "data"]
  modules = [name for name in names if _kind(values[name]) == "module"]
  if summarized:
    lines += [".. rubric:: Summary", "", ".. autosummary::", "   :nosignatures:", ""]
    lines += [f"   {name}" for name in summarized] + [""]
  for name in objects:
    kind = _kind(values[name])
    if kind == "data":
      lines += _constant_rst(package, name, values[name])
      continue
    if kind == "class" and not _defined_in(values[name], package):
      kind = "reexportedclass"
    lines.append(f".. auto{kind}:: {package}.{name}")
    if kind in ("class", "reexportedclass"):
      lines.append("   :members:")
    lines.append("")
  if modules:
    # A module's own docstring is written for `help()`, not as reStructuredText: its summary
    # line only, and its public names are the package's above.
    lines += [".. rubric:: Modules", "", ".. autosummary::", ""]
    lines += [f"   {name}" for name in modules] + [""]
  return lines


class PublicApi(SphinxDirective):
  required_arguments = 1
  has_content = False

  def run(self) -> list[nodes.Node]:
    package = self.arguments[0]
    self.env.note_dependency(importlib.import_module(package).__file__)
    # The pages are MyST markdown, whose parser reads nested content as markdown too: the
    # reStructuredText goes in through MyST's eval-rst directive.
    fence = "`" * 6
    lines = [f"{fence}{{eval-rst}}", *public_api_rst(package), fence]
    container = nodes.container()
    nested_parse_with_titles(self.state, StringList(lines, source=package), container)
    return container.children


def setup(app):
  app.setup_extension("sphinx.ext.autodoc")
  app.add_autodocumenter(ReexportedClassDocumenter)
  app.add_directive("public-api", PublicApi)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
