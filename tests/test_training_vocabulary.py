"""training/vocabulary.py: the workdir's vocabulary is trained once, then reused; a given
vocab_path is used as is."""

import pytest

from flax_transformer.config import DataConfig, parse_group
from flax_transformer.data import pipeline
from flax_transformer.training import vocabulary
from flax_transformer.workdir import VOCAB_FILE


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
