"""Tests of the synthetic language pair: determinism, disjoint splits, sentence lengths, the
grammar it promises, and that copying or word-by-word translation scores low."""

import collections
import random

import pytest
import sacrebleu

from flax_transformer.data import synthetic


@pytest.fixture(scope="module")
def splits():
  return synthetic.generate_splits(0, {"test": 300, "eval": 200, "train": 6000})


def test_deterministic_disjoint_and_short(splits):
  again = synthetic.generate_splits(0, {"test": 300, "eval": 200, "train": 6000})
  assert again == splits
  other = synthetic.generate_splits(1, {"test": 300})
  assert other["test"] != splits["test"]
  sources = [{s for s, _ in pairs} for pairs in splits.values()]
  assert [len(s) for s in sources] == [300, 200, 6000]  # Distinct within each split ...
  assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
  lengths = [len(s.split()) for pairs in splits.values() for s, _ in pairs]
  assert min(lengths) == synthetic.MIN_WORDS and max(lengths) == synthetic.MAX_WORDS
  # Held-out splits do not depend on the size of the train split.
  assert synthetic.generate_splits(0, {"test": 300, "eval": 200, "train": 10})["eval"] == \
      splits["eval"]


def test_verb_final_with_number_agreement(splits):
  verbs = {synthetic.LEXICON.verb_stem[v] for v in synthetic.LEXICON.verb_stem}
  for source, target in splits["train"][:2000]:
    last = target.split()[-1]
    stem, ending = (last[:-3], "ent") if last.endswith("ent") else (last[:-2], "et")
    assert stem in verbs, (source, target)
    assert (ending == "ent") == _subject_plural(source), (source, target)


def _subject_plural(source):
  """Independent reading of the English: is the first noun (the subject's) plural?"""
  words = source.split()
  plural_nouns = {pl for pairs in synthetic._NOUNS.values() for _, pl in pairs}
  for word in words:
    if word in plural_nouns:
      return True
    if word in synthetic.LEXICON.noun_stem:
      return False
  raise AssertionError(source)


def test_gender_agreement_is_a_property_of_the_noun(splits):
  """Definite nominative singular articles depend on the noun: each noun always takes one."""
  articles = collections.defaultdict(set)
  for _, target in splits["train"]:
    words = target.split()
    if words[0] in ("lo", "la", "le"):
      articles[words[1]].add(words[0])
  assert len(articles) > 30
  assert all(len(a) == 1 for a in articles.values())
  assert {a for s in articles.values() for a in s} == {"lo", "la", "le"}


def _word_by_word_model(train):
  """Dice-coefficient dictionary learned from the training pairs (source word -> target word)."""
  src_count, tgt_count, joint = collections.Counter(), collections.Counter(), collections.Counter()
  for source, target in train:
    s_words, t_words = set(source.split()), set(target.split())
    src_count.update(s_words)
    tgt_count.update(t_words)
    joint.update((s, t) for s in s_words for t in t_words)
  best = {}
  for (s, t), c in joint.items():
    dice = 2 * c / (src_count[s] + tgt_count[t])
    if dice > best.get(s, (0, ""))[0]:
      best[s] = (dice, t)
  return {s: t for s, (_, t) in best.items()}


def test_copy_and_word_by_word_baselines_score_low(splits):
  test = splits["test"]
  refs = [[t for _, t in test]]
  copy = sacrebleu.corpus_bleu([s for s, _ in test], refs).score
  dictionary = _word_by_word_model(splits["train"])
  word_by_word = [" ".join(dictionary[w] for w in s.split() if w in dictionary) for s, _ in test]
  wbw = sacrebleu.corpus_bleu(word_by_word, refs).score
  # The dictionary itself is good: most target words are found, only order/agreement are wrong.
  unigram_precision = sacrebleu.corpus_bleu(word_by_word, refs).precisions[0]
  assert copy < 5
  assert wbw < 30, wbw
  assert unigram_precision > 40, unigram_precision


def test_sample_pair_is_a_pure_function_of_the_rng():
  a = [synthetic.sample_pair(random.Random(7)) for _ in range(3)]
  assert a[0] == a[1] == a[2]
