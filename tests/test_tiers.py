"""The test tiers (conftest.py): only a test run that leaves the slow tests out compiles with
FAST_TIER_XLA_FLAGS; the pytest processes add IN_PROCESS_XLA_FLAGS, the processes they start do
not; the modules that build costly fixtures run on one worker."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import (
  CHILD_XLA_FLAGS_VARIABLE,
  FAST_TIER_XLA_FLAGS,
  IN_PROCESS_XLA_FLAGS,
  ONE_WORKER_MODULES,
  ONE_WORKER_PER_STORAGE_MODULES,
  built_once,
  in_process_xla_flags,
  leaves_out_slow_tests,
  pytest_collection_modifyitems,
  xdist_group_of,
  xla_defaults_asked,
)


@pytest.mark.parametrize("markexpr, fast", [
    ("not slow", True), ("not  slow", True), ("not slow and not gpu", True),
    ("", False), (None, False), ("slow", False), ("gpu", False), ("not slowest", False)])
def test_the_fast_tier_is_a_mark_expression_that_says_not_slow(markexpr, fast):
  assert leaves_out_slow_tests(markexpr) == fast


# Prints this process's device count and the XLA debug options it compiles with (the flags it
# read, as XLA dumps them into the folder argv[1]).
_COMPILE_AND_SHOW_FLAGS = """
import sys
from pathlib import Path

import jax

jax.jit(lambda x: x * 2).lower(1.0).compile(compiler_options={"xla_dump_to": sys.argv[1]})
print(jax.device_count(), *(path.read_text() for path in Path(sys.argv[1]).glob("*.debug_options")))
"""


def test_each_process_compiles_with_the_flags_of_its_tier(request, tmp_path, capsys, monkeypatch):
  fast = leaves_out_slow_tests(request.config.option.markexpr) and not xla_defaults_asked()
  children = os.environ["XLA_FLAGS"]  # What a process that a test starts inherits.
  assert children == os.environ[CHILD_XLA_FLAGS_VARIABLE]
  assert (FAST_TIER_XLA_FLAGS in children) == fast
  if not fast:  # The whole suite's children compile as the product does.
    assert "--xla_backend_optimization_level" not in children
  own = in_process_xla_flags()
  assert own == ("" if fast or xla_defaults_asked() else IN_PROCESS_XLA_FLAGS)
  level_0 = "xla_backend_optimization_level: 0"
  monkeypatch.setattr(sys, "argv", ["-", str(tmp_path / "here")])
  exec(_COMPILE_AND_SHOW_FLAGS, {})
  assert (level_0 in capsys.readouterr().out) == bool(own or fast)
  child = subprocess.run([sys.executable, "-c", _COMPILE_AND_SHOW_FLAGS, str(tmp_path / "child")],
                         capture_output=True, text=True, check=True, timeout=120)
  assert child.stdout.split()[0] == "8"  # XLA accepted the variable: 8 devices.
  assert (level_0 in child.stdout) == fast
  from jax._src import cache_key  # This process's programs are cached under keys of their own.

  assert cache_key.custom_hook() == own


def test_each_one_worker_module_exists_and_its_tests_share_one_group(request):
  tests = Path(__file__).parent
  assert all((tests / f"{module}.py").is_file() for module in ONE_WORKER_MODULES)
  assert "--dist loadgroup" in " ".join(request.config.getini("addopts"))

  assert all((tests / f"{module}.py").is_file() for module in ONE_WORKER_PER_STORAGE_MODULES)

  class Item:  # What pytest_collection_modifyitems reads and writes of a pytest.Item.
    def __init__(self, module_name, **params):
      self.module, self.marks = types.ModuleType(module_name), []
      if params:
        self.callspec = types.SimpleNamespace(params=params)

    def add_marker(self, mark):
      self.marks.append(mark)

  items = [Item("test_cli"), Item("test_tiers"), Item("test_interop_marian"),
           Item("test_training_resume", shared="gs", kind="local"),
           Item("test_training_resume", shared="local")]
  pytest_collection_modifyitems(items)
  assert [[(m.name, m.args) for m in item.marks] for item in items] == [
      [("xdist_group", ("test_cli",))], [], [("xdist_group", ("test_interop_marian",))],
      [("xdist_group", ("test_training_resume-gs",))],
      [("xdist_group", ("test_training_resume-local",))]]
  # pytest-xdist read the marks: in a loadgroup session, its hook gave each collected test its
  # group, by which it schedules (a mark added after its hook groups nothing).
  if request.config.getoption("loadgroup", default=False):  # Absent without workers (-n 0).
    for item in request.session.items:
      group = xdist_group_of(item)
      assert item.nodeid.endswith(f"@{group}") if group else "@" not in item.nodeid, item.nodeid


class _TmpPathFactory:
  """What built_once reads of pytest's tmp_path_factory: a worker's own temp folder."""

  def __init__(self, basetemp: Path):
    self.basetemp = basetemp

  def getbasetemp(self) -> Path:
    return self.basetemp


_WORKER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from conftest import built_once
from test_tiers import _TmpPathFactory

def build(folder):
  with open(Path(sys.argv[2]) / "builds.txt", "a") as log:
    log.write("build\\n")
  time.sleep(1.0)  # Long enough for the other worker to ask while this one builds.
  (folder / "data.txt").write_text("built")

folder = built_once(_TmpPathFactory(Path(sys.argv[2]) / sys.argv[3]), "thing", build)
print((folder / "data.txt").read_text())
"""


@pytest.mark.slow  # Spawns two processes.
def test_built_once_builds_once_for_two_workers_and_again_after_a_failed_build(tmp_path):
  for name in ("gw0", "gw1"):
    (tmp_path / name).mkdir()
  workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(Path(__file__).parent),
                               str(tmp_path), name], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTEST_XDIST_WORKER": name})
             for name in ("gw0", "gw1")]
  assert [worker.communicate(timeout=120)[0] for worker in workers] == ["built\n"] * 2
  assert (tmp_path / "builds.txt").read_text() == "build\n"  # Once, for both workers.

  def failing(folder):
    (folder / "half").write_text("")
    raise RuntimeError("build failed")

  factory = _TmpPathFactory(tmp_path / "gw0")
  with pytest.raises(RuntimeError, match="build failed"):
    built_once(factory, "other", failing)
  folder = built_once(factory, "other", lambda f: (f / "whole").write_text(""))
  assert sorted(p.name for p in folder.iterdir()) == ["whole"]  # Started over, nothing half.
  assert built_once(factory, "other", failing) == folder  # Built: not built again.
