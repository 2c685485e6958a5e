"""A package's public names, imported when first used: the one helper behind every
`__init__.py` that lists its interface (`__all__`) without importing its modules up front (as
gemma's `epy.lazy_api_imports` does). No imports of the package: every package may use it.

  __getattr__, __dir__ = lazy_exports(__name__, {"Translator": "translator:Translator",
                                                 "bulk": "bulk"})
  __all__ = ["Translator", "bulk"]

Each value names a module of the package ("bulk") or an attribute of one ("translator:Translator");
a module named in full ("flax_transformer.serving.translator:Translator") is taken as it is: the
top-level package names its subpackages' modules so, and tests/test_package_layout.py reads such
full names as the arrows between rooms that they are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """(`__getattr__`, `__dir__`) for the module `package` whose public names are `exports`."""
  namespace = importlib.import_module(package).__dict__
  root = package.partition(".")[0]  # "flax_transformer": a target named in full begins so.

  def getattr_(name: str) -> Any:
    target = exports.get(name)
    if target is None:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    if not module.startswith(f"{root}."):
      module = f"{package}.{module}"
    value = importlib.import_module(module)
    if attribute:
      value = getattr(value, attribute)
    namespace[name] = value  # Later lookups skip __getattr__.
    return value

  def dir_() -> list[str]:
    return sorted({*namespace, *exports})

  return getattr_, dir_


__all__ = ["lazy_exports"]
