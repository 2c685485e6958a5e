"""Fine-tuning from a checkpoint: `config.train.init_from`.

    python train.py --config=configs/multi30k_en_de.py:cpu --workdir=runs/ft \\
        --config.train.init_from=runs/opus_en_de --config.model.dropout_rate=0.1

The source is a workdir (its latest checkpoint), one of its checkpoints
(`WORKDIR/checkpoints/<step>`) or an averaged one (`WORKDIR/averaged/step_S_last_K`); any
workdir that `translate` accepts, an imported Marian model included. While the new workdir has
no checkpoint of its own:

  - the model is the source's: its config.json model group replaces config.model. Command-line
    overrides of config.model (`--config.model.X=...`) may change only the fields that leave the
    function of the parameters alone (TRAINING_FIELDS: dropout, compute dtype, ...); any other
    override that differs from the source is an error listing those fields;
  - the vocabulary is the source's: its files are copied into the new workdir, and a
    config.data.vocab_path naming another vocabulary is an error;
  - the parameters are the source checkpoint's; the optimizer state, the step (0) and the data
    position start fresh.

The new workdir's config.json records the resolved model group, so serving it and restarting
the run need nothing of the source. Once the workdir has checkpoints, a restart resumes them as
any run does; `init_from` is then not read (logged), and the model comes from the workdir's own
config.json, even on a restart that leaves `init_from` out. Every error here is a
`ConfigError`, raised before anything compiles.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from flax_transformer import workdir as workdir_lib
from flax_transformer.config import DataConfig, TrainConfig
from flax_transformer.files import Path, to_path
from flax_transformer.model.config import model_config_from, model_group
from flax_transformer.validation import ConfigError, parse_group

# config.model fields that fine-tuning may change: they leave the parameters' function alone.
TRAINING_FIELDS = ("dropout_rate", "attention_dropout_rate", "dtype", "param_dtype",
                   "attention_implementation")
_KEY = "config.train.init_from"


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the parameters come from: `workdir`'s checkpoint `step` (None: the latest), or the
  averaged checkpoint folder `checkpoint`."""

  workdir: Path
  step: int | None = None
  checkpoint: Path | None = None

  def __str__(self) -> str:
    if self.checkpoint is not None:
      return str(self.checkpoint)
    return f"{self.workdir} (step {self.step})" if self.step is not None else str(self.workdir)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The resolved run: its config (config.model replaced) and, for a new run, its source."""

  config: dict[str, Any]
  source: Source | None  # None: the workdir has checkpoints and resumes them.


def parse_source(spec: str) -> Source:
  """'W', 'W/checkpoints/<step>' or 'W/averaged/<name>' -> Source (checked to exist)."""
  path = to_path(spec).expanduser()
  if (path / workdir_lib.CONFIG_FILE).is_file():
    source = Source(path)
  elif path.parent.name == workdir_lib.CHECKPOINT_DIR and re.fullmatch(r"\d+", path.name):
    source = Source(path.parent.parent, step=int(path.name))
  elif path.parent.name == workdir_lib.AVERAGED_DIR:
    source = Source(path.parent.parent, checkpoint=path)
  else:
    raise ConfigError(f"{_KEY}={spec!r} is not a workdir (no {workdir_lib.CONFIG_FILE}), a "
                      f"WORKDIR/{workdir_lib.CHECKPOINT_DIR}/<step> or a "
                      f"WORKDIR/{workdir_lib.AVERAGED_DIR}/<name> folder.")
  _check_checkpoint(source, spec)
  return source


def _check_checkpoint(source: Source, spec: str) -> None:
  if not (source.workdir / workdir_lib.CONFIG_FILE).is_file():
    raise ConfigError(f"{_KEY}={spec!r}: {source.workdir} has no {workdir_lib.CONFIG_FILE}.")
  if source.checkpoint is not None:
    if not source.checkpoint.is_dir():
      raise ConfigError(f"{_KEY}={spec!r}: no averaged checkpoint at {source.checkpoint}.")
    return
  steps = workdir_lib.saved_steps(source.workdir)
  if not steps or (source.step is not None and source.step not in steps):
    raise ConfigError(f"{_KEY}={spec!r}: no checkpoint "
                      f"{'' if source.step is None else f'for step {source.step} '}in "
                      f"{source.workdir / workdir_lib.CHECKPOINT_DIR} (saved: {steps}).")


def plan(config: Mapping[str, Any], workdir: Path, model_overrides: Mapping[str, Any],
         saved: Mapping[str, Any] | None) -> Plan | None:
  """The fine-tuning run `config` asks for in `workdir`, or None for an ordinary run.

  Call it before `config.load`: the model group that load then checks (lengths against max_len,
  say) is the source's, not the config file's.

  Args:
    config: the experiment config as given (a ConfigDict or nested mapping).
    workdir: the new run's workdir.
    model_overrides: the config.model fields the user set explicitly (train.py passes the
      command line's `--config.model.X=...`), e.g. {"dropout_rate": 0.2}.
    saved: the workdir's config.json, as the trainer read it (None: it has none yet).

  Returns:
    None without init_from (and for a workdir that no fine-tuning run wrote); else the config
    with its model group resolved, and the source unless the workdir has checkpoints to resume.

  Raises:
    ConfigError: a bad source, a conflicting vocabulary or architecture override.
  """
  if "train" not in config or "data" not in config:
    return None  # config.load names the missing groups.
  spec = parse_group(TrainConfig, config["train"]).init_from
  resuming = bool(workdir_lib.saved_steps(workdir))
  fine_tuned = bool(saved and saved.get("train", {}).get("init_from"))
  if not spec and not (resuming and fine_tuned):
    return None
  settings = _as_dict(config)
  try:
    if resuming:  # The run's own checkpoints and model; the source is not read.
      if saved is None:
        raise ConfigError(f"{_KEY}={spec!r}: {workdir} has checkpoints but no "
                          f"{workdir_lib.CONFIG_FILE} to resume them with.")
      logging.info("%s has checkpoints of a fine-tuning run: resuming them with its own model "
                   "(%s=%r is not read).", workdir, _KEY, spec)
      settings["model"] = _model(workdir, saved["model"], model_overrides, "this workdir's")
      return Plan(settings, None)
    source = parse_source(spec)
    _check_vocabularies(source.workdir, workdir,
                        parse_group(DataConfig, config["data"]).vocab_path)
    source_model = workdir_lib.read_config(source.workdir)["model"]
    settings["model"] = _model(source.workdir, source_model, model_overrides, "the source's")
  except ConfigError:
    raise
  except (OSError, ValueError, KeyError) as error:  # An unreadable config.json or vocabulary.
    raise ConfigError(f"{_KEY}={spec!r}: {_first_line(error)}") from None
  return Plan(settings, source)


def _first_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__


def _as_dict(config: Mapping[str, Any]) -> dict[str, Any]:
  if isinstance(config, ml_collections.ConfigDict):
    return config.to_dict()
  return copy.deepcopy(dict(config))


def _model(vocab_workdir: Path, base: Mapping[str, Any], overrides: Mapping[str, Any],
           whose: str) -> dict[str, Any]:
  """The model group `base` with the allowed `overrides`; ConfigError naming the others."""
  vocab_size = workdir_lib.load_tokenizer(vocab_workdir).vocab_size
  original = model_config_from(base, vocab_size)
  changed = model_config_from({**base, **overrides}, vocab_size)
  differing = [f"{f.name} ({whose} {getattr(original, f.name)!r}, given "
               f"{getattr(changed, f.name)!r})" for f in dataclasses.fields(original)
               if getattr(original, f.name) != getattr(changed, f.name)
               and f.name not in TRAINING_FIELDS]
  if differing:
    raise ConfigError(
        f"With {_KEY} the model is {whose}; these config.model overrides would change it: "
        f"{', '.join(differing)}. Drop them (only {', '.join(TRAINING_FIELDS)} may change).")
  return model_group(changed)


def _check_vocabularies(source: Path, workdir: Path, vocab_path: str) -> None:
  """The source's vocabulary is the run's: a different vocab_path, or a workdir that already
  holds another vocabulary, is an error."""
  files = workdir_lib.vocabulary_files(source)
  if vocab_path:
    same = [f for f in files if f.name == workdir_lib.VOCAB_FILE and to_path(vocab_path).is_file()
            and f.read_bytes() == to_path(vocab_path).read_bytes()]
    if not same:
      raise ConfigError(
          f"config.data.vocab_path={vocab_path!r} differs from the vocabulary of {_KEY} "
          f"({', '.join(str(f) for f in files)}); fine-tuning keeps the source's vocabulary, so "
          "leave config.data.vocab_path empty.")
  mine = workdir_lib.vocabulary_files(workdir) if workdir.is_dir() else []
  if mine and ([f.name for f in mine] != [f.name for f in files] or any(
      a.read_bytes() != b.read_bytes() for a, b in zip(mine, files, strict=True))):
    raise ConfigError(
        f"{workdir} already holds another vocabulary ({', '.join(f.name for f in mine)}) than "
        f"{_KEY} ({', '.join(str(f) for f in files)}); use a new --workdir.")


def load_params(source: Source, abstract_params: Any, shardings: Any) -> Any:
  """The source's params, restored straight into `shardings` (the training mesh's)."""
  target = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params,
      shardings)
  try:
    params, step = workdir_lib.restore_params(source.workdir, source.step,
                                              checkpoint=source.checkpoint, target=target)
  except (FileNotFoundError, ValueError) as error:
    raise ConfigError(f"{_KEY}: {error}") from None
  logging.info("Fine-tuning from %s, step %d: its parameters; a fresh optimizer at step 0.",
               source, step)
  return params
