"""The test tiers (conftest.py): the fast tier alone compiles with FAST_TIER_XLA_FLAGS."""

import os

from conftest import FAST_TIER_XLA_FLAGS


def test_only_a_session_without_the_slow_tests_changes_xla_flags(request):
  fast_tier = "not slow" in (request.config.option.markexpr or "")
  wanted = fast_tier and os.environ.get("FLAX_TRANSFORMER_TEST_XLA") != "default"
  assert (FAST_TIER_XLA_FLAGS in os.environ.get("XLA_FLAGS", "")) == wanted
  import jax

  # XLA read the variable when the CPU backend started: 8 devices either way.
  assert jax.device_count() == 8
