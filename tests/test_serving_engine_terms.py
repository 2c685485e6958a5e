"""The engine's lanes of terms (`serving.engine`, `Lane.terms`) on the serving tests' random
model, whose outputs run to their length cap: a lane of terms has one cache tier of L positions
(so one `advance` program, and no `migrate`), while the plain lane of the same sentences moves
up its tiers; the constrained search gives the batches' texts, and a sentence's bytes are the
same alone and among others.
"""

from __future__ import annotations

import pytest
from serving_fixtures import WORDS, sentences

from flax_transformer import Translator
from flax_transformer.serving import batching, engine


@pytest.fixture(scope="module")
def translator(workdir) -> Translator:
  return Translator.from_workdir(workdir)


def test_a_lane_of_terms_has_one_tier_and_the_batches_texts(translator, monkeypatch):
  max_len = translator.model_config.max_len
  bucket = lambda s: batching.bucket_length(len(translator.tokenizer.tokenize(s)) + 1, max_len)
  sources = [s for s in sentences(60, seed=5, max_words=8) if bucket(s) == 16][:8]
  assert len(sources) == 8
  decode_len = batching.decode_length(translator.settings.search, 16, max_len)
  assert len(engine.tiers(decode_len)) == 2  # (16, L): the plain lane has two tiers.
  advanced = set()
  advance = engine._LaneRun._advance

  def counted(self, tier, *args, **kwargs):
    lane = self.lanes[tier]
    advanced.add((lane.terms is not None, lane.capacity, lane.slots))
    return advance(self, tier, *args, **kwargs)

  monkeypatch.setattr(engine._LaneRun, "_advance", counted)
  plain = translator.translate_nbest(sources, engine="slots")
  # A word of WORDS that the plain best lacks (the random model's words are not WORDS').
  terms = [[next(w for w in WORDS[i:] + WORDS if w not in row[0][0].split())]
           for i, row in enumerate(plain)]
  terms[1] = plain[1][0][0].split()[-1:]  # Its own last word: the plain answer settles it.
  terms[3] = []  # No terms: its plain lane's answer.
  advanced.clear()
  slots = translator.translate_nbest(sources, engine="slots", constraints=terms)
  rows = engine.lane_for(16, translator.settings.search, translator.settings.batch_tokens,
                         max_len, group=engine.group_slots(0, translator.platform)).slots
  assert {(True, decode_len, max(batching.MIN_ROWS, rows // 2))} == {
      key for key in advanced if key[0]}, advanced  # One tier: the plain lane's last.
  assert {(False, 16, rows), (False, decode_len, rows // 2)} == {
      key for key in advanced if not key[0]}, advanced
  batches = translator.translate_nbest(sources, engine="batches", constraints=terms)
  assert [[text for text, _ in row] for row in slots] == [
      [text for text, _ in row] for row in batches]
  gaps = [abs(a - b) for x, y in zip(slots, batches, strict=True)
          for (_, a), (_, b) in zip(x, y, strict=True)]
  assert max(gaps) < 1e-4, max(gaps)
  assert slots[3] == plain[3] and slots[1][0] == plain[1][0]
  # Alone: the same bytes as among the others (with other terms: test_serving_engine).
  assert translator.translate_nbest([sources[0]], engine="slots",
                                    constraints=[terms[0]]) == [slots[0]]
