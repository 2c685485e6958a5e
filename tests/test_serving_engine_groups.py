"""The engine's groups (`serving.engine`, `Lane.group`): `advance` steps only the groups of G
slots that hold a live sentence, each at its one shape, so on conftest's trained model

* a sentence's hypotheses and scores are the same bytes whatever the table's size R (the
  settings' `batch_tokens`; before groups, another R moved most scores' last bits on XLA:CPU),
  at the CPU's G and at the settings' `slot_group`, in groups halved in each tier above the
  first (down to 4 on a CPU);
* a group with no live slot is left as it was by an `advance` call (not stepped, not copied
  over), while the live group's sentences move on.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import held_out_sources

from flax_transformer import Translator
from flax_transformer.serving import engine

pytestmark = pytest.mark.slow  # A trained workdir (conftest's, built once per session).


@pytest.fixture(scope="module")
def translator(trained_workdir) -> Translator:
  return Translator.from_workdir(trained_workdir)


@pytest.fixture(scope="module")
def sources(trained_workdir, translator) -> list[str]:
  """16 held-out sources of 32 tokens (one lane)."""
  return held_out_sources(trained_workdir, translator, 32, 16)


@pytest.mark.parametrize("slot_group, group, small_table", [(0, 8, 8), (16, 16, 16)])
def test_a_sentences_bytes_do_not_depend_on_the_tables_size(translator, sources, slot_group,
                                                            group, small_table):
  """At G = 8 (the CPU's, `slot_group` 0) and 16, the sources of 32 tokens: 256 tokens make a
  table of 256 / 32 = 8 slots (at least G: 16 at G = 16), 1024 tokens one of 32, and the bytes
  are the same."""
  for tokens, slots in ((256, small_table), (1024, 32)):
    call = translator.slot_call(sources[:1], engine="slots", batch_tokens=tokens,
                                slot_group=slot_group)
    lane = engine.Engine(translator.model_config, translator.params, call.spec).lane_of(
        call.requests[0])
    assert (lane.slots, lane.group) == (slots, group)
    tiers = engine._tier_lanes(lane, call.spec.least_group)
    assert len(tiers) >= 3  # Groups of G, G / 2 and G / 4 (at least 4) are met.
    assert [tier.group for tier in tiers] == [max(4, group >> t) for t in range(len(tiers))]
    assert {tier.group for tier in engine._tier_lanes(lane, group)} == {group}  # A GPU's.
  small = translator.translate_nbest(sources, engine="slots", batch_tokens=256,
                                     slot_group=slot_group)
  assert translator.translate_nbest(sources, engine="slots", batch_tokens=1024,
                                    slot_group=slot_group) == small
  assert {len(row) for row in small} == {4}  # The n-best of beam 4, scores compared exactly.


def test_advance_steps_only_the_groups_with_a_live_slot(translator, sources):
  call = translator.slot_call(sources, engine="slots", batch_tokens=512)  # R = 16: 2 groups.
  run_ = engine.Engine(translator.model_config, translator.params, call.spec)
  for index, request in enumerate(call.requests):
    run_.add(request, index)
  (lane_run,) = run_.lanes.values()
  assert (lane_run.lanes[0].slots, lane_run.lanes[0].group) == (16, 8)
  lane_run._admit(lane_run.queue)
  assert lane_run.live[0].all()  # Admitted into slots 0 to 15.
  before = jax.tree.map(np.array, lane_run.tables[0].state)
  lane_run.live[0][8:] = False  # Only group 0 holds live sentences now.
  list(lane_run._advance(0, [16], 16, bounded=True))
  after = jax.tree.map(np.array, lane_run.tables[0].state)
  for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
    np.testing.assert_array_equal(new[8:], old[8:])  # Group 1: untouched.
  assert (after.step[:8] > before.step[:8]).all()  # Group 0: stepped.
