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

import dataclasses

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


def test_packing_gathers_the_live_slots_into_the_fewest_groups():
  """Against brute force on random tables: after the moves the live slots fill the fewest
  groups, with the fewest moves (every live slot outside the densest groups moves, no other),
  each from a live slot to a free one; `most` bounds the moves, the emptiest groups going
  first."""
  rng = np.random.default_rng(0)
  for _ in range(300):
    group = int(rng.choice([4, 8]))
    live = rng.random(group * int(rng.integers(1, 9))) < rng.random()
    moves = engine.packing(live, group, most=live.size)
    after = live.copy()
    for away, to in moves:
      assert after[away] and not after[to]
      after[away], after[to] = False, True
    counts = live.reshape(-1, group).sum(axis=1)
    need = -(-int(live.sum()) // group)
    assert after.sum() == live.sum()
    assert np.count_nonzero(after.reshape(-1, group).sum(axis=1)) == max(
        need, 0 if moves else np.count_nonzero(counts))
    if np.count_nonzero(counts) > need:
      assert len(moves) == live.sum() - np.sort(counts)[::-1][:need].sum()
    else:
      assert moves == []
  live = np.array([1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0], bool)
  assert engine.packing(live, 4, most=8) == [(14, 3), (16, 4)]  # Into groups 0 and 1.
  live[17] = True  # Group 3 now the emptiest: it goes first.
  assert engine.packing(live, 4, most=1) == [(14, 3)]


def test_a_packed_sentence_keeps_its_bytes(translator, sources, monkeypatch):
  """The 16 sources 7 times over in a lane of 64 slots (8 groups of 8), admitted 32 at a time
  as slots free up, in `advance` calls of 4 loop iterations (each call but those before an
  admission packs first): packing moves some sentences into other groups, and every
  sentence's n-best and scores are the bytes of a run that moves none, and a moved sentence's
  those of it alone."""
  lines, settings = sources * 7, {"engine": "slots", "batch_tokens": 2048}
  moved = []
  pack, start = engine._LaneRun._pack, engine.Engine.__init__

  def short_calls(self, model_config, params, spec):
    start(self, model_config, params, dataclasses.replace(spec, max_iterations=4))

  def counted(self, tier):
    owners = self.owner[tier].copy()
    moves = pack(self, tier)
    moved.extend(owners[moves[moves[:, 1] < self.lanes[tier].slots, 0]].tolist())
    return moves

  monkeypatch.setattr(engine.Engine, "__init__", short_calls)
  monkeypatch.setattr(engine._LaneRun, "_pack", counted)
  packed = translator.translate_nbest(lines, **settings)
  assert len(moved) >= 8, moved
  assert packed == translator.translate_nbest(sources, **settings) * 7
  monkeypatch.setattr(engine._LaneRun, "_pack", engine._LaneRun._no_moves)
  assert translator.translate_nbest(lines, **settings) == packed
  for i in sorted({moved[0], moved[-1]}):  # Request indices: the sentences' own.
    assert translator.translate_nbest([lines[i]], **settings) == [packed[i]]
