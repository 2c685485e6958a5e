"""The Marian vocabulary (source.spm, target.spm, vocab.json) in this package's ids, and the
workdir and pipeline plumbing around the two tokenizer kinds. No Hugging Face code is needed
here; tests/test_interop_marian.py compares with Hugging Face's MarianTokenizer itself.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import sentencepiece as spm

from flax_transformer import workdir as workdir_lib
from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.data.marian_tokenizer import MarianTokenizer, marian_order
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer

import marian_fixture


@pytest.fixture(scope="module")
def models():
  pairs = marian_fixture.synthetic_pairs()
  source = marian_fixture.train_sentencepiece([s for s, _ in pairs], 120)
  target = marian_fixture.train_sentencepiece([t for _, t in pairs], 120)
  return source, target, marian_fixture.joint_vocab(source, target)


@pytest.fixture(scope="module")
def tokenizer(models):
  return MarianTokenizer(*models)


def _ids_by_hand(model: bytes, vocab: dict[str, int], order: np.ndarray, text: str) -> list[int]:
  """text -> pieces of `model` -> Marian ids (unknown: <unk>) -> our ids, computed here."""
  ours_of_marian = {int(marian): ours for ours, marian in enumerate(order)}
  pieces = spm.SentencePieceProcessor(model_proto=model).encode(text, out_type=str)
  return [ours_of_marian[vocab.get(piece, vocab["<unk>"])] for piece in pieces]


def test_special_pieces_take_our_special_ids_and_the_rest_keeps_marian_order(tokenizer, models):
  vocab = models[2]
  assert (vocab["</s>"], vocab["<unk>"], vocab["<pad>"]) == (0, 1, len(vocab) - 1)
  assert [tokenizer.id_to_piece(i) for i in (PAD_ID, EOS_ID, UNK_ID)] == ["<pad>", "</s>",
                                                                         "<unk>"]
  assert tokenizer.vocab_size == len(vocab)
  rest = tokenizer.marian_ids[3:]
  np.testing.assert_array_equal(rest, np.arange(2, len(vocab) - 1))  # In order, without gaps.
  np.testing.assert_array_equal(tokenizer.our_ids[tokenizer.marian_ids], np.arange(len(vocab)))
  for i in range(len(vocab)):
    assert vocab[tokenizer.id_to_piece(i)] == tokenizer.marian_ids[i]


def test_sources_go_through_source_spm_and_targets_through_target_spm(tokenizer, models):
  source, target, vocab = models
  en, de = marian_fixture.synthetic_pairs(1, seed=11)[0]
  for text in (en, de):
    assert tokenizer.tokenize(text) == _ids_by_hand(source, vocab, tokenizer.marian_ids, text)
    assert tokenizer.tokenize_target(text) == _ids_by_hand(target, vocab, tokenizer.marian_ids,
                                                           text)
  # The two models segment the same text differently, so the sides really are told apart.
  assert tokenizer.tokenize(de) != tokenizer.tokenize_target(de)
  assert tokenizer.tokenize_batch([en, de]) == [tokenizer.tokenize(en), tokenizer.tokenize(de)]
  assert tokenizer.tokenize_target_batch([de, ""]) == [tokenizer.tokenize_target(de), []]


def test_pieces_missing_from_vocab_json_become_unk(tokenizer):
  ids = tokenizer.tokenize("the dog ß")  # 'ß' is outside both models' training text.
  assert UNK_ID in ids and ids.count(UNK_ID) < len(ids)


def test_a_language_code_is_one_token(models):
  source, target, vocab = models
  vocab = {**vocab, ">>deu<<": len(vocab)}  # As multilingual models' vocab.json has.
  tokenizer = MarianTokenizer(source, target, vocab)
  code = tokenizer.tokenize(">>deu<<")[0]
  assert tokenizer.id_to_piece(code) == ">>deu<<"
  assert tokenizer.tokenize(">>deu<< the dog") == [code, *tokenizer.tokenize(" the dog")]
  assert tokenizer.tokenize(">>fra<< the dog")[0] == UNK_ID  # Not in vocab.json.


def test_detokenize_stops_at_eos_skips_padding_and_unk(tokenizer):
  _, de = marian_fixture.synthetic_pairs(1, seed=12)[0]
  ids = tokenizer.tokenize_target(de)
  assert tokenizer.detokenize(ids) == de
  assert tokenizer.detokenize([*ids[:2], UNK_ID, *ids[2:], EOS_ID, 7, PAD_ID]) == de
  # A piece that only the source model knows is still spelled out, its "▁" a space.
  only_source = next(i for i in range(3, tokenizer.vocab_size)
                     if tokenizer.id_to_piece(i).startswith("\u2581")
                     and spm.SentencePieceProcessor(model_proto=tokenizer.target_model)
                     .piece_to_id(tokenizer.id_to_piece(i)) == 0)
  word = tokenizer.id_to_piece(only_source)[1:]
  assert tokenizer.detokenize([*ids, only_source]) == f"{de} {word}"


def test_pickles_for_grain_workers(tokenizer):
  copy = pickle.loads(pickle.dumps(tokenizer))
  assert copy.tokenize("the dog") == tokenizer.tokenize("the dog")
  assert copy.tokenize_target("lo pofen") == tokenizer.tokenize_target("lo pofen")


@pytest.mark.parametrize("vocab, message", [
    ({"</s>": 0, "<unk>": 1, "a": 3, "<pad>": 4}, "the ids must be 0..3, each once"),
    ({"</s>": 0, "<unk>": 1, "a": 1, "<pad>": 2}, "the ids must be 0..3, each once"),
    ({"</s>": 0, "<unk>": 1, "a": 2}, "has no <pad> piece"),
])
def test_a_malformed_vocab_json_is_named(vocab, message):
  with pytest.raises(ValueError, match=message):
    marian_order(vocab)


def test_workdirs_load_the_tokenizer_of_the_files_they_hold(tokenizer, tmp_path):
  marian, shared, empty = tmp_path / "marian", tmp_path / "shared", tmp_path / "empty"
  for folder in (marian, shared, empty):
    folder.mkdir()
  tokenizer.write(marian)
  loaded = workdir_lib.load_tokenizer(marian)
  assert isinstance(loaded, MarianTokenizer) and loaded.tokenize("a dog") == tokenizer.tokenize(
      "a dog")
  shared_tokenizer = train_tokenizer([s for pair in marian_fixture.synthetic_pairs(100)
                                      for s in pair], vocab_size=100, model_type="unigram")
  (shared / "vocab.model").write_bytes(shared_tokenizer.proto)
  assert isinstance(workdir_lib.load_tokenizer(shared), Tokenizer)
  with pytest.raises(FileNotFoundError, match=r"No vocabulary in .*expected vocab\.model, or "
                     r"source\.spm, target\.spm, vocab\.json"):
    workdir_lib.load_tokenizer(empty)
  (marian / "vocab.model").write_bytes(shared_tokenizer.proto)
  with pytest.raises(ValueError, match=r"holds both vocab\.model and Marian vocabulary files"):
    workdir_lib.load_tokenizer(marian)
  (marian / "vocab.model").unlink()
  (marian / "target.spm").unlink()
  with pytest.raises(ValueError, match=r"incomplete Marian vocabulary: target\.spm missing"):
    workdir_lib.load_tokenizer(marian)


def test_shared_tokenizer_tokenizes_targets_like_sources():
  shared = train_tokenizer([s for pair in marian_fixture.synthetic_pairs(100) for s in pair],
                           vocab_size=100, model_type="unigram")
  texts = list(marian_fixture.synthetic_pairs(1, seed=3)[0])
  assert shared.tokenize_target_batch(texts) == shared.tokenize_batch(texts)
  assert shared.tokenize_target(texts[1]) == shared.tokenize(texts[1])


def test_train_pipeline_tokenizes_targets_with_the_target_side(tokenizer):
  data = parse_group(DataConfig, dict(max_length=64))
  pairs = marian_fixture.synthetic_pairs(5, seed=4)
  tokenize = pipeline._TokenizeAndFilter(tokenizer, data, epoch_size=1000)
  examples = tokenize(0, [{"en": en.encode(), "de": de.encode()} for en, de in pairs])
  assert len(examples) == len(pairs)
  for (en, de), example in zip(pairs, examples, strict=True):
    assert example["inputs"].tolist() == [*tokenizer.tokenize(en), EOS_ID]
    assert example["targets"].tolist() == [*tokenizer.tokenize_target(de), EOS_ID]
