"""The floor plan, read from the code: every import between the package's modules (those inside
functions included, and the CLI's lazy "flax_transformer.module:function" targets) is parsed
with `ast`, and the test fails on an arrow that points up, on an arrow `ALLOWED` lists but no
import uses (a new one must be added on purpose), or on a cycle, so the layout in the README
stays true as the code changes."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flax_transformer"

# Each room (a subpackage or a top-level module) and the rooms it imports, no more and no fewer.
# Lower rooms never name higher ones: cli -> planning -> training -> server / bulk -> serving /
# interop ->
# decoding + workdir -> data -> config -> model -> files, validation, runtime -> errors,
# conventions.
ALLOWED = {
    "errors": set(),  # The one family of errors: every room may raise them.
    "conventions": set(),  # Special token ids and batch keys, written once.
    "exports": set(),  # lazy_exports: a package's public names, imported on first use.
    "files": {"errors"},
    "validation": {"errors"},
    "progress": set(),
    "scoring": {"errors", "files"},
    "runtime": {"exports", "errors"},
    "model": {"exports", "conventions", "validation", "runtime", "files"},
    "config": {"conventions", "model", "validation"},
    "experiment_flags": {"config"},
    "data": {"exports", "conventions", "errors", "config", "files", "progress"},
    "decoding": {"exports", "conventions", "model", "runtime"},
    "workdir": {"errors", "model", "data", "config", "files", "runtime"},
    "visualize": {"errors", "workdir", "data", "model", "files", "runtime"},
    "serving": {"exports", "errors", "decoding", "workdir", "model", "data", "config", "files",
                "progress", "runtime"},
    "bulk": {"exports", "conventions", "errors", "serving", "workdir", "model", "data", "config",
             "files", "progress", "runtime", "scoring"},
    "server": {"exports", "errors", "serving", "data", "config", "files"},
    "interop": {"exports", "errors", "workdir", "model", "data", "config", "validation", "files"},
    "training": {"exports", "conventions", "errors", "serving", "workdir", "model", "data",
                 "config", "validation", "files", "progress", "scoring", "runtime"},
    "planning": {"errors", "training", "serving", "decoding", "model", "config", "runtime"},
    "cli": {"errors", "serving", "bulk", "server",
            "interop", "planning", "workdir", "visualize", "scoring",
            "config", "experiment_flags", "runtime", "data"},
    "__init__": {"exports", "errors", "config", "model", "decoding", "serving", "runtime",
                 "conventions", "data", "files", "interop", "scoring", "training", "workdir",
                 "experiment_flags"},
}
# Modules that must not import some rooms even where their room may: the search core works on
# any step function (the bridge, decoding/bridge.py, is where the model plugs in).
MODULE_LIMITS = {
    f"decoding.{name}": {"model", "data", "config"}
    for name in ("search", "beam", "plain_beam", "beam_state", "constrained_beam", "sampling",
                 "constraints", "loop", "topk")
}


def _modules() -> dict[str, Path]:
  """'serving.translator' -> path, for every module of the package ('x' for x/__init__.py)."""
  names = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
      parts = parts[:-1]
    names[".".join(parts)] = path
  return names


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
  """The package's modules that `name` imports, anywhere in its file."""
  package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(
        r"flax_transformer(\.\w+)+:\w+", node.value):
      targets = [node.value.replace(":", ".")]  # The CLI's lazy "module:function" targets.
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = ".".join(["flax_transformer", *package[:len(package) - node.level + 1]])
        module = f"{base}.{node.module}" if node.module else base
      else:
        module = node.module or ""
      # `from X import Y`: the module X.Y when Y is one, else X (Y is a name in it).
      targets = [f"{module}.{alias.name}" for alias in node.names]
    else:
      continue
    for target in targets:
      if not target.startswith("flax_transformer."):
        continue
      inner = target.removeprefix("flax_transformer.")
      while inner and inner not in modules:  # 'workdir.lock' (a function) -> 'workdir'.
        inner = inner.rpartition(".")[0]
      inner = inner or "__init__"  # `from flax_transformer import Translator`.
      if inner != name:
        found.add(inner)
  return found


def _room(module: str) -> str:
  return module.split(".")[0]


def import_graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_room_is_in_the_plan():
  rooms = {_room(name) for name in import_graph()}
  assert rooms == set(ALLOWED), f"rooms not in ALLOWED: {rooms ^ set(ALLOWED)}"


def test_arrows_point_down():
  upward = []
  for module, targets in sorted(import_graph().items()):
    room = _room(module)
    for target in sorted(targets):
      other = _room(target)
      if other != room and other not in ALLOWED[room]:
        upward.append(f"{module} -> {target}")
      if other in MODULE_LIMITS.get(module, ()):
        upward.append(f"{module} -> {target} (limited)")
  assert not upward, "imports against the floor plan:\n" + "\n".join(upward)


def test_every_allowed_arrow_is_used():
  used = {room: set() for room in ALLOWED}
  for module, targets in import_graph().items():
    used[_room(module)].update(_room(t) for t in targets)
  unused = [f"{room} -> {other}" for room, allowed in sorted(ALLOWED.items())
            for other in sorted(allowed - used[room])]
  assert not unused, "arrows in ALLOWED that no import uses:\n" + "\n".join(unused)


def test_no_cycles_between_rooms():
  rooms: dict[str, set[str]] = {}
  for module, targets in import_graph().items():
    rooms.setdefault(_room(module), set()).update(_room(t) for t in targets)
  for room in rooms:
    rooms[room].discard(room)
  assert _cycle(rooms) is None, f"a cycle between rooms: {_cycle(rooms)}"


def test_no_cycles_between_modules():
  graph = import_graph()
  assert _cycle(graph) is None, f"a cycle between modules: {_cycle(graph)}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as a path, or None (depth-first search, three colours)."""
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state and (found := visit(nxt)):
        return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


@pytest.mark.parametrize("edge", [("model.layers", "workdir"), ("data.pipeline", "training.loop"),
                                  ("decoding.search", "model.transformer"),
                                  ("serving.translator", "training.steps")])
def test_an_upward_arrow_is_caught(edge, monkeypatch):
  """The checks can fail: one added upward import is reported."""
  graph = import_graph()
  graph[edge[0]] = graph[edge[0]] | {edge[1]}
  monkeypatch.setattr(__import__(__name__), "import_graph", lambda: graph)
  with pytest.raises(AssertionError, match=edge[0].replace(".", r"\.")):
    test_arrows_point_down()


def test_a_cycle_is_caught():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_files_and_validation_import_only_the_errors():
  graph = import_graph()
  files = {_room(target) for module, targets in graph.items() if _room(module) == "files"
           for target in targets} - {"files"}
  assert graph["errors"] == set()
  assert files == {"errors"} and graph["validation"] == {"errors"}


# Modules that may import pathlib: files/, the one filesystem layer, and a reader of the fixed
# local folder /dev. Every path a user gives goes through files.to_path (`Path("gs://b")` is
# "gs:/b": a pathlib path silently turns a bucket into a local folder).
PATHLIB_ALLOWED = {"files", "files.storage", "files.atomic", "files.lines", "files.outputs",
                   "runtime.platforms"}


def _imports_pathlib(path: Path) -> bool:
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import) and any(a.name == "pathlib" for a in node.names):
      return True
    if isinstance(node, ast.ImportFrom) and node.module == "pathlib":
      return True
  return False


def test_no_module_builds_a_pathlib_path_from_a_users_path():
  found = sorted(name for name, path in _modules().items()
                 if name not in PATHLIB_ALLOWED and _imports_pathlib(path))
  assert not found, f"modules importing pathlib outside files/: {found}"


def _run_python(code: str) -> str:
  """The standard output of `code` run in a fresh Python process at the repository's root,
  which must succeed (its stderr is the failure message otherwise)."""
  import subprocess
  import sys

  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
  assert result.returncode == 0, result.stderr
  return result.stdout


@pytest.mark.slow  # Spawns processes.
def test_importing_the_package_loads_no_jax_until_a_public_name_is_used():
  code = ("import sys, flax_transformer as ft\n"
          "assert 'jax' not in sys.modules and 'flax' not in sys.modules, 'eager import'\n"
          "assert set(ft.__all__) <= set(dir(ft))\n"
          "names = {name: getattr(ft, name) for name in ft.__all__}\n"
          "assert 'jax' in sys.modules\n"
          "from flax_transformer.serving.translator import Translator\n"
          "assert names['Translator'] is Translator\n"
          "try:\n"
          "  ft.NoSuchName\n"
          "except AttributeError as error:\n"
          "  print(error)\n")
  assert "has no attribute 'NoSuchName'" in _run_python(code)


@pytest.mark.slow  # Spawns a process.
def test_the_serving_path_loads_neither_tfds_nor_grain():
  """translate, evaluate and a Translator need the tokenizer, not the data pipeline (TFDS and
  grain, about 0.2 s of every CLI call's start)."""
  code = ("import sys\n"
          "import flax_transformer.workdir, flax_transformer.bulk.commands\n"
          "import flax_transformer.bulk.jobs, flax_transformer.serving.translator\n"
          "print(sorted(m for m in ('tensorflow_datasets', 'grain') if m in sys.modules))\n")
  assert _run_python(code).strip() == "[]"


# ------------------------------------------------------------------ each room's public names
def _public(room: str) -> set[str]:
  """The `__all__` of a room: a subpackage's `__init__` or a top-level module."""
  return set(importlib.import_module(f"flax_transformer.{room}").__all__)


def _imported_names(source: str) -> list[tuple[str, str]]:
  """(module, name) of every `from flax_transformer... import name` and `import
  flax_transformer.x.y` (as (x, y)) in `source`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom) and not node.level and (
        node.module or "").startswith("flax_transformer"):
      found += [(node.module, alias.name) for alias in node.names]
    elif isinstance(node, ast.Import):
      found += [(alias.name.rsplit(".", 1)[0], alias.name.rsplit(".", 1)[1])
                for alias in node.names if alias.name.startswith("flax_transformer.")]
  return found


def test_rooms_import_only_what_other_rooms_make_public():
  """A module may use another room's name only if that room lists it in `__all__` (its
  `__init__`, or the top-level module's own), whichever module of the room defines it."""
  problems = []
  for name, path in _modules().items():
    room = name.split(".")[0]
    for module, imported in _imported_names(path.read_text()):
      parts = module.split(".")
      if len(parts) < 2 or parts[1] == room:
        continue  # `from flax_transformer import room`, or the room's own modules.
      if imported not in _public(parts[1]):
        problems.append(f"{name}: from {module} import {imported}")
  assert not problems, "\n".join(problems)


def test_every_public_name_resolves():
  for room in {name.split(".")[0] for name in _modules()} - {"__init__", "cli", "planning"}:
    module = importlib.import_module(f"flax_transformer.{room}")
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, (room, missing)
  import flax_transformer

  assert [name for name in flax_transformer.__all__ if not hasattr(flax_transformer, name)] == []


def _notebook_and_readme_code() -> dict[str, str]:
  code = {}
  for notebook in sorted((PACKAGE.parent / "notebooks").glob("*.ipynb")):
    cells = json.loads(notebook.read_text())["cells"]
    code[notebook.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
  for page in [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md"))]:
    code[page.name] = "\n".join(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
  return code


def test_notebooks_readme_and_docs_import_only_public_names():
  """What users copy: `from flax_transformer import X` (the top-level API) or a room's public
  names (`from flax_transformer.data import split_texts`), never a module inside a room."""
  import flax_transformer

  problems = []
  for where, source in _notebook_and_readme_code().items():
    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(
        ("!", "%")))  # Shell and magic lines are not Python.
    for module, name in _imported_names(source):
      parts = module.split(".")
      public = (set(flax_transformer.__all__) | {"visualize"} if len(parts) == 1
                else _public(parts[1]) if len(parts) == 2 else set())
      if name not in public:
        problems.append(f"{where}: from {module} import {name}")
  assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ design.md's layout map
DESIGN = PACKAGE.parent / "docs" / "design.md"


def _map_files(page: str) -> set[str]:
  """The package's files that the layout map of `page` (the first code block under "## Code
  layout") names, relative to the package: a line whose name starts at column 0, 2 or 4 (a
  deeper one goes on describing the line above) names a file ("lines.py") or a folder
  ("serving/": its __init__.py) in the folder named above it at the smaller indent."""
  block = page.split("## Code layout", 1)[1].split("```\n", 2)[1]
  named, folders = set(), []
  for line in block.splitlines():
    match = re.match(r"( *)([\w.]+/?)(?:\s|$)", line)
    if not match or len(match.group(1)) not in (0, 2, 4):
      continue
    depth, name = len(match.group(1)) // 2, match.group(2)
    folders = folders[:depth]
    path = "".join(folders) + name
    if name.endswith("/"):
      folders.append(name)
      path += "__init__.py"
    if path.startswith("flax_transformer/"):
      named.add(path.removeprefix("flax_transformer/"))
  return named


def _map_problems(named: set[str]) -> list[str]:
  """A line per module of the package the map leaves out, and per file it names that is gone."""
  present = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
  return ([f"not in design.md's layout map: flax_transformer/{name}"
           for name in sorted(present - named)]
          + [f"design.md's layout map names a file that is gone: flax_transformer/{name}"
             for name in sorted(named - present)])


def test_the_layout_map_lists_every_module():
  """Every module of the package is on design.md's map, and every file the map names exists."""
  problems = _map_problems(_map_files(DESIGN.read_text()))
  assert not problems, "\n".join(problems)


def test_the_layout_map_check_can_fail():
  page = DESIGN.read_text()
  named = _map_files(page)
  assert {"__init__.py", "files/__init__.py", "files/lines.py", "serving/__init__.py",
          "serving/translator.py", "cli/__main__.py"} <= named
  cut = page.replace("    translator.py ", "    translatorx.py ", 1)
  assert _map_problems(_map_files(cut)) == [
      "not in design.md's layout map: flax_transformer/serving/translator.py",
      "design.md's layout map names a file that is gone: flax_transformer/serving/translatorx.py"]


# ------------------------------------------------------------------ design.md's promises
TESTS = PACKAGE.parent / "tests"


def _cited_tests(page: str) -> list[str]:
  """The tests that "Promises and their tests" names, as FILE::TEST: `tests/FILE::TEST`, or
  `::TEST` in the file named before it."""
  section = page.split("### Promises and their tests", 1)[1].split("\n## ", 1)[0]
  cited, current = [], None
  for match in re.finditer(r"`(test_\w+\.py)?::(test_\w+)", section):
    current = match.group(1) or current
    cited.append(f"{current}::{match.group(2)}")
  return cited


def _missing_tests(cited: list[str]) -> list[str]:
  """Those of `cited` whose file has no top-level function of that name."""
  defined: dict[str, set[str]] = {}
  for name in {test.split("::")[0] for test in cited}:
    path = TESTS / name
    tree = ast.parse(path.read_text()) if path.exists() else ast.Module(body=[])
    defined[name] = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
  return [test for test in cited if test.split("::")[1] not in defined[test.split("::")[0]]]


def test_every_test_the_promises_cite_exists():
  """A test that goes or is renamed leaves its promise in design.md with a name that checks
  nothing: each name cited there is a test of the file it names."""
  cited = _cited_tests(DESIGN.read_text())
  assert len(cited) > 150
  assert not _missing_tests(cited), "\n".join(_missing_tests(cited))
  assert _missing_tests(["test_model.py::test_no_such_test"]) == [
      "test_model.py::test_no_such_test"]


# ------------------------------------------------------------------ short functions
MAX_FUNCTION_LINES = 60  # From `def` to the body's last line (STYLE.md: small functions).
# "path:Qualified.name" -> the most lines it may have, for a function over the limit not split
# yet. The list can only shrink: a function may not grow past its entry, and once it is split
# (gone or within the limit) its entry must go, or the test fails.
LONG_FUNCTIONS: dict[str, int] = {}


def _function_lengths(source: str) -> dict[str, int]:
  """'f', 'Class.method', 'outer.inner' -> lines from `def` to the body's last line, of every
  function in `source` (the longest of two that share a name)."""
  lengths: dict[str, int] = {}

  def visit(node: ast.AST, prefix: str) -> None:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        lengths[name] = max(lengths.get(name, 0), child.end_lineno - child.lineno + 1)
        visit(child, f"{name}.")
      else:
        visit(child, f"{prefix}{child.name}." if isinstance(child, ast.ClassDef) else prefix)

  visit(ast.parse(source), "")
  return lengths


def _long_functions() -> dict[str, int]:
  """'cli/workdirs.py:add_commands' -> lines, of every function of the package over the limit."""
  found = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    relative = path.relative_to(PACKAGE).as_posix()
    found.update((f"{relative}:{name}", lines) for name, lines in
                 _function_lengths(path.read_text()).items() if lines > MAX_FUNCTION_LINES)
  return found


def test_no_function_is_over_60_lines():
  found = _long_functions()
  new = [f"{name}: {lines} lines" for name, lines in sorted(found.items())
         if lines > LONG_FUNCTIONS.get(name, MAX_FUNCTION_LINES)]
  assert not new, "split these into named pieces with one job each:\n" + "\n".join(new)
  split = sorted(set(LONG_FUNCTIONS) - set(found))
  assert not split, f"split or gone: remove their LONG_FUNCTIONS entries: {split}"


def test_a_long_function_is_caught():
  source = ("class A:\n  def f(self):\n" + "".join(f"    x = {i}\n" for i in range(59))
            + "def g():\n  def h():\n    pass\n  return h\n")
  assert _function_lengths(source) == {"A.f": 60, "g": 4, "g.h": 2}
  assert _function_lengths(source.replace("x = 0\n", "x = 0\n    y = 0\n"))["A.f"] == 61
