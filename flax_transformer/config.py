"""Every config of the package: the frozen groups, their one validator, and `load`.

An experiment config is an ml_collections ConfigDict (see configs/*.py) with six groups, each
parsed into one frozen dataclass below:

  config.model       ModelConfig       the architecture (a preset plus overrides)
  config.data        DataConfig        the corpus, the vocabulary and the batches
  config.train       TrainConfig       the optimizer and the loop
  config.checkpoint  CheckpointConfig  when to save, how many to keep
  config.eval        EvalConfig        periodic evaluation and the final test score
  config.search      SearchConfig      how translations are searched: training's BLEU, and the
                                       workdir's defaults for `translate` and `evaluate`

`load(config)` parses every group once, checks what must agree across groups (lengths within
the model's max_len, batch rows that split over the devices) and returns an `Experiment`. Every
field is checked by one validator, `_check_fields`, from its type hint (int, float, bool, str,
a Literal's choices) and its declared range; a bad value raises one `ConfigError` naming the key
(`config.train.warmup_steps`) and what is allowed. The serving settings of `Translator` and the
CLI are `TranslateConfig`: the search group plus the fields only translation has.

Run modes are never config fields: training/evaluation and teacher-forced/cached decoding are
call-time arguments of the modules, so one `ModelConfig` serves them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax.numpy as jnp

GROUPS = ("model", "data", "train", "checkpoint", "eval", "search")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
PRESETS = ("base", "big", "small", "tiny")
# File names of a local corpus folder: {split} and {lang} are filled in, and a '.gz' twin is
# found too. The default matches Multi30k (train.en.gz, val.de.gz, test_2016_flickr.en.gz).
DEFAULT_LOCAL_PATTERN = "{split}.{lang}"
SYNTHETIC_LANGS = ("en", "de")  # The embedded synthetic pair (data/synthetic.py).


class ConfigError(ValueError):
  """A config value that is unknown, of the wrong type, out of range or inconsistent."""


# ------------------------------------------------------------------------------- the validator
# A range check: (predicate, what is allowed), declared on a field with `_field`.
Check = tuple[Callable[[Any], bool], str]
POSITIVE: Check = (lambda v: v > 0, "> 0")
NON_NEGATIVE: Check = (lambda v: v >= 0, ">= 0")
FRACTION: Check = (lambda v: 0.0 <= v < 1.0, "in [0, 1)")


def _field(default: Any, check: Check | None = None) -> Any:
  return dataclasses.field(default=default, metadata={"check": check} if check else {})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _check_fields(group: Any) -> None:
  """Checks every field of the dataclass `group` against its type hint and declared range."""
  for field in dataclasses.fields(group):
    key, value = f"config.{group.GROUP}.{field.name}", getattr(group, field.name)
    _check_type(key, value, _hints(type(group))[field.name])
    check = field.metadata.get("check")
    if check and not check[0](value):
      raise ConfigError(f"{key} must be {check[1]}, got {value!r}.")


def _check_type(key: str, value: Any, hint: Any) -> None:
  if dataclasses.is_dataclass(hint):  # A nested group.
    if not isinstance(value, hint):
      raise ConfigError(f"{key} must be a {hint.__name__}, got {value!r}.")
    return
  if typing.get_origin(hint) is Literal:
    if value not in typing.get_args(hint):
      raise ConfigError(f"{key} must be one of {typing.get_args(hint)}, got {value!r}.")
    return
  allowed = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}[hint]
  if (isinstance(value, bool) and hint is not bool) or not isinstance(value, allowed):
    raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}.")


def _fail(group: str, name: str, value: Any, allowed: str) -> typing.NoReturn:
  raise ConfigError(f"config.{group}.{name} must be {allowed}, got {value!r}.")


def unknown_key_message(key: str, allowed: list[str], where: str) -> str:
  """'Unknown config key config.train.lr; did you mean learning_rate? Allowed in ...: ...'."""
  close = difflib.get_close_matches(key.rsplit(".", 1)[-1], allowed, n=1)
  hint = f" Did you mean {close[0]}?" if close else ""
  return f"Unknown config key {key}.{hint} Allowed in {where}: {', '.join(allowed)}."


def override_problem(path: str) -> str | None:
  """What is wrong with the config path of an override `--config.PATH=VALUE` ('train.lr'),
  or None when it names a field of a group: e.g. 'Unknown config key config.trian. Did you
  mean train? Allowed in config: model, data, ...'."""
  group, _, rest = path.partition(".")
  if group not in GROUPS:
    return unknown_key_message(f"config.{group}", list(GROUPS), "config")
  key, _, deeper = rest.partition(".")
  allowed = group_keys(group)
  if key not in allowed:
    return unknown_key_message(f"config.{group}.{key}", allowed, f"config.{group}")
  if deeper:
    return (f"config.{group}.{key} is a value, not a group; set it with "
            f"--config.{group}.{key}=VALUE.")
  return None


def group_keys(group: str) -> list[str]:
  """The keys a config group may hold ('model' adds 'preset' to ModelConfig's fields)."""
  if group == "model":
    return ["preset", *(f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size")]
  cls = {"data": DataConfig, "train": TrainConfig, "checkpoint": CheckpointConfig,
         "eval": EvalConfig, "search": SearchConfig}[group]
  return [f.name for f in dataclasses.fields(cls)]


def parse_group(cls: type, group: Mapping[str, Any], **extra: Any) -> Any:
  """Builds the group dataclass `cls` from a ConfigDict group (or mapping), checking its keys;
  `extra` fields are set by the caller, not the config."""
  allowed = [f.name for f in dataclasses.fields(cls) if f.name not in extra]
  unknown = sorted(set(group) - set(allowed))
  if unknown:
    raise ConfigError(unknown_key_message(f"config.{cls.GROUP}.{unknown[0]}", allowed,
                                          f"config.{cls.GROUP}"))
  return cls(**dict(group), **extra)


# ----------------------------------------------------------------------------------- the groups
@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture of the encoder-decoder Transformer (Vaswani et al., 2017).

  Shape letters (B, S, T, L, D, N, H, F, V, K): see the one legend in
  `flax_transformer.model.attention`; fields name their letter (D `emb_dim`, N `num_heads`,
  F `mlp_dim`, V `vocab_size`).
  """

  GROUP: typing.ClassVar[str] = "model"

  # V: one vocabulary for source and target (id 0 is padding).
  vocab_size: int = dataclasses.field(metadata={"check": POSITIVE})
  emb_dim: int = _field(512, POSITIVE)  # D, the paper's d_model.
  num_heads: int = _field(8, POSITIVE)  # N; head dim H = D / N.
  mlp_dim: int = _field(2048, POSITIVE)  # F, the paper's d_ff.
  num_encoder_layers: int = _field(6, POSITIVE)
  num_decoder_layers: int = _field(6, POSITIVE)
  dropout_rate: float = _field(0.1, FRACTION)  # On embeddings (+ positions), sub-layer outputs.
  attention_dropout_rate: float = _field(0.1, FRACTION)  # On attention weights; 0: fused kernel.
  max_len: int = _field(256, POSITIVE)  # Longest source or target the positions cover.
  positional_encoding: Literal["sinusoidal", "learned"] = "sinusoidal"
  norm_placement: Literal["post", "pre"] = "post"  # "post": LayerNorm(x + f(x)) as in the paper.
  layer_norm_epsilon: float = _field(1e-6, POSITIVE)  # Marian (Hugging Face) uses 1e-5.
  # Options that Marian (OPUS-MT) and fairseq checkpoints need; the defaults are the paper's.
  attention_bias: bool = False  # Biases on the attention's Q, K, V and output projections.
  activation: Literal["relu", "gelu", "swish"] = "relu"  # FFN; gelu is exact (erf), swish = SiLU.
  # Sinusoid features: "interleaved" sin/cos (the paper) or "halves" [sin..., cos...] (t2t,
  # fairseq, Marian); the same values, permuted.
  sinusoid_layout: Literal["interleaved", "halves"] = "interleaved"
  scale_embeddings: bool = True  # Token embeddings times sqrt(D), as in the paper.
  logits_bias: bool = False  # A learned bias [V] added to the logits (Marian's final_logits_bias).
  share_embeddings: bool = True  # One embedding table for source and target tokens.
  tie_output_projection: bool = True  # Logits = decoder output @ target embedding^T.
  share_layer_weights: bool = False  # One layer's weights reused at every depth (Universal T.).
  dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # Compute dtype.
  param_dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # Master weights.
  # jax.nn.dot_product_attention's implementation; None lets the package decide per backend.
  attention_implementation: Literal["xla", "cudnn", None] = None

  def __post_init__(self):
    _check_fields(self)
    if self.emb_dim % self.num_heads:
      raise ConfigError(f"config.model.emb_dim ({self.emb_dim}) must be divisible by "
                        f"config.model.num_heads ({self.num_heads}).")

  @property
  def head_dim(self) -> int:
    """H, the size of one attention head."""
    return self.emb_dim // self.num_heads

  @property
  def pre_norm(self) -> bool:
    """LayerNorm before each sub-layer (and after each stack) instead of after the residual."""
    return self.norm_placement == "pre"

  @property
  def compute_dtype(self) -> jnp.dtype:
    return DTYPES[self.dtype]

  @property
  def parameter_dtype(self) -> jnp.dtype:
    return DTYPES[self.param_dtype]

  def replace(self, **changes: Any) -> ModelConfig:
    """A copy with `changes` applied (validated again)."""
    return dataclasses.replace(self, **changes)

  # Named presets. Base and big are the paper's Table 3 models.
  @classmethod
  def base(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """The paper's base model: D 512, 8 heads, F 2048, 6+6 layers, dropout 0.1."""
    return cls(vocab_size=vocab_size, **overrides)

  @classmethod
  def big(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """The paper's big model: D 1024, 16 heads, F 4096, 6+6 layers, dropout 0.3."""
    settings = dict(emb_dim=1024, num_heads=16, mlp_dim=4096, dropout_rate=0.3,
                    attention_dropout_rate=0.1)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})

  @classmethod
  def small(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A small model for Multi30k-sized data and benchmarks: D 256, 4 heads, F 1024, 3+3."""
    settings = dict(emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3,
                    num_decoder_layers=3)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})

  @classmethod
  def tiny(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A model for tests and the CPU quick start: D 32, 4 heads, F 64, 2+2 layers."""
    settings = dict(emb_dim=32, num_heads=4, mlp_dim=64, num_encoder_layers=2,
                    num_decoder_layers=2, max_len=64)
    return cls(vocab_size=vocab_size, **{**settings, **overrides})


def model_config_from(model: Mapping[str, Any], vocab_size: int) -> ModelConfig:
  """Builds the `ModelConfig` from the experiment config's `model` group.

  `model.preset` names a preset ("base", "big", "small", "tiny", or "" for none); every other
  field of the group overrides it.
  """
  fields = dict(model)
  preset = fields.pop("preset", "") or ""
  if preset not in ("", *PRESETS):
    _fail("model", "preset", preset, f"one of {('', *PRESETS)}")
  allowed = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"]
  unknown = sorted(set(fields) - set(allowed))
  if unknown:
    raise ConfigError(unknown_key_message(f"config.model.{unknown[0]}", ["preset", *allowed],
                                          "config.model"))
  if preset:
    return getattr(ModelConfig, preset)(vocab_size, **fields)
  return ModelConfig(vocab_size=vocab_size, **fields)


def group_dict(group: Any) -> dict[str, Any]:
  """A parsed group (a dataclass above) as the mapping `parse_group` reads back."""
  return {field.name: getattr(group, field.name) for field in dataclasses.fields(group)}


def model_group(config: ModelConfig) -> dict[str, Any]:
  """The `config.model` group that `model_config_from` turns back into `config` (every field
  but vocab_size, which the vocabulary gives, and no preset): what a workdir's config.json holds
  for a model that no config file describes (an imported one, or a fine-tuned one)."""
  fields = group_dict(config)
  del fields["vocab_size"]
  return {"preset": "", **fields}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """`config.data`: the corpus, the shared vocabulary and the batches (configs/default.py)."""

  GROUP: typing.ClassVar[str] = "data"

  source: Literal["synthetic", "tfds", "local"] = "synthetic"
  tfds_name: str = ""  # TFDS name when source='tfds', e.g. 'wmt14_translate/de-en'.
  tfds_data_dir: str = ""  # Where TFDS data is prepared and read; '' = TFDS's default.
  local_dir: str = ""  # Folder of line-aligned files when source='local'.
  local_pattern: str = DEFAULT_LOCAL_PATTERN  # File names in local_dir, with {split}, {lang}.
  train_split: str = "train"
  eval_split: str = "validation"
  test_split: str = "test"
  source_lang: str = "en"
  target_lang: str = "de"
  synthetic_num_train: int = _field(50_000, POSITIVE)
  synthetic_num_eval: int = _field(500, POSITIVE)
  synthetic_num_test: int = _field(1000, POSITIVE)
  vocab_path: str = ""  # '' = train SentencePiece into the workdir (reused on restart).
  vocab_size: int = _field(1000, (lambda v: v >= 8, ">= 8"))
  vocab_model_type: Literal["unigram", "bpe"] = "unigram"
  vocab_max_chars: int = _field(10_000_000, POSITIVE)  # Training text sampled for the vocab.
  max_length: int = _field(32, (lambda v: v >= 2, ">= 2 (tokens including EOS)"))
  batch_tokens: int = _field(4096, POSITIVE)  # Global token budget per train step.
  eval_batch_size: int = _field(64, POSITIVE)  # Rows per eval-loss batch and process.
  eval_max_length: int = _field(64, (lambda v: v >= 2, ">= 2 (tokens including EOS)"))
  seed: int = _field(0, (lambda v: 0 <= v < 2**32, "in [0, 2**32)"))
  num_workers: int = _field(0, NON_NEGATIVE)  # grain worker processes; 0 = in this process.

  def __post_init__(self):
    _check_fields(self)
    if self.source == "tfds" and not self.tfds_name:
      _fail("data", "tfds_name", self.tfds_name,
            "a TFDS name such as 'wmt14_translate/de-en' when config.data.source='tfds'")
    if self.source == "local":
      if not self.local_dir:
        _fail("data", "local_dir", self.local_dir,
              "a folder of {split}.{lang}[.gz] files when config.data.source='local'")
      if "{split}" not in self.local_pattern or "{lang}" not in self.local_pattern:
        _fail("data", "local_pattern", self.local_pattern,
              "a file name containing {split} and {lang}")
    if self.batch_tokens < self.max_length:
      _fail("data", "batch_tokens", self.batch_tokens,
            f"at least config.data.max_length ({self.max_length}), one row")
    self._check_splits_and_languages()

  def _check_splits_and_languages(self) -> None:
    for name in ("train_split", "eval_split", "test_split", "source_lang", "target_lang"):
      value = getattr(self, name)
      # Only TFDS's own datasets accept split slices such as 'train[:10%]'.
      pattern = r"^\S+$" if self.source == "tfds" and "split" in name else r"^\w+$"
      if not re.match(pattern, value):
        _fail("data", name, value, "a non-empty name of letters, digits and '_'")
    if self.source_lang == self.target_lang:
      _fail("data", "target_lang", self.target_lang,
            f"a language other than source_lang ({self.source_lang!r})")
    if self.source == "synthetic":
      for name in ("source_lang", "target_lang"):
        if getattr(self, name) not in SYNTHETIC_LANGS:
          _fail("data", name, getattr(self, name), f"one of {SYNTHETIC_LANGS}")
      splits = (self.train_split, self.eval_split, self.test_split)
      if len(set(splits)) != 3:
        _fail("data", "test_split", self.test_split, "three different names for train_split, "
              f"eval_split and test_split when source='synthetic' (got {splits})")

  @property
  def global_rows(self) -> int:
    """Rows of one global train batch: batch_tokens // max_length."""
    return self.batch_tokens // self.max_length

  def rows_per_process(self, process_count: int) -> int:
    """Rows each process loads; raises when global_rows does not split evenly."""
    if self.global_rows % process_count:
      raise ConfigError(
          f"config.data.batch_tokens // config.data.max_length = {self.batch_tokens} // "
          f"{self.max_length} = {self.global_rows} rows per step, not divisible by the "
          f"{process_count} processes; pick batch_tokens = a multiple of "
          f"{self.max_length * process_count}.")
    return self.global_rows // process_count


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """`config.train`: optimisation and the training loop (see configs/default.py for meanings)."""

  GROUP: typing.ClassVar[str] = "train"

  num_train_steps: int = _field(100_000, POSITIVE)
  optimizer: Literal["adam", "adamw"] = "adam"
  schedule: Literal["rsqrt", "warmup_rsqrt", "warmup_cosine", "constant"] = "rsqrt"
  learning_rate: float = _field(1.0, POSITIVE)
  warmup_steps: int = _field(4000, NON_NEGATIVE)
  end_learning_rate_factor: float = _field(0.0, (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"))
  adam_b1: float = _field(0.9, FRACTION)
  adam_b2: float = _field(0.98, FRACTION)
  adam_eps: float = _field(1e-9, POSITIVE)
  weight_decay: float = _field(0.0, NON_NEGATIVE)
  grad_clip_norm: float = _field(0.0, NON_NEGATIVE)
  label_smoothing: float = _field(0.1, FRACTION)
  grad_accum_steps: int = _field(1, POSITIVE)
  fsdp: bool = False
  seed: int = _field(0, NON_NEGATIVE)
  log_every_steps: int = _field(100, POSITIVE)
  peak_flops_per_device: float = _field(0.0, NON_NEGATIVE)
  # Fine-tune from a checkpoint: a workdir (its latest), WORKDIR/checkpoints/<step> or an
  # averaged WORKDIR/averaged/<name>. Its params, model config and vocabulary are used; the
  # optimizer and step start fresh. '' = train from scratch. Ignored once the workdir has
  # checkpoints of its own (a restart resumes them).
  init_from: str = ""

  def __post_init__(self):
    _check_fields(self)
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

  GROUP: typing.ClassVar[str] = "checkpoint"

  save_every_steps: int = _field(1000, POSITIVE)
  max_to_keep: int = _field(5, POSITIVE)
  async_save: bool = True

  def __post_init__(self):
    _check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
  """`config.eval`: periodic evaluation on the eval split, and the final test-split score."""

  GROUP: typing.ClassVar[str] = "eval"

  eval_every_steps: int = _field(1000, NON_NEGATIVE)  # 0: only at the end.
  translate: bool = True  # Also translate the split for BLEU/chrF (with config.search).
  test_at_end: bool = True
  num_examples_to_show: int = _field(3, NON_NEGATIVE)

  def __post_init__(self):
    _check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
  """`config.search`: how one batch of translations is searched.

  Frozen and hashable: the jitted search takes it as its one static argument. Every sentence
  of n source tokens (EOS included) gets at most floor(max_len_a * n + max_len_b) tokens before
  EOS (the paper used n + 50), within the model's max_len.
  """

  GROUP: typing.ClassVar[str] = "search"

  method: Literal["beam", "greedy", "sample"] = "beam"
  beam_size: int = _field(4, POSITIVE)  # K, for method 'beam'.
  length_penalty: float = _field(0.6, NON_NEGATIVE)  # alpha, for method 'beam'.
  # Method 'beam': the length divisor of a finished hypothesis of n tokens (EOS included):
  # "gnmt" ((5 + n) / 6) ** alpha (Flax, T5X); "fairseq" n ** alpha (also CTranslate2, Hugging
  # Face, Marian).
  length_normalization: Literal["gnmt", "fairseq"] = "gnmt"
  # Method 'beam': "top_k" finishes a hypothesis only when its EOS ranks among the step's K best
  # extensions (CTranslate2, fairseq, Hugging Face; K = 1 is greedy); "every_beam" scores every
  # beam's EOS at every step (wider, prefers shorter outputs where EOS has weight).
  finish_rule: Literal["top_k", "every_beam"] = "top_k"
  max_len_a: float = _field(1.0, NON_NEGATIVE)
  max_len_b: int = _field(50, POSITIVE)
  min_length: int = _field(0, NON_NEGATIVE)  # Fewest tokens before EOS.
  temperature: float = _field(1.0, POSITIVE)  # For method 'sample'.
  top_k: int = _field(0, NON_NEGATIVE)  # For method 'sample'; 0 = no limit.
  top_p: float = _field(1.0, (lambda v: 0.0 < v <= 1.0, "in (0, 1]"))  # For method 'sample'.
  # Grow the self-attention cache with the output (faster on CPU, longer compiles): "auto" is
  # yes for beam search on CPU (predict.grows_cache), "yes", or "no".
  grow_cache: Literal["auto", "yes", "no"] = "auto"

  def __post_init__(self):
    _check_fields(self)

  def replace(self, **changes: Any) -> SearchConfig:
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TranslateConfig:
  """The serving settings of `Translator` and the CLI: the search group plus the fields only
  translation has. `replace` takes the fields of both (`beam_size=5, batch_tokens=2048`)."""

  GROUP: typing.ClassVar[str] = "translate"

  search: SearchConfig = SearchConfig()
  batch_tokens: int = _field(4096, (lambda v: v >= 8, ">= 8"))  # Padded source tokens a batch.
  seed: int = _field(0, NON_NEGATIVE)  # The random key of method 'sample'.

  def __post_init__(self):
    _check_fields(self)

  def replace(self, **changes: Any) -> TranslateConfig:
    """A copy with `changes` applied, each to the group that has the field."""
    search_fields = {f.name for f in dataclasses.fields(SearchConfig)}
    own = {f.name for f in dataclasses.fields(self)} - {"search"}
    unknown = sorted(set(changes) - search_fields - own)
    if unknown:
      raise ConfigError(unknown_key_message(
          unknown[0], sorted(search_fields | own), "the translate settings"))
    search = self.search.replace(**{k: v for k, v in changes.items() if k in search_fields})
    return dataclasses.replace(self, search=search,
                               **{k: v for k, v in changes.items() if k in own})


# ------------------------------------------------------------------------------- the experiment
@dataclasses.dataclass(frozen=True)
class Experiment:
  """A parsed, validated experiment config.

  `model` was built with `data.vocab_size`; `model_config(vocab_size)` gives the architecture
  for the vocabulary actually loaded (a given SentencePiece model may have another size).
  """

  model: ModelConfig
  data: DataConfig
  train: TrainConfig
  checkpoint: CheckpointConfig
  eval: EvalConfig
  search: SearchConfig

  def model_config(self, vocab_size: int) -> ModelConfig:
    return self.model.replace(vocab_size=vocab_size)


# Group names of earlier versions, and what they became.
RENAMED_GROUPS = {"decode": "search"}


def load(
    config: Mapping[str, Any], *, num_devices: int | None = None,
    num_processes: int | None = None,
) -> Experiment:
  """Parses and checks every group of `config`, and their agreement, for `num_devices` in all.

  Args:
    config: the experiment ConfigDict (or nested mapping).
    num_devices: devices of all processes (default: `jax.device_count()`).
    num_processes: processes (default: `jax.process_count()`).

  Raises:
    ConfigError: naming the offending key and what is allowed.
  """
  unknown = sorted(set(config) - set(GROUPS))
  missing = [g for g in GROUPS if g not in config]
  if unknown or missing:
    renamed = "".join(f" config.{old} is now config.{new}." for old, new in
                      RENAMED_GROUPS.items() if old in unknown)
    raise ConfigError(f"The config's groups must be exactly {', '.join(GROUPS)}; unknown: "
                      f"{unknown or 'none'}, missing: {missing or 'none'}.{renamed}")
  data = parse_group(DataConfig, config["data"])
  experiment = Experiment(
      model=model_config_from(config["model"], data.vocab_size), data=data,
      train=parse_group(TrainConfig, config["train"]),
      checkpoint=parse_group(CheckpointConfig, config["checkpoint"]),
      eval=parse_group(EvalConfig, config["eval"]),
      search=parse_group(SearchConfig, config["search"]))
  _check_lengths(experiment)
  _check_batch(experiment, *_device_counts(num_devices, num_processes))
  return experiment


def search_config_from(config: Mapping[str, Any]) -> SearchConfig:
  """The search group of a saved config (a workdir's config.json), earlier versions included:
  their `decode` group held beam_size, length_penalty, grow_cache and max_decode_len (dropped:
  the length cap is max_len_a * n + max_len_b now)."""
  if "search" in config:
    return parse_group(SearchConfig, config["search"])
  old = config.get("decode", {})
  return parse_group(SearchConfig, {k: v for k, v in old.items() if k != "max_decode_len"})


def _device_counts(num_devices: int | None, num_processes: int | None) -> tuple[int, int]:
  if num_devices is None or num_processes is None:
    import jax

    num_devices = jax.device_count() if num_devices is None else num_devices
    num_processes = jax.process_count() if num_processes is None else num_processes
  return num_devices, num_processes


def _check_lengths(experiment: Experiment) -> None:
  data, max_len = experiment.data, experiment.model.max_len
  for name in ("max_length", "eval_max_length"):
    if getattr(data, name) > max_len:
      raise ConfigError(
          f"config.data.{name} ({getattr(data, name)}) exceeds the model's max_len "
          f"({max_len}); raise config.model.max_len or lower config.data.{name}.")


def _check_batch(experiment: Experiment, num_devices: int, num_processes: int) -> None:
  data, accum = experiment.data, experiment.train.grad_accum_steps
  rows = data.global_rows
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
