"""The run's vocabulary, and the one place that writes a workdir's vocabulary files.

`prepare_vocabulary` picks, in this order: the vocabulary of `config.train.init_from`'s source (a
new fine-tuning run: its files are copied in), the one given by `config.data.vocab_path` (copied
into WORKDIR/vocab.model so the workdir restores on its own), the workdir's own (a restart), or
a shared SentencePiece model trained on the training text. Every file lands in the workdir
through `_write`, atomically. It lives in training, not in data/, because it reads and writes
the workdir.
"""

from __future__ import annotations

import logging
import os

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import DataConfig
from flax_transformer.data import builders, pipeline
from flax_transformer.data.tokenizer import TextTokenizer, Tokenizer, train_tokenizer
from flax_transformer.files import Path, to_path


def prepare_vocabulary(data: DataConfig, workdir: str | os.PathLike, *,
                       source: Path | None = None, is_chief: bool = True) -> TextTokenizer:
  """The run's vocabulary, written into `workdir` if it is not there yet.

  Args:
    data: config.data (`vocab_path`, and the corpus and size to train a vocabulary on).
    workdir: the run's workdir.
    source: the workdir of `config.train.init_from` for a new fine-tuning run (its
      vocabulary: `vocab.model`, or a Marian model's source.spm, target.spm and vocab.json);
      `init_from.plan` has checked that it agrees with `data.vocab_path` and the workdir's own.
    is_chief: whether this process writes a copy of `data.vocab_path` (the other processes
      read it where it is). A source's vocabulary and a trained one are written by every
      process, atomically, with the same bytes: each process reads it back from the workdir.

  Raises:
    builders.MissingDataError: `data.vocab_path` names no file, or the workdir holds
      checkpoints but not the vocabulary they were trained with (never trained again: another
      vocabulary would give the same ids to other pieces).
  """
  workdir = to_path(workdir)
  own = workdir_lib.vocabulary_files(workdir)
  if source is not None:
    if not own:
      _write(workdir, {f.name: f.read_bytes() for f in workdir_lib.vocabulary_files(source)})
    return workdir_lib.load_tokenizer(workdir)
  if data.vocab_path:
    if not to_path(data.vocab_path).is_file():
      raise builders.MissingDataError(f"config.data.vocab_path: no SentencePiece model at "
                                      f"{data.vocab_path}; set it to '' to train one into the "
                                      "workdir.")
    tokenizer = Tokenizer.load(data.vocab_path)
    if is_chief and not own:
      _write(workdir, {workdir_lib.VOCAB_FILE: tokenizer.proto})
    return tokenizer
  if own:
    logging.info("Reusing the vocabulary of %s.", workdir)
    return workdir_lib.load_tokenizer(workdir)
  steps = workdir_lib.saved_steps(workdir)
  if steps:
    raise builders.MissingDataError(
        f"{workdir} holds checkpoints (steps {steps}) but not {workdir_lib.VOCAB_FILE}, the "
        f"vocabulary they were trained with: put it back into the workdir, or set "
        f"config.data.vocab_path to a copy of it. A new one would not be trained: the same ids "
        f"would name other pieces.")
  sentences = pipeline.tokenizer_sample(data)
  logging.info("Training a %s SentencePiece vocabulary of %d pieces on %d sentences (%d chars).",
               data.vocab_model_type, data.vocab_size, len(sentences), sum(map(len, sentences)))
  tokenizer = train_tokenizer(sentences, vocab_size=data.vocab_size,
                              model_type=data.vocab_model_type)
  _write(workdir, {workdir_lib.VOCAB_FILE: tokenizer.proto})
  return Tokenizer.load(workdir / workdir_lib.VOCAB_FILE)


def _write(workdir: Path, contents: dict[str, bytes]) -> None:
  """The one writer of a workdir's vocabulary files: each written whole, atomically."""
  workdir.mkdir(parents=True, exist_ok=True)
  for name, data in contents.items():
    files.atomic_write(workdir / name, data)
