"""BPE-dropout (config.data.bpe_dropout): `flax_transformer.data.bpe_dropout` against
SentencePiece itself (its deterministic BPE on all of Multi30k's train text, its own sampling's
distribution), seeded in any process; and the train pipeline that uses it (new segmentations
each epoch, exact resume, worker processes, bad configs)."""

import collections
import functools
import gzip
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from flax_transformer import config as config_lib
from flax_transformer import experiment_flags
from flax_transformer.config import ConfigError, DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.data.bpe_dropout import BpeDropout
from flax_transformer.data.tokenizer import EOS_ID, Tokenizer, train_tokenizer
from flax_transformer.training import vocabulary

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MULTI30K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "multi30k"
# Characters the Multi30k vocabulary has never seen (byte fallback), whitespace runs, control
# pieces' spellings, an empty line.
_ODD = ["  Ein  Mann – ½ im 日本 Hut.  ", "", " ", "<pad> <unk> </s>", "a\tb\u00a0c", "Ünïcödé 🙂!"]


@pytest.fixture(scope="module")
def multi30k():
  if not MULTI30K.is_dir():
    pytest.skip(f"Multi30k not found at {MULTI30K}")
  texts = []
  for lang in ("en", "de"):
    with gzip.open(MULTI30K / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
      texts += f.read().splitlines()
  # 4,000 pieces: byte fallback on (>= 2,048), so the odd lines spell with byte pieces.
  return texts, train_tokenizer(texts, vocab_size=4000, model_type="bpe")


def test_without_dropout_it_is_sentencepieces_own_bpe_on_every_train_line(multi30k):
  texts, tokenizer = multi30k
  sp = spm.SentencePieceProcessor(model_proto=tokenizer.proto)
  texts = texts + _ODD
  assert BpeDropout(tokenizer.proto).tokenize_batch(texts, dropout=0.0, seed=0) == \
      sp.encode(texts, out_type=int)


def test_the_sentencepiece_rule_follows_sentencepieces_own_sampler(multi30k):
  """SentencePiece samples by this rule (each merge skipped with probability p, never retried)
  from an unseeded generator: the two must agree in distribution, checked on whole sentences'
  lengths and on the segmentations of single words."""
  texts, tokenizer = multi30k
  sp = spm.SentencePieceProcessor(model_proto=tokenizer.proto)
  ours = BpeDropout(tokenizer.proto)
  sample = texts[:20000]
  a = np.array(list(map(len, ours.tokenize_batch(sample, dropout=0.1, seed=1,
                                                 rule="sentencepiece"))))
  b = np.array(list(map(len, sp.encode(sample, out_type=int, enable_sampling=True, alpha=0.1))))
  plain = np.array(list(map(len, sp.encode(sample, out_type=int))))
  assert a.mean() > plain.mean() + 1  # Dropout splits pieces: far more than the noise below.
  assert abs(a.mean() - b.mean()) < 5 * np.sqrt(a.var() / len(a) + b.var() / len(b))
  for word in ("something", "Mann", "skateboarding"):
    n = 10000
    ours_counts = collections.Counter(map(tuple, ours.tokenize_batch(
        [word] * n, dropout=0.3, seed=2, rule="sentencepiece")))
    theirs = collections.Counter(map(tuple, sp.encode([word] * n, out_type=int,
                                                      enable_sampling=True, alpha=0.3)))
    # Each segmentation common enough to count: the two counts differ by less than 5 standard
    # deviations of a difference of two Poisson counts.
    common = [k for k in ours_counts | theirs if ours_counts[k] + theirs[k] >= 200]
    assert len(common) >= 4, (word, len(common))  # Several, or the comparison says little.
    for k in common:
      a_k, b_k = ours_counts[k], theirs[k]
      assert abs(a_k - b_k) < 5 * np.sqrt(a_k + b_k), (word, k, a_k, b_k)


def _algorithm_1(word: str, scores: dict[str, float], p: float) -> dict[tuple[str, ...], float]:
  """Provilkov et al.'s Algorithm 1, exactly, by enumeration: the probability of each
  segmentation of `word`. Each step drops every possible merge independently with probability
  p and applies the highest-scoring survivor (the leftmost on a tie); the word is done when
  every possible merge is dropped. Merge k in that order survives first with (1 - p) p^k."""

  @functools.cache
  def outcomes(state: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    merges = sorted((-scores[a + b], i) for i, (a, b) in enumerate(itertools.pairwise(state))
                    if a + b in scores)
    out = collections.Counter({state: p ** len(merges)})
    for k, (_, i) in enumerate(merges):
      merged = state[:i] + (state[i] + state[i + 1],) + state[i + 2:]
      for segmentation, q in outcomes(merged).items():
        out[segmentation] += (1 - p) * p**k * q
    return out

  return dict(outcomes(tuple(word)))


def _departures(counts: collections.Counter, exact: dict, n: int) -> list:
  """The segmentations whose count departs from n * probability by 5 binomial standard
  deviations or more, the rare ones (expected < 20) pooled into one."""
  bad, rare_count, rare_mass = [], 0, 0.0
  for segmentation in set(counts) | set(exact):
    q = exact.get(segmentation, 0.0)
    if n * q < 20:
      rare_count, rare_mass = rare_count + counts[segmentation], rare_mass + q
    elif abs(counts[segmentation] - n * q) >= 5 * np.sqrt(n * q * (1 - q)):
      bad.append((segmentation, counts[segmentation], round(n * q, 1)))
  if abs(rare_count - n * rare_mass) >= 5 * np.sqrt(n * rare_mass * (1 - rare_mass)) + 1:
    bad.append(("rare", rare_count, round(n * rare_mass, 1)))
  return bad


def test_the_paper_rule_follows_algorithm_1_exactly_enumerated(multi30k):
  """The default rule against Provilkov et al.'s Algorithm 1 enumerated in full for single
  words: every segmentation's frequency over 20,000 samples within 5 standard deviations of
  its exact probability. SentencePiece's rule, a different distribution, must fail the check."""
  _, tokenizer = multi30k
  model = sentencepiece_model_pb2.ModelProto()
  model.ParseFromString(tokenizer.proto)
  scores = {piece.piece: piece.score for piece in model.pieces
            if piece.type == sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL}
  sp = spm.SentencePieceProcessor(model_proto=tokenizer.proto)
  ours = BpeDropout(tokenizer.proto)
  n, caught = 20000, 0
  for word, p in [("Mann", 0.1), ("something", 0.1), ("skateboarding", 0.1),
                  ("something", 0.3), ("Fahrradfahrer", 0.3)]:
    exact = _algorithm_1("\u2581" + word, scores, p)
    assert abs(sum(exact.values()) - 1) < 1e-12
    assert len(exact) >= 4  # Several outcomes, or the comparison says little.
    for rule in ("paper", "sentencepiece"):
      counts = collections.Counter(
          tuple(sp.id_to_piece(ids)) for ids in ours.tokenize_batch([word] * n, dropout=p,
                                                                     seed=7, rule=rule))
      bad = _departures(counts, exact, n)
      if rule == "paper":
        assert not bad, (word, p, bad)
      else:
        caught += bool(bad)
  assert caught == 5  # The check tells the two rules apart on every word.


def test_every_sample_spells_the_text_and_more_dropout_splits_more(multi30k):
  texts, tokenizer = multi30k
  texts = texts[:2000] + _ODD
  plain = tokenizer.tokenize_batch(texts)
  lengths = {}
  for p in (0.1, 0.3, 0.6):
    sampled = tokenizer.tokenize_batch_dropout(texts, dropout=p, seed=11)
    for ids, reference in zip(sampled, plain, strict=True):
      assert tokenizer.detokenize(ids) == tokenizer.detokenize(reference)
    lengths[p] = sum(map(len, sampled))
  assert sum(map(len, plain)) < lengths[0.1] < lengths[0.3] < lengths[0.6]


_IN_A_FRESH_PROCESS = """
import json, sys
from flax_transformer.data.bpe_dropout import BpeDropout
proto = open(sys.argv[1], "rb").read()
print(json.dumps(BpeDropout(proto).tokenize_batch(json.loads(sys.stdin.read()), dropout=0.2,
                                                  seed=5)))
"""


def test_the_seed_alone_decides_in_any_process(multi30k, tmp_path):
  texts, tokenizer = multi30k
  texts = texts[:300]
  first = tokenizer.tokenize_batch_dropout(texts, dropout=0.2, seed=5)
  assert tokenizer.tokenize_batch_dropout(texts, dropout=0.2, seed=5) == first
  other = tokenizer.tokenize_batch_dropout(texts, dropout=0.2, seed=6)
  assert sum(a != b for a, b in zip(first, other, strict=True)) > len(texts) // 3
  # Text k's draws depend on k, not on the texts before it.
  assert tokenizer.tokenize_batch_dropout(texts[:10], dropout=0.2, seed=5) == first[:10]
  model = tmp_path / "bpe.model"
  model.write_bytes(tokenizer.proto)
  out = subprocess.run([sys.executable, "-c", _IN_A_FRESH_PROCESS, str(model)],
                       input=json.dumps(texts), text=True, capture_output=True, check=True)
  assert json.loads(out.stdout) == first


def test_bad_probabilities_seeds_and_models_are_one_clear_error():
  texts = [" ".join(["a man in an orange hat walks past the bakery"] * 3)] * 200
  bpe = train_tokenizer(texts, vocab_size=60, model_type="bpe")
  with pytest.raises(ValueError, match=r"probability 1\.0 is not in \[0, 1\)"):
    bpe.tokenize_batch_dropout(["a man"], dropout=1.0, seed=0)
  with pytest.raises(ValueError, match=r"seed -1 is not in \[0, 2\*\*32\)"):
    bpe.tokenize_batch_dropout(["a man"], dropout=0.1, seed=-1)
  with pytest.raises(ValueError, match=r"rule 'hf' is not one of 'paper', 'sentencepiece'"):
    bpe.tokenize_batch_dropout(["a man"], dropout=0.1, seed=0, rule="hf")  # type: ignore[arg-type]
  unigram = train_tokenizer(texts, vocab_size=60, model_type="unigram")
  assert (bpe.model_type, unigram.model_type) == ("bpe", "unigram")
  with pytest.raises(ValueError, match=r"needs a SentencePiece BPE model; this one is unigram"):
    unigram.tokenize_batch_dropout(["a man"], dropout=0.1, seed=0)


# --- the train pipeline -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  data = parse_group(DataConfig, dict(
      source="synthetic", tfds_data_dir=str(root / "tfds"), synthetic_num_train=300,
      synthetic_num_eval=20, synthetic_num_test=20, vocab_size=300, vocab_model_type="bpe",
      max_length=64, batch_tokens=64 * 4, seed=3, bpe_dropout=0.2))
  tokenizer = vocabulary.prepare_vocabulary(data, str(root / "work"))
  return data, tokenizer


def _examples(batch):
  """The (source ids, target ids) of each example of a packed batch, from its segment ids."""
  out = []
  for row in range(batch["inputs"].shape[0]):
    for segment in range(1, batch["inputs_segment_ids"][row].max() + 1):
      out.append(tuple(tuple(batch[key][row][batch[f"{key}_segment_ids"][row] == segment])
                       for key in ("inputs", "targets")))
  return out


def _texts(tokenizer, examples):
  return [(tokenizer.detokenize(s), tokenizer.detokenize(t)) for s, t in examples]


def test_each_epoch_segments_the_same_pairs_anew(setup):
  data, tokenizer = setup
  pairs = pipeline.split_texts(data, data.train_split)
  plain = {(tuple(tokenizer.tokenize(s) + [EOS_ID]), tuple(tokenizer.tokenize(t) + [EOS_ID]))
           for s, t in pairs}
  texts = set(_texts(tokenizer, plain))
  it = pipeline.train_iterator(data, tokenizer)
  seen = []
  while len(seen) < 3 * len(pairs):  # About three epochs (no pair is length-filtered).
    seen += _examples(next(it))
  # Every example spells a pair of the split; each pair comes round once an epoch.
  by_text = collections.defaultdict(list)
  for example, text in zip(seen, _texts(tokenizer, seen), strict=True):
    by_text[text].append(example)
  assert set(by_text) == texts
  assert all(2 <= len(v) <= 4 for v in by_text.values())
  # But not as the same ids: many examples are not BPE's own segmentation, and most pairs are
  # segmented differently from one epoch to the next.
  assert sum(example not in plain for example in seen) > len(seen) // 3
  assert sum(len(set(v)) > 1 for v in by_text.values()) > len(by_text) // 2
  # With dropout off, the same stream is BPE's own segmentation throughout.
  off = parse_group(DataConfig, {**vars(data), "bpe_dropout": 0.0})
  assert set(_examples(next(pipeline.train_iterator(off, tokenizer)))) <= plain


def test_a_restored_iterator_sees_the_uninterrupted_segmentations(setup):
  data, tokenizer = setup
  n = 40
  straight = [next(it) for it in [pipeline.train_iterator(data, tokenizer)] for _ in range(n)]
  first = pipeline.train_iterator(data, tokenizer)
  head = [next(first) for _ in range(n // 2)]
  state = json.loads(json.dumps(first.get_state()))
  resumed = pipeline.train_iterator(data, tokenizer)
  resumed.set_state(state)
  for a, b in zip(straight, head + [next(resumed) for _ in range(n - n // 2)], strict=True):
    for key in pipeline.TRAIN_KEYS:
      np.testing.assert_array_equal(a[key], b[key])
  assert sum(len(_examples(b)) for b in straight) > 300  # The run crosses an epoch boundary.


def test_hosts_draw_their_own_segmentations(setup):
  """Each process (host) reads its own shard with the same chunk numbers: the draws must still
  differ, or the same text at the same place in two shards would be split alike."""
  data, tokenizer = setup
  examples = [{data.source_lang: s, data.target_lang: t}
              for s, t in pipeline.split_texts(data, data.train_split)[:200]]
  per_process = [pipeline._TokenizeAndFilter(tokenizer, data, 300, process_index=p)(7, examples)
                 for p in (0, 1, 0)]
  assert [e["inputs"].tolist() for e in per_process[0]] == \
      [e["inputs"].tolist() for e in per_process[2]]
  differ = sum(a["inputs"].tolist() != b["inputs"].tolist()
               for a, b in zip(per_process[0], per_process[1], strict=True))
  assert differ > len(examples) // 3


def test_the_configured_rule_decides_how_much_is_split(setup):
  """config.data.bpe_dropout_rule reaches the segmentation: SentencePiece's rule, which never
  retries a skipped merge, splits the same pairs into more pieces at the same probability."""
  data, tokenizer = setup
  examples = [{data.source_lang: s, data.target_lang: t}
              for s, t in pipeline.split_texts(data, data.train_split)[:200]]
  pieces = {}
  for rule in ("paper", "sentencepiece"):
    ruled = parse_group(DataConfig, {**vars(data), "bpe_dropout_rule": rule})
    out = pipeline._TokenizeAndFilter(tokenizer, ruled, 300)(7, examples)
    pieces[rule] = sum(len(e["inputs"]) + len(e["targets"]) for e in out)
  plain = sum(len(tokenizer.tokenize(s)) + len(tokenizer.tokenize(t)) + 2
              for s, t in pipeline.split_texts(data, data.train_split)[:200])
  assert plain < pieces["paper"] < pieces["sentencepiece"], (plain, pieces)


@pytest.mark.slow  # Spawns processes.
def test_worker_processes_give_the_same_segmentations(setup):
  """grain workers tokenize in other processes: their segmentations are the in-process ones."""
  data, tokenizer = setup
  by_workers = pipeline.train_iterator(parse_group(DataConfig, {**vars(data), "num_workers": 1}),
                                       tokenizer)
  in_process = pipeline.train_iterator(data, tokenizer)
  got, expected = ([next(it) for _ in range(6)] for it in (by_workers, in_process))
  by_workers.close()
  for key in pipeline.TRAIN_KEYS:
    np.testing.assert_array_equal(np.stack([b[key] for b in got]),
                                  np.stack([b[key] for b in expected]), err_msg=key)


@pytest.mark.parametrize("data, train, match", [
    (dict(bpe_dropout=0.1), {}, r"config\.data\.bpe_dropout=0\.1 needs a BPE vocabulary: set "
     r"config\.data\.vocab_model_type='bpe' \(here 'unigram'\) or config\.data\.bpe_dropout=0\."),
    (dict(bpe_dropout=1.0, vocab_model_type="bpe"), {},
     r"config\.data\.bpe_dropout must be in \[0, 1\), got 1\.0\."),
    (dict(bpe_dropout=-0.1, vocab_model_type="bpe"), {}, r"config\.data\.bpe_dropout must be in"),
    (dict(bpe_dropout=0.1, vocab_model_type="bpe", bpe_dropout_rule="hf"), {},
     r"config\.data\.bpe_dropout_rule must be one of \('paper', 'sentencepiece'\), got 'hf'\."),
])
def test_bad_configs_name_the_key(data, train, match):
  config = experiment_flags.load_config_file(CONFIGS / "default.py", None)
  config.data.update(data)
  config.train.update(train)
  with pytest.raises(ConfigError, match=match):
    config_lib.load(config, num_devices=1, num_processes=1)


def test_a_vocabulary_not_trained_here_is_checked_where_it_is_loaded():
  """A given (data.vocab_path) or fine-tuned (train.init_from) vocabulary decides, not
  data.vocab_model_type: the config passes, the pipeline checks the loaded model (below)."""
  for data, train in [(dict(vocab_path="/models/bpe.model"), {}),
                      ({}, dict(init_from="/runs/mini_s1"))]:
    config = experiment_flags.load_config_file(CONFIGS / "default.py", None)
    config.data.update(dict(bpe_dropout=0.1, **data))
    config.train.update(train)
    assert config_lib.load(config, num_devices=1, num_processes=1).data.bpe_dropout == 0.1


def test_a_given_unigram_vocabulary_is_refused_before_anything_is_read(setup, tmp_path):
  data, _ = setup
  texts = [" ".join(["a man in an orange hat walks past the bakery"] * 3)] * 200
  unigram = train_tokenizer(texts, vocab_size=60, model_type="unigram")
  path = tmp_path / "unigram.model"
  path.write_bytes(unigram.proto)
  given = parse_group(DataConfig, {**vars(data), "vocab_path": str(path),
                                   "vocab_model_type": "unigram"})
  with pytest.raises(ConfigError, match=rf"config\.data\.bpe_dropout=0\.2 needs a SentencePiece "
                     rf"BPE vocabulary, but {path} is a SentencePiece unigram model \(a "
                     r"vocabulary given by config\.data\.vocab_path or kept from "
                     r"config\.train\.init_from is used as it is\): set config\.data\.bpe_dropout"
                     r"=0, or train a new one with config\.data\.vocab_model_type='bpe' and "
                     r"neither\.$"):
    pipeline.train_iterator(given, Tokenizer.load(path))
