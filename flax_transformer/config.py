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
import re
import typing
from collections.abc import Mapping
from typing import Any, Literal

from flax_transformer.conventions import MAX_LENGTH_PENALTY
from flax_transformer.model.config import ModelConfig, model_config_from
from flax_transformer.validation import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    check_fields,
    checked_field,
    fail,
    parse_group,
    unknown_key_message,
)

GROUPS = ("model", "data", "train", "checkpoint", "eval", "search")
# File names of a local corpus folder: {split} and {lang} are filled in, and a '.gz' twin is
# found too. The default matches Multi30k (train.en.gz, val.de.gz, test_2016_flickr.en.gz).
DEFAULT_LOCAL_PATTERN = "{split}.{lang}"
# The command that writes such a folder for Multi30k (cli/datasets.py), named by the errors of a
# missing one.
MULTI30K_COMMAND = "flax-transformer data multi30k --output DIR"
SYNTHETIC_LANGS = ("en", "de")  # The embedded synthetic pair (data/synthetic.py).


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


# ----------------------------------------------------------------------------------- the groups
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
  # A many-language model's codes (import-hf: NLLB eng_Latn, M2M-100 en, mBART-50 en_XX) when
  # fine-tuning it: their tokens begin every source and target; '' for a one-pair vocabulary.
  source_code: str = ""
  target_code: str = ""
  synthetic_num_train: int = checked_field(50_000, POSITIVE)
  synthetic_num_eval: int = checked_field(500, POSITIVE)
  synthetic_num_test: int = checked_field(1000, POSITIVE)
  vocab_path: str = ""  # '' = train SentencePiece into the workdir (reused on restart).
  vocab_size: int = checked_field(1000, (lambda v: v >= 8, ">= 8"))
  vocab_model_type: Literal["unigram", "bpe"] = "unigram"
  # BPE-dropout (Provilkov et al., 2020) on train pairs: each merge skipped with this probability,
  # a new segmentation of each pair every epoch; a BPE vocabulary only; 0 = off.
  bpe_dropout: float = checked_field(0.0, FRACTION)
  # A skipped merge is retried after the next merge ('paper', Provilkov et al.'s Algorithm 1) or
  # never ('sentencepiece', SentencePiece's enable_sampling: the same probability splits more).
  bpe_dropout_rule: Literal["paper", "sentencepiece"] = "paper"
  vocab_max_chars: int = checked_field(10_000_000, POSITIVE)  # Training text sampled for the vocab.
  max_length: int = checked_field(32, (lambda v: v >= 2, ">= 2 (tokens including EOS)"))
  batch_tokens: int = checked_field(4096, POSITIVE)  # Global token budget per train step.
  eval_batch_size: int = checked_field(64, POSITIVE)  # Rows per eval-loss batch and process.
  eval_max_length: int = checked_field(64, (lambda v: v >= 2, ">= 2 (tokens including EOS)"))
  seed: int = checked_field(0, (lambda v: 0 <= v < 2**32, "in [0, 2**32)"))
  num_workers: int = checked_field(0, NON_NEGATIVE)  # grain worker processes; 0 = in this process.

  def __post_init__(self):
    check_fields(self)
    if self.source == "tfds" and not self.tfds_name:
      fail("data", "tfds_name", self.tfds_name,
            "a TFDS name such as 'wmt14_translate/de-en' when config.data.source='tfds'")
    if self.source == "local":
      if not self.local_dir:
        raise ConfigError(
            "config.data.local_dir must be a folder of {split}.{lang}[.gz] files when "
            f"config.data.source='local', got {self.local_dir!r}. For Multi30k "
            f"(configs/multi30k_en_de.py), get it with: {MULTI30K_COMMAND}, then pass "
            "--config.data.local_dir=DIR.")
      if "{split}" not in self.local_pattern or "{lang}" not in self.local_pattern:
        fail("data", "local_pattern", self.local_pattern,
              "a file name containing {split} and {lang}")
    if "://" in self.tfds_data_dir:  # Measured: a gs:// folder's first record read hangs.
      fail("data", "tfds_data_dir", self.tfds_data_dir,
           "a local folder: TFDS's array_record files are read as local files (prepare the data "
           "on each host's disk, or mount the bucket with gcsfuse and pass the mounted path)")
    if self.batch_tokens < self.max_length:
      fail("data", "batch_tokens", self.batch_tokens,
            f"at least config.data.max_length ({self.max_length}), one row")
    self._check_splits_and_languages()

  def _check_splits_and_languages(self) -> None:
    for name in ("train_split", "eval_split", "test_split", "source_lang", "target_lang"):
      value = getattr(self, name)
      # Only TFDS's own datasets accept split slices such as 'train[:10%]'.
      pattern = r"^\S+$" if self.source == "tfds" and "split" in name else r"^\w+$"
      if not re.match(pattern, value):
        fail("data", name, value, "a non-empty name of letters, digits and '_'")
    if self.source_lang == self.target_lang:
      fail("data", "target_lang", self.target_lang,
            f"a language other than source_lang ({self.source_lang!r})")
    if self.source == "synthetic":
      for name in ("source_lang", "target_lang"):
        if getattr(self, name) not in SYNTHETIC_LANGS:
          fail("data", name, getattr(self, name), f"one of {SYNTHETIC_LANGS}")
      splits = (self.train_split, self.eval_split, self.test_split)
      if len(set(splits)) != 3:
        fail("data", "test_split", self.test_split, "three different names for train_split, "
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

  num_train_steps: int = checked_field(100_000, POSITIVE)
  optimizer: Literal["adam", "adamw"] = "adam"
  schedule: Literal["rsqrt", "warmup_rsqrt", "warmup_cosine", "constant"] = "rsqrt"
  learning_rate: float = checked_field(1.0, POSITIVE)
  warmup_steps: int = checked_field(4000, NON_NEGATIVE)
  end_learning_rate_factor: float = checked_field(0.0, (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"))
  adam_b1: float = checked_field(0.9, FRACTION)
  adam_b2: float = checked_field(0.98, FRACTION)
  adam_eps: float = checked_field(1e-9, POSITIVE)
  weight_decay: float = checked_field(0.0, NON_NEGATIVE)
  grad_clip_norm: float = checked_field(0.0, NON_NEGATIVE)
  label_smoothing: float = checked_field(0.1, FRACTION)
  grad_accum_steps: int = checked_field(1, POSITIVE)
  fsdp: bool = False
  seed: int = checked_field(0, NON_NEGATIVE)
  log_every_steps: int = checked_field(100, POSITIVE)
  peak_flops_per_device: float = checked_field(0.0, NON_NEGATIVE)
  # Fine-tune from a checkpoint: a workdir (its latest), WORKDIR/checkpoints/<step> or an
  # averaged WORKDIR/averaged/<name>. Its params, model config and vocabulary are used; the
  # optimizer and step start fresh. '' = train from scratch. Ignored once the workdir has
  # checkpoints of its own (a restart resumes them).
  init_from: str = ""
  # Guided alignment (Garg et al., 2019; Marian's --guided-alignment): this weight times the
  # cross entropy of the alignment layer's cross-attention (config.model.alignment_layer,
  # alignment_heads) to the word alignments of the corpus (`{split}.align` beside local text;
  # the synthetic pair's gold ones), per target token, is added to the loss. 0 = off.
  guided_alignment_weight: float = checked_field(0.0, NON_NEGATIVE)

  def __post_init__(self):
    check_fields(self)
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

  save_every_steps: int = checked_field(1000, POSITIVE)
  max_to_keep: int = checked_field(5, POSITIVE)
  async_save: bool = True
  # gs:// workdirs: the trainer's lease object is taken over once unrenewed this long.
  lease_stale_seconds: int = checked_field(300, POSITIVE)
  # Wall time an async save may take before the job stops, naming it: a job suspended longer
  # during a save (SIGSTOP, Slurm's suspend, Ctrl-Z) or storage that stopped answering.
  save_timeout_seconds: int = checked_field(6 * 3600, POSITIVE)
  # A restart also restores the data stream's position (exact resume). False: the checkpoint's
  # parameters, optimizer state, step and RNG only, the stream started from its beginning; for
  # a job moved to another number of processes or grain workers, which cannot take the position.
  restore_data_position: bool = True

  def __post_init__(self):
    check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
  """`config.eval`: periodic evaluation on the eval split, and the final test-split score."""

  GROUP: typing.ClassVar[str] = "eval"

  eval_every_steps: int = checked_field(1000, NON_NEGATIVE)  # 0: only at the end.
  translate: bool = True  # Also translate the split for BLEU/chrF (with config.search).
  test_at_end: bool = True
  num_examples_to_show: int = checked_field(3, NON_NEGATIVE)

  def __post_init__(self):
    check_fields(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
  """`config.search`: how one batch of translations is searched.

  Frozen and hashable: the jitted search takes it as its one static argument. Every sentence
  of n source tokens (EOS included) gets at most floor(max_len_a * n + max_len_b) tokens before
  EOS (the paper used n + 50), within the model's max_len.
  """

  GROUP: typing.ClassVar[str] = "search"

  method: Literal["beam", "greedy", "sample"] = checked_field(
      "beam", doc="Beam search, greedy decoding or sampling.")
  beam_size: int = checked_field(4, POSITIVE, "Beams (K), for method 'beam'.")
  length_penalty: float = checked_field(
      0.6, (lambda v: 0 <= v <= MAX_LENGTH_PENALTY, f"in [0, {MAX_LENGTH_PENALTY:g}]"),
      "alpha of length_normalization, for method 'beam'.")
  length_normalization: Literal["gnmt", "fairseq"] = checked_field(
      "gnmt", doc="Beam search: a finished hypothesis of n tokens (EOS included) scores log p / "
      "divisor(n): gnmt ((5 + n) / 6) ** alpha (Flax, T5X); fairseq n ** alpha (also "
      "CTranslate2, Hugging Face, Marian).")
  finish_rule: Literal["top_k", "every_beam"] = checked_field(
      "top_k", doc="Beam search: top_k finishes a hypothesis only when its EOS ranks among the "
      "step's K best extensions (CTranslate2, fairseq, Hugging Face; K = 1 is greedy); "
      "every_beam scores every beam's EOS at every step (wider, prefers shorter outputs).")
  max_len_a: float = checked_field(
      1.0, (lambda v: 0 <= v < float("inf"), "finite and >= 0"),
      "At most max_len_a * source tokens + max_len_b output tokens.")
  max_len_b: int = checked_field(50, POSITIVE, "See max_len_a.")
  min_length: int = checked_field(0, NON_NEGATIVE, "Fewest output tokens before EOS.")
  temperature: float = checked_field(1.0, POSITIVE, "Sampling: divide the logits by this.")
  top_k: int = checked_field(0, NON_NEGATIVE, "Sampling: keep the k most probable tokens (0: all).")
  top_p: float = checked_field(1.0, (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
                               "Sampling: keep the smallest set with this probability.")
  grow_cache: Literal["auto", "yes", "no"] = checked_field(
      "auto", doc="Grow the self-attention cache with the output: faster search, longer "
      "compiles (auto = yes for beam search on CPU, in batches of more than 8 rows).")
  constraint_order: Literal["unordered", "ordered"] = checked_field(
      "unordered", doc="Beam search with constraints: meet them in any order, or in the order "
      "given (fairseq's --constraints ordered).")
  max_constraints: int = checked_field(
      8, POSITIVE, "Most constraints, and most forbidden phrases, per sentence.")
  max_constraint_pieces: int = checked_field(
      16, POSITIVE, "Most target pieces per constraint or forbidden phrase.")

  def __post_init__(self):
    check_fields(self)

  def replace(self, **changes: Any) -> SearchConfig:
    return dataclasses.replace(self, **changes)


SLOT_GROUPS = (0, 8, 16, 32)  # `TranslateConfig.slot_group`'s values (0: the backend's).


@dataclasses.dataclass(frozen=True, kw_only=True)
class TranslateConfig:
  """The serving settings of `Translator` and the CLI: the search group plus the fields only
  translation has. `replace` takes the fields of both (`beam_size=5, batch_tokens=2048`)."""

  GROUP: typing.ClassVar[str] = "translate"

  search: SearchConfig = SearchConfig()
  batch_tokens: int = checked_field(4096, (lambda v: v >= 8, ">= 8"),
                                    "Padded source tokens per batch and device.")
  seed: int = checked_field(0, (lambda v: 0 <= v < 2**63, "in [0, 2**63)"),
                            "Sampling: line i draws from fold_in(key(seed), i).")
  precision: Literal["float32", "bfloat16", "int8"] = checked_field(
      "float32", doc="Serving precision: float32 (the model as trained), bfloat16 (weights and "
      "compute) or int8 (w8a8 projections, `model.precision`); checkpoints stay as trained.")
  source_lang: str = checked_field(
      "", doc="A many-language model's source language code (NLLB eng_Latn, M2M-100 en, "
      "mBART-50 en_XX): its token starts the source.")
  target_lang: str = checked_field(
      "", doc="A many-language model's target language code: its token is forced as the first "
      "output token (before any target prefix). evaluate: also BLEU on lc.norm.tok text for a "
      "two-letter code (de, de_DE), or without a code for the workdir's data.target_lang.")
  engine: Literal["batches", "slots"] = checked_field(
      "slots", doc="slots: one table of slots per source length, each sentence's slot "
      "refilled as soon as it is done (continuous batching; a sentence's output never "
      "depends on the other sentences, nor on the number of devices); batches: sentences of "
      "similar length searched together, each batch until its longest sentence ends (a job "
      "started in batches resumes in batches). What still runs in batches: docs/design.md, "
      "\"The engine\".")
  slot_group: int = checked_field(
      0, (lambda v: v in SLOT_GROUPS, f"one of {', '.join(map(str, SLOT_GROUPS))}"),
      "engine slots: slots stepped together (G; each group steps at G x beam rows). Larger "
      "groups translate a file faster and a lone sentence slower, and change a score's last "
      "bits: a translation's bytes are those of its group size. 0: the backend's (8 on a "
      "CPU, 32 on a GPU).")
  vocab_shortlist: str = checked_field(
      "", doc="A text file in the target language: the search writes only the pieces the "
      "vocabulary makes of it (and the special and language tokens), exactly as the full "
      "search would with every other logit -inf, and computes logits for those alone; '' for "
      "the whole vocabulary (docs/translating.md).")

  def __post_init__(self):
    check_fields(self)

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

  @staticmethod
  def setting_fields() -> list[tuple[dataclasses.Field, Any]]:
    """(field, type hint) of every setting `replace` takes: the search group's, then
    batch_tokens and seed (the CLI makes one flag of each)."""
    fields = [(f, SearchConfig) for f in dataclasses.fields(SearchConfig)]
    fields += [(f, TranslateConfig) for f in dataclasses.fields(TranslateConfig)
               if f.name != "search"]
    return [(f, typing.get_type_hints(cls)[f.name]) for f, cls in fields]


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
  preset: str = ""  # config.model.preset, the name `model` started from ('' for none).

  def model_config(self, vocab_size: int) -> ModelConfig:
    return self.model.replace(vocab_size=vocab_size)


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
    raise ConfigError(f"The config's groups must be exactly {', '.join(GROUPS)}; unknown: "
                      f"{unknown or 'none'}, missing: {missing or 'none'}.")
  data = parse_group(DataConfig, config["data"])
  experiment = Experiment(
      model=model_config_from(config["model"], data.vocab_size), data=data,
      train=parse_group(TrainConfig, config["train"]),
      checkpoint=parse_group(CheckpointConfig, config["checkpoint"]),
      eval=parse_group(EvalConfig, config["eval"]),
      search=parse_group(SearchConfig, config["search"]),
      preset=config["model"].get("preset", "") or "")
  if experiment.model.quantization != "none":
    raise ConfigError(
        f"config.model.quantization={experiment.model.quantization!r} is for serving only: "
        "train with 'none', then translate with --precision int8 (Translator precision='int8').")
  _check_lengths(experiment)
  _check_bpe_dropout(experiment)
  _check_batch(experiment, *_device_counts(num_devices, num_processes))
  return experiment


def search_config_from(config: Mapping[str, Any]) -> SearchConfig:
  """The search group of a saved config (a workdir's config.json); ConfigError when it has none
  or a bad one."""
  if "search" not in config:
    if "decode" in config:  # The group's name before it was `search`.
      raise ConfigError('its search settings are under "decode", the old name of the group: '
                        'rename "decode" to "search".')
    raise ConfigError("it has no search group (config.search); add one, e.g. "
                      '"search": {"beam_size": 4}.')
  return parse_group(SearchConfig, config["search"])


def data_config_from(config: Mapping[str, Any]) -> DataConfig:
  """The data group of a saved config (a workdir's config.json); ConfigError when it has none
  or a bad one."""
  if "data" not in config:
    raise ConfigError("it has no data group (config.data).")
  return parse_group(DataConfig, config["data"])


def _device_counts(num_devices: int | None, num_processes: int | None) -> tuple[int, int]:
  if num_devices is None or num_processes is None:
    import jax

    num_devices = jax.device_count() if num_devices is None else num_devices
    num_processes = jax.process_count() if num_processes is None else num_processes
  return num_devices, num_processes


def _check_bpe_dropout(experiment: Experiment) -> None:
  """A vocabulary this run trains must be BPE for data.bpe_dropout, said before it is trained (a
  given or fine-tuned one is checked where it is loaded: data.pipeline)."""
  data = experiment.data
  if (data.bpe_dropout and not data.vocab_path and not experiment.train.init_from
      and data.vocab_model_type != "bpe"):
    raise ConfigError(
        f"config.data.bpe_dropout={data.bpe_dropout} needs a BPE vocabulary: set "
        f"config.data.vocab_model_type='bpe' (here {data.vocab_model_type!r}) or "
        "config.data.bpe_dropout=0.")


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


__all__ = [
  "DEFAULT_LOCAL_PATTERN",
  "GROUPS",
  "MULTI30K_COMMAND",
  "SYNTHETIC_LANGS",
  "CheckpointConfig",
  "ConfigError",
  "DataConfig",
  "EvalConfig",
  "Experiment",
  "ModelConfig",
  "SearchConfig",
  "TrainConfig",
  "TranslateConfig",
  "data_config_from",
  "group_keys",
  "load",
  "override_problem",
  "search_config_from",
]
