"""The test tiers (conftest.py): only a session that leaves the slow tests out compiles with
FAST_TIER_XLA_FLAGS; the modules that build costly fixtures run on one worker."""

import os
from pathlib import Path

import pytest
from conftest import (
  FAST_TIER_XLA_FLAGS,
  ONE_WORKER_MODULES,
  leaves_out_slow_tests,
  pytest_collection_modifyitems,
)


@pytest.mark.parametrize("markexpr, fast", [
    ("not slow", True), ("not  slow", True), ("not slow and not gpu", True),
    ("", False), (None, False), ("slow", False), ("gpu", False), ("not slowest", False)])
def test_the_fast_tier_is_a_mark_expression_that_says_not_slow(markexpr, fast):
  assert leaves_out_slow_tests(markexpr) == fast


def test_this_session_compiles_with_the_flags_of_its_tier(request):
  wanted = (leaves_out_slow_tests(request.config.option.markexpr)
            and os.environ.get("FLAX_TRANSFORMER_TEST_XLA") != "default")
  assert (FAST_TIER_XLA_FLAGS in os.environ.get("XLA_FLAGS", "")) == wanted
  import jax

  # XLA read the variable when its CPU backend started and accepted it: 8 devices either way.
  assert jax.device_count() == 8


def test_each_one_worker_module_exists_and_its_tests_share_one_group(request):
  tests = Path(__file__).parent
  assert all((tests / f"{module}.py").is_file() for module in ONE_WORKER_MODULES)
  assert "--dist loadgroup" in " ".join(request.config.getini("addopts"))

  class Item:  # What pytest_collection_modifyitems reads and writes of a pytest.Item.
    def __init__(self, module_name):
      self.module, self.marks = type(os)(module_name), []

    def add_marker(self, mark):
      self.marks.append(mark)

  items = [Item("test_cli"), Item("test_tiers"), Item("test_interop_marian")]
  pytest_collection_modifyitems(items)
  assert [[(m.name, m.args) for m in item.marks] for item in items] == [
      [("xdist_group", ("test_cli",))], [], [("xdist_group", ("test_interop_marian",))]]
