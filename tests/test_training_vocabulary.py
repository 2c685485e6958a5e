"""training/vocabulary.py: the workdir's vocabulary is trained once, then reused; a given
vocab_path is used as is; a workdir with checkpoints but no vocabulary is refused."""

import numpy as np
import pytest

from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.training import vocabulary
from flax_transformer.workdir import VOCAB_FILE, save_params


def test_train_once_per_workdir_then_reuse(tmp_path, monkeypatch):
  data = parse_group(DataConfig, dict(source="synthetic", tfds_data_dir=str(tmp_path / "tfds"),
                                     synthetic_num_train=200, synthetic_num_eval=5,
                                     synthetic_num_test=5, vocab_size=200,
                                     vocab_max_chars=3000))
  first = vocabulary.prepare_vocabulary(data, str(tmp_path / "work"))
  model = tmp_path / "work" / VOCAB_FILE
  assert first.path == str(model) and model.is_file()
  assert not list((tmp_path / "work").glob("*.tmp"))  # Written atomically, no leftovers.

  def fail(*args, **kwargs):
    raise AssertionError("trained again")

  monkeypatch.setattr(vocabulary, "train_tokenizer", fail)
  again = vocabulary.prepare_vocabulary(data, str(tmp_path / "work"))
  sentence = pipeline.split_texts(data, "test")[0][1]
  assert again.tokenize(sentence) == first.tokenize(sentence)
  given = parse_group(DataConfig, {**vars(data), "vocab_path": str(model)})
  assert vocabulary.prepare_vocabulary(given, str(tmp_path / "other")).path == str(model)
  missing = parse_group(DataConfig, {**vars(data), "vocab_path": str(tmp_path / "none.model")})
  with pytest.raises(FileNotFoundError, match=r"config\.data\.vocab_path"):
    vocabulary.prepare_vocabulary(missing, str(tmp_path / "other"))


def test_a_workdir_with_checkpoints_but_no_vocabulary_is_refused_not_retrained(tmp_path,
                                                                              monkeypatch):
  """A vocabulary trained again (another SentencePiece version, other data) would give the
  checkpoint's ids to other pieces, and the run would go on silently on garbage."""
  data = parse_group(DataConfig, dict(source="synthetic", tfds_data_dir=str(tmp_path / "tfds"),
                                     synthetic_num_train=200, synthetic_num_eval=5,
                                     synthetic_num_test=5, vocab_size=200,
                                     vocab_max_chars=3000))
  work = tmp_path / "work"
  vocabulary.prepare_vocabulary(data, str(work))
  save_params(work, 8, {"w": np.zeros((2, 3), np.float32)})
  (work / VOCAB_FILE).rename(tmp_path / "kept.model")

  def fail(*args, **kwargs):
    raise AssertionError("trained again")

  monkeypatch.setattr(vocabulary, "train_tokenizer", fail)
  with pytest.raises(FileNotFoundError,
                     match=rf"{work} holds checkpoints \(steps \[8\]\) but not {VOCAB_FILE}, "
                           r"the vocabulary they were trained with: put it back .* "
                           r"config\.data\.vocab_path"):
    vocabulary.prepare_vocabulary(data, str(work))
  given = parse_group(DataConfig, {**vars(data), "vocab_path": str(tmp_path / "kept.model")})
  assert vocabulary.prepare_vocabulary(given, str(work)).path == str(tmp_path / "kept.model")
  assert (work / VOCAB_FILE).read_bytes() == (tmp_path / "kept.model").read_bytes()
