"""The training workdir's layout: its names, its config.json and vocabulary, and `open_workdir`,
the one way serving and export open a workdir. Training writes the workdir; serving reads it
through `flax_transformer.workdir` alone, so nothing here imports the training code (or grain).

  WORKDIR/
    config.json        the resolved experiment config (`ConfigDict.to_json_best_effort`), written
                       atomically by process 0 once the checkpoint is known to fit it; groups
                       model/data/train/checkpoint/eval/search (`flax_transformer.config`).
                       The model is `model_config_from(config['model'], vocab_size)` with
                       vocab_size = the SentencePiece model's piece count.
    vocab.model        the SentencePiece model shared by source and target; or, in a workdir
                       imported from Marian (or fine-tuned from one), source.spm, target.spm and
                       vocab.json instead (`flax_transformer.data.marian_tokenizer`), and for
                       a many-language model (NLLB, M2M-100, mBART-50) languages.json too
                       (`data.multilingual_tokenizer`). The files present say which;
                       `load_tokenizer` reads each.
    checkpoints/       an orbax `CheckpointManager` directory:
      <step>/          one finished checkpoint per saved step (integer name, no prefix);
                       unfinished saves live under temporary names and are never listed.
        params/        the model's params pytree (variables['params'], float32), StandardSave.
        train_state/   {'step': int32 [], 'opt_state': optax state, 'rng': uint32 [2]}.
        data_iter/     the grain iterator position, one process_<i>-of-<n>.json per process.
    averaged/          step_<S>_last_<K>/: the mean params of the K checkpoints up to step S.
    metrics.jsonl      {"step", "split", "name", "value"} per line (process 0).
    tensorboard/       TensorBoard event files (process 0).
    .lock              "HOST PID" of the trainer that holds the workdir (`lock`); serving never
                       takes it.
"""


from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from flax_transformer.config import TranslateConfig, search_config_from
from flax_transformer.data import marian_tokenizer, multilingual_tokenizer
from flax_transformer.data.marian_tokenizer import MarianTokenizer
from flax_transformer.data.multilingual_tokenizer import MultilingualTokenizer
from flax_transformer.data.tokenizer import TextTokenizer, Tokenizer
from flax_transformer.errors import InputError, MissingFileError
from flax_transformer.files import Path, to_path
from flax_transformer.model.config import ModelConfig, model_config_from

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.model"
CHECKPOINT_DIR = "checkpoints"
AVERAGED_DIR = "averaged"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
LOCK_FILE = ".lock"


# ----------------------------------------------------------------------------- config and vocab
def read_config(workdir: str | os.PathLike) -> dict[str, Any]:
  """WORKDIR/config.json as a dict; FileNotFoundError naming it when `workdir` is no workdir."""
  path = to_path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise MissingFileError(
        f"{path} not found: is {workdir} a training workdir (train.py --workdir)?")
  try:
    return json.loads(path.read_text())
  except ValueError as error:
    raise InputError(f"{path}: not valid JSON ({error}).") from None


def saved_config(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """WORKDIR/config.json as a dict, or None where there is none yet (a new run's workdir);
  ValueError naming the file when it is not valid JSON."""
  return read_config(workdir) if (to_path(workdir) / CONFIG_FILE).is_file() else None


def vocabulary_files(workdir: str | os.PathLike) -> list[Path]:
  """The workdir's vocabulary files: [vocab.model], or Marian's three; [] when it has none.

  Raises:
    ValueError: the workdir holds both kinds, or only some of Marian's files.
  """
  workdir = to_path(workdir)
  marian = [workdir / name for name in marian_tokenizer.FILES]
  present = [path for path in marian if path.is_file()]
  shared = workdir / VOCAB_FILE
  if shared.is_file():
    if present:
      raise InputError(f"{workdir} holds both {VOCAB_FILE} and Marian vocabulary files "
                       f"({', '.join(p.name for p in present)}); keep one kind.")
    return [shared]
  if present and len(present) < len(marian):
    missing = sorted({p.name for p in marian} - {p.name for p in present})
    raise InputError(f"{workdir} has an incomplete Marian vocabulary: {', '.join(missing)} "
                     "missing.")
  languages = workdir / multilingual_tokenizer.LANGUAGES_FILE
  if present and languages.is_file():
    present.append(languages)
  return present


def load_tokenizer(workdir: str | os.PathLike) -> TextTokenizer:
  """The workdir's vocabulary: the shared SentencePiece `Tokenizer` (vocab.model); for a
  workdir from Marian, a `MarianTokenizer` (source.spm, target.spm, vocab.json); with
  languages.json too, a `MultilingualTokenizer`."""
  return _read_vocabulary(workdir)[0]


def _read_vocabulary(workdir: str | os.PathLike) -> tuple[TextTokenizer, str]:
  """(the workdir's tokenizer, SHA-256 of its vocabulary files' bytes, in `vocabulary_files`
  order), each file read once."""
  paths = vocabulary_files(workdir)
  if not paths:
    raise MissingFileError(
        f"No vocabulary in {workdir}: expected {VOCAB_FILE}, or "
        f"{', '.join(marian_tokenizer.FILES)} for a model imported from Marian.")
  contents = {path.name: path.read_bytes() for path in paths}
  digest = hashlib.sha256()
  for data in contents.values():
    digest.update(data)
  if paths[0].name == VOCAB_FILE:
    return Tokenizer(contents[VOCAB_FILE], str(paths[0])), digest.hexdigest()
  if multilingual_tokenizer.LANGUAGES_FILE in contents:
    return MultilingualTokenizer.from_files(contents, workdir), digest.hexdigest()
  return MarianTokenizer.from_files(contents, workdir), digest.hexdigest()


def model_config(config: dict[str, Any], tokenizer: TextTokenizer) -> ModelConfig:
  """The architecture a workdir's config.json describes, for its vocabulary."""
  return model_config_from(config["model"], tokenizer.vocab_size)


@dataclasses.dataclass(frozen=True)
class Workdir:
  """An opened workdir: what config.json and the vocabulary say, each read once (the params are
  read apart, by `restore_params`, once the caller has checked its own settings). A command
  opens its workdir once and hands this down."""

  path: Path
  config: dict[str, Any]  # config.json.
  tokenizer: TextTokenizer
  model_config: ModelConfig
  vocab_sha256: str  # SHA-256 of the vocabulary files' bytes (a bulk job's identity).

  def translate_config(self, **settings: Any) -> TranslateConfig:
    """The serving settings: config.json's search group with `settings` (`TranslateConfig`
    fields) applied; a bad search group is a ValueError naming config.json."""
    try:
      search = search_config_from(self.config)
    except ValueError as error:
      raise InputError(f"{self.path / CONFIG_FILE}: {error}") from None
    return TranslateConfig(search=search).replace(**settings)


def open_workdir(workdir: str | os.PathLike) -> Workdir:
  """Reads WORKDIR's config.json and vocabulary, and the architecture they describe.

  Raises:
    FileNotFoundError: no config.json or no vocabulary, naming what is missing.
    ValueError: an unreadable config.json or an inconsistent vocabulary.
  """
  config = read_config(workdir)
  tokenizer, vocab_sha256 = _read_vocabulary(workdir)
  return Workdir(to_path(workdir), config, tokenizer, model_config(config, tokenizer),
                 vocab_sha256)
