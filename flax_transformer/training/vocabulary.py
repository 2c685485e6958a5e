"""The run's vocabulary: the one given by config.data.vocab_path, the workdir's own (a restart,
or a vocabulary given by config.train.init_from), or a shared SentencePiece model trained on the
training text and written atomically to WORKDIR/vocab.model. It lives in training, not in data/,
because it reads and writes the workdir."""

from __future__ import annotations

import logging

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import DataConfig
from flax_transformer.data import builders, pipeline
from flax_transformer.data.tokenizer import TextTokenizer, Tokenizer, train_tokenizer
from flax_transformer.files import to_path


def train_or_load_tokenizer(data: DataConfig, workdir: str) -> TextTokenizer:
  """The vocabulary.

  `data.vocab_path` if set; else the workdir's own if it has one (a restart, or a workdir given
  its vocabulary by `config.train.init_from`: `WORKDIR/vocab.model`, or a Marian model's
  source.spm, target.spm and vocab.json); else a shared SentencePiece model trained on up to
  `data.vocab_max_chars` characters of training text (source and target sentences of pairs drawn
  in a seeded random order) and written atomically to `WORKDIR/vocab.model`.
  """
  if data.vocab_path:
    if not to_path(data.vocab_path).is_file():
      raise builders.MissingDataError(f"config.data.vocab_path: no SentencePiece model at "
                              f"{data.vocab_path}; set it to '' to train one into the workdir.")
    return Tokenizer.load(data.vocab_path)
  if workdir_lib.vocabulary_files(workdir):
    logging.info("Reusing the vocabulary of %s.", workdir)
    return workdir_lib.load_tokenizer(workdir)
  path = to_path(workdir) / workdir_lib.VOCAB_FILE
  sentences = pipeline.tokenizer_sample(data)
  logging.info("Training a %s SentencePiece vocabulary of %d pieces on %d sentences (%d chars).",
               data.vocab_model_type, data.vocab_size, len(sentences), sum(map(len, sentences)))
  tokenizer = train_tokenizer(sentences, vocab_size=data.vocab_size,
                              model_type=data.vocab_model_type)
  path.parent.mkdir(parents=True, exist_ok=True)
  files.atomic_write(path, tokenizer.proto)
  return Tokenizer.load(path)
