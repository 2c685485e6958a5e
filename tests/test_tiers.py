"""The test tiers (conftest.py): only a session that leaves the slow tests out compiles with
FAST_TIER_XLA_FLAGS."""

import os

import pytest
from conftest import FAST_TIER_XLA_FLAGS, leaves_out_slow_tests


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
