"""Tests of the SentencePiece tokenizer: special ids, EOS/PAD handling, exact round trips on
Multi30k, and training once per workdir."""

import gzip
import pickle
import unicodedata
from pathlib import Path

import pytest

from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.data import tokenizer as tok

MULTI30K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "multi30k"
SENTENCES = ["A man rides a bike.", "Two dogs play in the snow!", "Ein Mann fährt Fahrrad.",
             "Zwei Hunde spielen im Schnee.", "A girl in a pink dress climbs stairs."] * 20


@pytest.fixture(scope="module")
def small():
  return tok.train_tokenizer(SENTENCES, vocab_size=60, model_type="bpe")


def test_special_ids_and_no_bos(small):
  assert (tok.PAD_ID, tok.EOS_ID, tok.UNK_ID) == (0, 1, 2)
  assert [small.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  ids = small.tokenize("A man rides a bike.")
  assert ids and tok.EOS_ID not in ids and tok.PAD_ID not in ids
  assert small.vocab_size <= 60 and small.path == ""  # Not written anywhere.


def test_detokenize_stops_at_eos_and_skips_padding(small):
  ids = small.tokenize("Two dogs play")
  other = small.tokenize("in the snow!")
  assert small.detokenize([*ids, tok.EOS_ID, *other, tok.PAD_ID]) == "Two dogs play"
  assert small.detokenize([tok.PAD_ID, *ids, tok.PAD_ID]) == "Two dogs play"


def test_pickle_round_trip(small):
  clone = pickle.loads(pickle.dumps(small))
  assert clone.tokenize("Ein Mann fährt") == small.tokenize("Ein Mann fährt")
  assert clone.path == small.path


def test_foreign_special_ids_rejected(tmp_path):
  import io

  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_writer=model,
                                 vocab_size=40, minloglevel=2)  # Defaults: unk 0, bos 1, eos 2.
  with pytest.raises(ValueError, match=r"needs \(0, 1, 2, -1\)"):
    tok.Tokenizer(model.getvalue())


def _lines(name):
  with gzip.open(MULTI30K / f"{name}.gz", "rt", encoding="utf-8") as f:
    return f.read().splitlines()


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found at {MULTI30K}")
def test_multi30k_round_trip_exact(tmp_path):
  train = _lines("train.en")[:4000] + _lines("train.de")[:4000]
  tokenizer = tok.train_tokenizer(train, vocab_size=4000, model_type="unigram")
  held_out = [s for name in ("val.en", "val.de", "test_2016_flickr.en", "test_2016_flickr.de")
              for s in _lines(name)]
  # Byte fallback (vocab >= 2048) spells digits unseen in this small sample.
  assert tokenizer.vocab_size > tok.BYTE_FALLBACK_MIN_VOCAB
  # "Ordinary" = already NFKC-normal with single spaces: what normalization leaves untouched.
  ordinary = [s for s in held_out
              if unicodedata.normalize("NFKC", s) == s and " ".join(s.split()) == s]
  assert len(ordinary) > 0.99 * len(held_out)
  assert any(ch in "".join(ordinary) for ch in "äöüßé")  # Accents are exercised.
  failures = [s for s in ordinary if tokenizer.detokenize(tokenizer.tokenize(s)) != s]
  assert failures == []


def test_training_sample_respects_max_chars(tmp_path):
  data = parse_group(DataConfig, dict(source="synthetic", tfds_data_dir=str(tmp_path),
                                     synthetic_num_train=300, synthetic_num_eval=5,
                                     synthetic_num_test=5, vocab_max_chars=2000))
  sample = pipeline.tokenizer_sample(data)
  pairs = pipeline.split_texts(data, "train")
  sources, targets = {s for s, _ in pairs}, {t for _, t in pairs}
  assert 1900 < sum(map(len, sample)) <= 2000
  assert any(s in sources for s in sample) and any(s in targets for s in sample)
