"""The engine's slot tables (`serving.engine`, `engine="slots"`) on a trained model (conftest's
`trained_workdir`), with the synthetic task's held-out sentences:

* a sentence's hypotheses, scores and word alignments are the same bytes alone, in a file, in
  any shuffle of it and between long and short neighbours;
* the slots translate what the batches translate (the same texts; scores within float32
  rounding, since the programs' shapes differ): beam search with its n-best, greedy decoding,
  sampling with per-line keys, a target prefix, forbidden phrases, a vocabulary shortlist,
  bfloat16, int8 and an ensemble;
* sentences come back as they finish, before the last one is admitted;
* where a hypothesis of beam search is the batches', its word pairs are the batches' (the same
  teacher-forced attention, `serving.engine_alignments`, in programs of other shapes);
* terminology constraints run in slots (each sentence's plain search in its lane, then the
  constrained one in its lane of terms) with the batches' texts, and the same bytes alone, in
  a file, shuffled and among other sentences with other terms.

The searches' own references (brute force, CTranslate2, Hugging Face) check the steps the slots
run (`decoding.slots` calls the searches' step functions): tests/test_decoding_slots.py
compares the machines with the batched searches on the toy chains.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import held_out_sources

from flax_transformer import Translator
from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data.pipeline import split_texts
from flax_transformer.serving import batching, engine

pytestmark = pytest.mark.slow  # A trained workdir (conftest's, built once per session).


@pytest.fixture(scope="module")
def translator(trained_workdir) -> Translator:
  return Translator.from_workdir(trained_workdir)


@pytest.fixture(scope="module")
def sources(trained_workdir) -> list[str]:
  """The 64 held-out test sources and the 16 eval ones: 80 lines of 1 to 3 buckets."""
  data = parse_group(DataConfig, json.loads((trained_workdir / "config.json").read_text())["data"])
  return [s for split in (data.test_split, data.eval_split)
          for s, _ in split_texts(data, split)]


@pytest.fixture(scope="module")
def one_lane(trained_workdir, translator) -> list[str]:
  """16 held-out sources of 32 tokens: one lane, so each of its programs compiles once (tests
  that compile every tier or every option of a lane); their outputs are 9 to 30 tokens."""
  return held_out_sources(trained_workdir, translator, 32, 16)


def assert_same_texts(slots: list, batches: list, tolerance: float = 1e-4) -> None:
  """Every hypothesis's text equal, its score within `tolerance` (float32 rounding of programs
  of other shapes; a wrong search moves scores by far more: 0.05 and up on this model)."""
  assert [[text for text, _ in row] for row in slots] == [
      [text for text, _ in row] for row in batches]
  gaps = [abs(a - b) for x, y in zip(slots, batches, strict=True)
          for (_, a), (_, b) in zip(x, y, strict=True)]
  assert max(gaps) < tolerance, max(gaps)


def aligned_nbest(translator: Translator, sentences: list[str], **settings) -> list[tuple]:
  """Each sentence's (n-best, the word pairs of each hypothesis), in input order."""
  found = {}
  for batch in translator.iter_nbest(sentences, alignments=True, **settings):
    for i, hypotheses, pairs in zip(batch.indices, batch.hypotheses, batch.alignments,
                                    strict=True):
      found[int(i)] = (hypotheses, pairs)
  return [found[i] for i in range(len(sentences))]


# Greedy decoding: test_outputs_longer_than_a_tier_move_up_and_keep_their_texts.
@pytest.mark.parametrize("method", ["beam", "sample"])
def test_slots_translate_what_batches_translate(translator, sources, one_lane, method):
  """Beam search with the word pairs of each hypothesis: where a hypothesis is the batches'
  text, its pairs are the batches' (the same teacher-forced attention in programs of other
  shapes: a last-bit difference could flip a word's pick only at a near tie of two source
  words; none among these 80 x 4)."""
  settings = {"method": method, "temperature": 0.7} if method == "sample" else {"method": method}
  if method == "sample":  # Each line's key: one lane's programs are enough.
    slots = translator.translate_nbest(one_lane, engine="slots", **settings)
    batches = translator.translate_nbest(one_lane, **settings)
  else:
    (slots, pairs), (batches, batch_pairs) = (
        zip(*aligned_nbest(translator, sources, **options, **settings), strict=True)
        for options in ({"engine": "slots"}, {}))
    compared = [(got, want) for row, other, got_row, want_row in zip(
        slots, batches, pairs, batch_pairs, strict=True)
        for (text, _), (other_text, _), got, want in zip(row, other, got_row, want_row,
                                                         strict=True)
        if text == other_text and text]
    assert len(compared) >= 300, len(compared)  # Of 320: the n-best are the same texts.
    assert [got for got, _ in compared] == [want for _, want in compared]
    assert {len(row) for row in slots} == {4}  # The n-best of beam 4.
  assert_same_texts(list(slots), list(batches))


def test_a_sentence_is_the_same_bytes_whatever_else_is_in_flight(translator, sources):
  """Its n-best texts, scores and word alignments (`serving.engine_alignments`)."""
  rng = np.random.default_rng(0)
  in_file = aligned_nbest(translator, sources, engine="slots")
  assert {len(hypotheses) for hypotheses, _ in in_file} == {4}
  assert len({str(pairs) for _, pairs in in_file}) > 40  # Each sentence's own alignments.
  order = rng.permutation(len(sources))
  shuffled = aligned_nbest(translator, [sources[i] for i in order], engine="slots")
  assert [shuffled[list(order).index(i)] for i in range(len(sources))] == in_file
  by_length = sorted(range(len(sources)), key=lambda i: len(sources[i]))
  shortest, longest = sources[by_length[0]], sources[by_length[-1]]
  for i in rng.choice(len(sources), 4, replace=False):
    assert aligned_nbest(translator, [sources[i]], engine="slots") == [in_file[i]]
    between = aligned_nbest(translator, [longest, sources[i], shortest] * 3, engine="slots")
    assert between[1] == between[4] == between[7] == in_file[i]
  plain = translator.translate_nbest(sources, engine="slots")  # Without alignments: the same.
  assert plain == [hypotheses for hypotheses, _ in in_file]


def test_prefix_forbid_and_a_shortlist_run_in_slots(translator, one_lane, tmp_path):
  sources = one_lane
  prefixes = [" ".join(s.split()[:1]) if i % 3 == 0 else "" for i, s in enumerate(sources)]
  batches = translator.translate_nbest(sources, target_prefix=prefixes)
  words = [row[0][0].split() for row in batches]
  forbid = [[w[1]] if len(w) > 2 and i % 2 else [] for i, w in enumerate(words)]
  options = {"target_prefix": prefixes, "forbid": forbid}
  slots = translator.translate_nbest(sources, engine="slots", **options)
  assert_same_texts(slots, translator.translate_nbest(sources, **options))
  assert any(f and f[0] in w for f, w in zip(forbid, words, strict=True))  # Bans bite.
  for (text, _), phrase in zip((row[0] for row in slots), forbid, strict=True):
    assert not phrase or phrase[0] not in text.split()
  shortlist = tmp_path / "shortlist.txt"
  shortlist.write_text("\n".join(row[0][0] for row in batches))
  assert_same_texts(translator.translate_nbest(sources, engine="slots",
                                               vocab_shortlist=str(shortlist)),
                    translator.translate_nbest(sources, vocab_shortlist=str(shortlist)))


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_precisions_run_in_slots(trained_workdir, one_lane, precision):
  served = Translator.from_workdir(trained_workdir, precision=precision)
  sources = one_lane
  slots = served.translate_nbest(sources, engine="slots")
  assert [served.translate_nbest([sources[i]], engine="slots")[0] for i in (3, 13)] == [
      slots[3], slots[13]]
  batches = served.translate_nbest(sources)
  if precision == "int8":  # A last-bit difference can move an activation by one int8 step
    # (groups of 8 slots against the batches: 2.1e-3 at most; a wrong search: 0.05 and up).
    assert_same_texts(slots, batches, tolerance=5e-3)
  else:  # bfloat16 rounds programs of other shapes apart: near-ties may swap.
    agree = sum(a[0][0] == b[0][0] for a, b in zip(slots, batches, strict=True))
    assert agree >= 15, agree  # 16 of 16 on the 2-core Intel Xeon VM.


def test_an_ensemble_runs_in_slots(trained_workdir, one_lane):
  checkpoints = [trained_workdir / "checkpoints" / step for step in ("300", "400")]
  ensemble = Translator.from_checkpoints([str(c) for c in checkpoints])
  assert_same_texts(ensemble.translate_nbest(one_lane, engine="slots"),
                    ensemble.translate_nbest(one_lane))


def test_sentences_come_back_as_they_finish(translator, sources, monkeypatch):
  monkeypatch.setattr(engine, "MAX_SLOTS", 8)  # 8 slots per lane for 80 sentences.
  admitted, yielded = [], []
  admission = engine._admission

  def counted(requests, taken, free, lane):
    admitted.extend(taken)
    return admission(requests, taken, free, lane)

  monkeypatch.setattr(engine, "_admission", counted)
  for batch in translator.iter_nbest(sources, 1, engine="slots"):
    yielded.append((len(admitted), len(batch.indices)))
  assert sum(count for _, count in yielded) == len(sources)
  # Results came back while sentences still waited for a slot, a few at a time.
  assert sum(1 for seen, _ in yielded if seen < len(sources)) >= 5, yielded
  assert max(count for _, count in yielded) <= 8


def test_a_second_call_of_compiled_lanes_logs_no_compile(translator, one_lane, caplog):
  # Each call builds its own tables around the process's programs: a notebook's second call
  # printed "Compiled the engine's programs ..." again, with nothing compiled. Beams of 3: no
  # other test compiles them, so the first call here compiles.
  logged = []
  for _ in range(2):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flax_transformer"):
      aligned_nbest(translator, one_lane[:3], engine="slots", beam_size=3)
    logged.append([r.getMessage() for r in caplog.records if "Compiled" in r.getMessage()])
  assert any("the engine's programs" in line for line in logged[0]), logged
  assert any("the engine's alignments" in line for line in logged[0]), logged
  assert logged[1] == []


def test_outputs_longer_than_a_tier_move_up_and_keep_their_texts(translator, one_lane,
                                                                 monkeypatch):
  monkeypatch.setattr(engine, "FIRST_TIER", 2)  # Tiers of 2, 4, 8, ... positions.
  moved = []
  migrate = engine._LaneRun._migrate

  def counted(self, tier, rows):
    moved.append((tier, rows.size))
    return migrate(self, tier, rows)

  monkeypatch.setattr(engine._LaneRun, "_migrate", counted)
  for method in ("beam", "greedy"):  # Every tier's programs compile once per lane: one lane.
    assert_same_texts(translator.translate_nbest(one_lane, engine="slots", method=method),
                      translator.translate_nbest(one_lane, method=method))
  assert {tier for tier, _ in moved} >= {0, 1, 2}, moved


def test_terms_run_in_slots_the_same_bytes_whatever_else_is_in_flight(translator, sources,
                                                                      monkeypatch):
  """Each line's term is a word of another line's translation, at its start, middle or end;
  one line's is a word of its own translation (its plain answer settles it), one has none.
  Sources of one bucket, 8 slots per lane, tiers of one table: each lane's programs compile
  once, for 8 slots."""
  monkeypatch.setattr(engine, "FIRST_TIER", 64)
  settings = {"batch_tokens": 128}
  max_len = translator.model_config.max_len
  bucket = lambda s: batching.bucket_length(len(translator.tokenizer.tokenize(s)) + 1, max_len)
  sources = [s for s in sources if bucket(s) == 16][:12]
  plain = translator.translate_nbest(sources, engine="slots", **settings)
  owns = [row[0][0].split() for row in plain]
  terms = []
  for i, words in enumerate(owns[6:] + owns[:6]):  # Another line's first, middle or last word
    at = words[(0, len(words) // 2, -1)[i % 3]]  # (or another of its words) that its own lacks.
    terms.append([next(w for w in [at, *words] if w not in owns[i])])
  terms[1], terms[2] = [owns[1][-1]], []
  steps = list(translator.iter_nbest(sources, constraints=terms, engine="slots", **settings))
  assert sum(step.unmet for step in steps) == 0
  found = {int(i): row for step in steps for i, row in zip(step.indices, step.hypotheses,
                                                           strict=True)}
  in_file = [found[i] for i in range(len(sources))]
  assert_same_texts(in_file, translator.translate_nbest(sources, constraints=terms, **settings))
  for row, term in zip(in_file, terms, strict=True):
    assert not term or term[0] in row[0][0].split(), (row, term)  # A whole word.
  assert in_file[2] == plain[2] and in_file[1][0] == plain[1][0]  # Without terms; settled.
  order = np.random.default_rng(1).permutation(len(sources))
  shuffled = translator.translate_nbest([sources[i] for i in order], engine="slots",
                                        constraints=[terms[i] for i in order], **settings)
  assert [shuffled[list(order).index(i)] for i in range(len(sources))] == in_file
  for i in (0, 4):  # Alone, and among the others with other terms.
    assert translator.translate_nbest([sources[i]], engine="slots",
                                      constraints=[terms[i]], **settings) == [in_file[i]]
    others = [sources[j] for j in (5, i, 7, 8, i, 9)]
    other_terms = [terms[6], terms[i], [], terms[3], terms[i], terms[10]]
    assert translator.translate_nbest(others, engine="slots", constraints=other_terms,
                                      **settings)[1::3] == [in_file[i]] * 2

