"""The grouped experiment config, validated in one place before anything compiles.

An experiment config is an ml_collections ConfigDict with the groups `model`, `data`, `train`,
`checkpoint`, `eval` and `decode` (see configs/*.py). `load(config)` checks every group (unknown
key, wrong type, value out of range) and the values that must agree across groups (batch rows
divisible by the devices, warmup within training, lengths within the model's max_len), and
raises one `ConfigError` naming the key and what is allowed. The `model` group is checked by
`flax_transformer.config.model_config_from`, the `data` group by the data pipeline's
`DataConfig.from_config`; this module owns `train`, `checkpoint`, `eval` and `decode`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Literal

from flax_transformer.config import ModelConfig, model_config_from

GROUPS = ("model", "data", "train", "checkpoint", "eval", "decode")


class ConfigError(ValueError):
  """An experiment config value that is unknown, of the wrong type, or inconsistent."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """`config.train`: optimisation and the training loop (see configs/default.py for meanings)."""

  num_train_steps: int = 100_000
  optimizer: Literal["adam", "adamw"] = "adam"
  schedule: Literal["rsqrt", "warmup_rsqrt", "warmup_cosine", "constant"] = "rsqrt"
  learning_rate: float = 1.0
  warmup_steps: int = 4000
  end_learning_rate_factor: float = 0.0
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9
  weight_decay: float = 0.0
  grad_clip_norm: float = 0.0
  label_smoothing: float = 0.1
  grad_accum_steps: int = 1
  fsdp: bool = False
  seed: int = 0
  log_every_steps: int = 100
  peak_flops_per_device: float = 0.0

  def __post_init__(self):
    _positive(self, "train", "num_train_steps", "learning_rate", "adam_eps", "grad_accum_steps",
              "log_every_steps")
    _non_negative(self, "train", "warmup_steps", "weight_decay", "grad_clip_norm",
                  "peak_flops_per_device", "seed")
    for name in ("adam_b1", "adam_b2", "label_smoothing", "end_learning_rate_factor"):
      value = getattr(self, name)
      if not 0.0 <= value < 1.0 and not (name == "end_learning_rate_factor" and value == 1.0):
        raise ConfigError(f"config.train.{name} must lie in [0, 1), got {value!r}.")
    if self.warmup_steps > self.num_train_steps:
      raise ConfigError(
          f"config.train.warmup_steps ({self.warmup_steps}) must not exceed "
          f"config.train.num_train_steps ({self.num_train_steps}).")
    if self.schedule in ("rsqrt", "warmup_rsqrt") and self.warmup_steps == 0:
      raise ConfigError(f"config.train.schedule {self.schedule!r} needs warmup_steps > 0.")
    if self.weight_decay and self.optimizer != "adamw":
      raise ConfigError("config.train.weight_decay > 0 needs config.train.optimizer='adamw'.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
  """`config.checkpoint`: when to save and how many to keep."""

  save_every_steps: int = 1000
  max_to_keep: int = 5
  async_save: bool = True

  def __post_init__(self):
    _positive(self, "checkpoint", "save_every_steps", "max_to_keep")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
  """`config.eval`: periodic evaluation on the eval split, and the final test-split score."""

  eval_every_steps: int = 1000
  translate: bool = True
  test_at_end: bool = True
  num_examples_to_show: int = 3

  def __post_init__(self):
    _non_negative(self, "eval", "eval_every_steps", "num_examples_to_show")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeConfig:
  """`config.decode`: beam search used for BLEU during training."""

  beam_size: int = 4
  length_penalty: float = 0.6
  max_decode_len: int = 0
  grow_cache: Literal["auto", "yes", "no"] = "auto"  # predict.GROW_CACHE_SETTINGS

  def __post_init__(self):
    _positive(self, "decode", "beam_size")
    _non_negative(self, "decode", "length_penalty", "max_decode_len")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A validated experiment config; `model_config(vocab_size)` builds the architecture."""

  model: Mapping[str, Any]  # The raw `config.model` group (checked by model_config_from).
  data: Any  # flax_transformer.data.pipeline.DataConfig
  train: TrainConfig
  checkpoint: CheckpointConfig
  eval: EvalConfig
  decode: DecodeConfig

  def model_config(self, vocab_size: int) -> ModelConfig:
    return _model_config(self.model, vocab_size)

  @property
  def global_batch_rows(self) -> int:
    """Rows of one train step: data.batch_tokens // data.max_length."""
    return self.data.batch_tokens // self.data.max_length

  def decode_length(self, model: ModelConfig) -> int:
    """L: the longest translation decoded: decode.max_decode_len, or when 0
    data.eval_max_length (the eval references' cap) within the model's max_len."""
    return self.decode.max_decode_len or min(model.max_len, self.data.eval_max_length)


def load(
    config: Mapping[str, Any], *, num_devices: int | None = None,
    num_processes: int | None = None,
) -> Experiment:
  """Validates every group of `config` and their agreement, for `num_devices` in all.

  Args:
    config: the experiment ConfigDict (or nested mapping).
    num_devices: devices of all processes (default: `jax.device_count()`).
    num_processes: processes (default: `jax.process_count()`).

  Raises:
    ConfigError: naming the offending key and what is allowed.
  """
  from flax_transformer.data.pipeline import DataConfig

  unknown = sorted(set(config) - set(GROUPS))
  missing = [g for g in GROUPS if g not in config]
  if unknown or missing:
    raise ConfigError(
        f"Experiment config groups must be exactly {GROUPS}; unknown: {unknown}, "
        f"missing: {missing}.")
  try:
    data = DataConfig.from_config(config["data"])
  except (ValueError, TypeError, KeyError) as error:
    raise ConfigError(f"config.data: {error}") from error
  experiment = Experiment(
      model=dict(config["model"]), data=data,
      train=from_group(TrainConfig, config["train"], "train"),
      checkpoint=from_group(CheckpointConfig, config["checkpoint"], "checkpoint"),
      eval=from_group(EvalConfig, config["eval"], "eval"),
      decode=from_group(DecodeConfig, config["decode"], "decode"))
  model = experiment.model_config(data.vocab_size)
  _check_lengths(experiment, model)
  _check_batch(experiment, *_device_counts(num_devices, num_processes))
  return experiment


def _model_config(group: Mapping[str, Any], vocab_size: int) -> ModelConfig:
  try:
    return model_config_from(group, vocab_size)
  except (ValueError, TypeError) as error:
    raise ConfigError(f"config.model: {error}") from error


def _device_counts(num_devices: int | None, num_processes: int | None) -> tuple[int, int]:
  if num_devices is None or num_processes is None:
    import jax

    num_devices = jax.device_count() if num_devices is None else num_devices
    num_processes = jax.process_count() if num_processes is None else num_processes
  return num_devices, num_processes


def _check_lengths(experiment: Experiment, model: ModelConfig) -> None:
  data = experiment.data
  for name in ("max_length", "eval_max_length"):
    if getattr(data, name) > model.max_len:
      raise ConfigError(
          f"config.data.{name} ({getattr(data, name)}) exceeds the model's max_len "
          f"({model.max_len}); raise config.model.max_len or lower config.data.{name}.")
  if experiment.decode.max_decode_len > model.max_len:
    raise ConfigError(
        f"config.decode.max_decode_len ({experiment.decode.max_decode_len}) exceeds the "
        f"model's max_len ({model.max_len}).")


def _check_batch(experiment: Experiment, num_devices: int, num_processes: int) -> None:
  data, accum = experiment.data, experiment.train.grad_accum_steps
  rows = experiment.global_batch_rows
  if rows == 0:
    raise ConfigError(
        f"config.data.batch_tokens ({data.batch_tokens}) must be at least "
        f"config.data.max_length ({data.max_length}): one step takes batch_tokens // "
        "max_length rows.")
  if rows % accum or (rows // accum) % num_devices or rows % num_processes:
    raise ConfigError(
        f"config.data.batch_tokens // config.data.max_length = {rows} rows per step must split "
        f"into config.train.grad_accum_steps ({accum}) micro-batches whose rows divide evenly "
        f"over {num_devices} devices in {num_processes} processes; choose batch_tokens as a "
        f"multiple of {data.max_length * accum * num_devices}.")
  local_devices = num_devices // num_processes
  if data.eval_batch_size % local_devices:
    raise ConfigError(
        f"config.data.eval_batch_size ({data.eval_batch_size}, rows per process) must be a "
        f"multiple of the devices per process ({local_devices}).")


def from_group(cls: type, group: Mapping[str, Any], name: str) -> Any:
  """Builds the dataclass `cls` from `config.<name>`, checking keys and types first."""
  hints = typing.get_type_hints(cls)
  allowed = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(group) - set(allowed))
  if unknown:
    raise ConfigError(
        f"Unknown config key(s) {', '.join(f'config.{name}.{k}' for k in unknown)}; "
        f"allowed in config.{name}: {', '.join(allowed)}.")
  for key, value in group.items():
    _check_type(f"config.{name}.{key}", value, hints[key])
  return cls(**dict(group))


def _check_type(key: str, value: Any, hint: Any) -> None:
  if typing.get_origin(hint) is Literal:
    if value not in typing.get_args(hint):
      raise ConfigError(f"{key} must be one of {typing.get_args(hint)}, got {value!r}.")
    return
  allowed = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}[hint]
  if (isinstance(value, bool) and hint is not bool) or not isinstance(value, allowed):
    raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}.")


def _positive(group: Any, name: str, *fields: str) -> None:
  for field in fields:
    if getattr(group, field) <= 0:
      raise ConfigError(f"config.{name}.{field} must be > 0, got {getattr(group, field)!r}.")


def _non_negative(group: Any, name: str, *fields: str) -> None:
  for field in fields:
    if getattr(group, field) < 0:
      raise ConfigError(f"config.{name}.{field} must be >= 0, got {getattr(group, field)!r}.")
