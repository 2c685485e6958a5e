"""Experiment config validation (`flax_transformer.config.load`) and the shipped configs."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from flax_transformer import ModelConfig, experiment_flags
from flax_transformer import config as config_lib
from flax_transformer.config import ConfigError
from flax_transformer.model import config as model_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _config(name: str = "default", variant: str | None = None):
  return experiment_flags.load_config_file(CONFIGS / f"{name}.py", variant)


def _load(config, devices: int = 8, processes: int = 1):
  return config_lib.load(config, num_devices=devices, num_processes=processes)


def test_default_config_is_valid():
  exp = _load(_config())
  assert exp.data.source == "synthetic"
  assert exp.data.global_rows == 4096 // 32
  assert exp.model_config(512).emb_dim == 64


@pytest.mark.parametrize("group, key, value, message", [
    ("train", "learning_rat", 1.0, "Unknown config key config.train.learning_rat. Did you "
     "mean learning_rate? Allowed in config.train: num_train_steps, optimizer,"),
    ("train", "num_train_steps", 1.5, "config.train.num_train_steps must be of type int"),
    ("train", "fsdp", 1, "config.train.fsdp must be of type bool"),
    ("train", "schedule", "linear", "config.train.schedule must be one of ('rsqrt',"),
    ("train", "warmup_steps", 5000, "config.train.warmup_steps (5000) must not exceed"),
    ("train", "label_smoothing", 1.0, "config.train.label_smoothing must be in [0, 1)"),
    ("train", "weight_decay", 0.1, "needs config.train.optimizer='adamw'"),
    ("checkpoint", "save_every_steps", 0, "config.checkpoint.save_every_steps must be > 0"),
    ("search", "beam_size", 0, "config.search.beam_size must be > 0"),
    ("search", "top_p", 0.0, "config.search.top_p must be in (0, 1], got 0.0"),
    ("search", "length_penalty", 1e300, "config.search.length_penalty must be in [0, 10], got "
     "1e+300"),
    ("search", "length_penalty", float("nan"), "config.search.length_penalty must be in [0, 10]"),
    ("search", "max_len_a", float("inf"),
     "config.search.max_len_a must be finite and >= 0, got inf"),
    ("search", "method", "nucleus", "config.search.method must be one of ('beam', 'greedy',"),
    ("eval", "bleu", True, "Unknown config key config.eval.bleu. Allowed in config.eval:"),
    ("model", "num_heads", 5, "config.model.emb_dim (64) must be divisible by "
     "config.model.num_heads (5)"),
    ("model", "hidden", 5, "Unknown config key config.model.hidden. Allowed in config.model: "
     "preset, emb_dim,"),
    ("model", "dropout_rate", 1.0, "config.model.dropout_rate must be in [0, 1), got 1.0"),
    ("data", "source", "web", "config.data.source must be one of ('synthetic', 'tfds', 'local')"),
    ("data", "vocab_size", "8k", "config.data.vocab_size must be of type int, got '8k'"),
    ("search", "grow_cache", "maybe", "config.search.grow_cache must be one of ('auto', 'yes',"),
])
def test_bad_values_name_the_key(group, key, value, message):
  config = _config().to_dict()  # As a config file might write it, without ConfigDict's types.
  config[group][key] = value
  with pytest.raises(ConfigError) as error:
    _load(config)
  assert message in str(error.value)


def test_a_config_with_the_old_decode_group_names_the_unknown_and_missing_groups():
  config = _config().to_dict()
  config["decode"] = config.pop("search")
  with pytest.raises(ConfigError, match=r"unknown: \['decode'\], missing: \['search'\]\.$"):
    _load(config)


def test_search_group_of_a_workdir_config_json_is_read_and_an_old_one_is_told_to_rename():
  saved = {"search": {"beam_size": 3, "length_penalty": 1.0, "grow_cache": "no"}}
  assert config_lib.search_config_from(saved) == config_lib.SearchConfig(
      beam_size=3, length_penalty=1.0, grow_cache="no")
  with pytest.raises(ConfigError, match=r'under "decode", .*: rename "decode" to "search"\.'):
    config_lib.search_config_from({"decode": saved["search"]})
  with pytest.raises(ConfigError, match=r"it has no search group"):
    config_lib.search_config_from({"model": {}})
  with pytest.raises(ConfigError, match=r"config\.search\.beam_size must be > 0"):
    config_lib.search_config_from({"search": {"beam_size": 0}})


def test_training_refuses_an_int8_model_in_one_line():
  config = _config()
  config.model.quantization = "int8"
  with pytest.raises(ConfigError, match=r"^config\.model\.quantization='int8' is for serving "
                     r"only: .* --precision int8"):
    _load(config)


def test_batch_must_split_over_devices_and_micro_batches():
  config = _config()
  config.data.batch_tokens = 12 * 32  # 12 rows: not divisible by 8 devices
  with pytest.raises(ConfigError, match=r"12 rows per step .* multiple of 256"):
    _load(config)
  config.data.batch_tokens = 16 * 32
  _load(config)  # 16 rows, 8 devices: fine
  config.train.grad_accum_steps = 4  # micro-batches of 4 rows cannot feed 8 devices
  with pytest.raises(ConfigError, match="grad_accum_steps"):
    _load(config)
  _load(config, devices=4)
  config.train.grad_accum_steps = 1
  config.data.batch_tokens = 24 * 32  # 24 rows: 6 per process, 2 per device
  with pytest.raises(ConfigError, match="eval_batch_size"):
    _load(config, devices=3 * 4, processes=4)  # 64 eval rows per process over 3 devices


def test_lengths_must_fit_the_model():
  config = _config()
  config.data.eval_max_length = 100
  with pytest.raises(ConfigError, match=r"config.data.eval_max_length \(100\) exceeds"):
    _load(config)


@pytest.mark.parametrize("variant", ["", "bf16"])
def test_wmt14_configs_have_the_papers_settings(variant):
  base, big = _config("wmt14_en_de_base", variant), _config("wmt14_en_de_big", variant)
  for config in (base, big):
    exp = _load(config)
    train = exp.train
    assert (train.optimizer, train.adam_b1, train.adam_b2, train.adam_eps) == (
        "adam", 0.9, 0.98, 1e-9)
    assert (train.schedule, train.learning_rate, train.warmup_steps) == ("rsqrt", 1.0, 4000)
    assert train.label_smoothing == 0.1
    assert 24_000 <= exp.data.batch_tokens <= 26_000
    assert (exp.data.source_lang, exp.data.target_lang) == ("en", "de")
    assert exp.model_config(37000).dtype == ("bfloat16" if variant else "float32")
  base_model, big_model = (_load(c).model_config(37000) for c in (base, big))
  assert (base_model.emb_dim, base_model.num_heads, base_model.mlp_dim) == (512, 8, 2048)
  assert (big_model.emb_dim, big_model.num_heads, big_model.mlp_dim) == (1024, 16, 4096)
  assert (base_model.dropout_rate, big_model.dropout_rate) == (0.1, 0.3)
  assert (_load(base).train.num_train_steps, _load(big).train.num_train_steps) == (
      100_000, 300_000)


def test_multi30k_requires_its_data_folder():
  config = _config("multi30k_en_de")
  with pytest.raises(ConfigError, match=r"config\.data\.local_dir"):
    _load(config)
  config.data.local_dir = "/some/folder"
  assert _load(config).data.test_split == "test_2016_flickr"


def test_multi30k_variants():
  full, cpu = _config("multi30k_en_de", ""), _config("multi30k_en_de", "cpu,bf16")
  for config in (full, cpu):
    config.data.local_dir = "/some/folder"
  full, cpu = _load(full), _load(cpu)
  assert full.model_config(8000) == cpu.model_config(8000).replace(dtype="float32")
  assert cpu.model_config(8000).dtype == "bfloat16"
  assert (cpu.train.num_train_steps, cpu.data.batch_tokens) == (4000, 4096)
  assert full.train.num_train_steps > cpu.train.num_train_steps
  with pytest.raises(ValueError, match=r"subset of 'bf16', 'cpu', 'mini' .*got 'gpu'"):
    _config("multi30k_en_de", "gpu")
  with pytest.raises(ValueError, match=r"'cpu' and 'mini' exclude each other"):
    _config("multi30k_en_de", "cpu,mini")


def test_multi30k_mini_is_wu_et_als_recipe():
  """Wu et al. (ACL 2021): transformer_tiny at D 128, F 256, 4 heads, 4+4 layers, dropout 0.3;
  10k joint BPE; Adam (0.9, 0.98) at 5e-3, inverse sqrt after 2000 warmup steps; 4096 tokens
  per update, 8000 updates; the last 10 checkpoints averaged; beam 5."""
  config = _config("multi30k_en_de", "mini")
  config.data.local_dir = "/some/folder"
  exp = _load(config)
  model = exp.model_config(10_000)
  assert (model.emb_dim, model.mlp_dim, model.num_heads, model.num_encoder_layers,
          model.num_decoder_layers, model.dropout_rate) == (128, 256, 4, 4, 4, 0.3)
  assert (exp.data.vocab_size, exp.data.vocab_model_type, exp.data.batch_tokens) == (
      10_000, "bpe", 4096)
  train = exp.train
  assert (train.optimizer, train.adam_b1, train.adam_b2, train.learning_rate, train.schedule,
          train.warmup_steps, train.num_train_steps, train.weight_decay) == (
              "adam", 0.9, 0.98, 5e-3, "warmup_rsqrt", 2000, 8000, 0.0)
  assert (exp.checkpoint.save_every_steps, exp.checkpoint.max_to_keep) == (100, 10)
  assert exp.search.beam_size == 5


@pytest.mark.slow  # Spawns processes.
def test_train_py_reports_a_bad_override_before_compiling(tmp_path):
  result = subprocess.run(
      [sys.executable, str(CONFIGS.parent / "train.py"), f"--config={CONFIGS / 'default.py'}",
       f"--workdir={tmp_path}", "--config.train.warmup_steps=999999"],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert "error: config.train.warmup_steps (999999) must not exceed" in result.stderr
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow  # Spawns processes.
@pytest.mark.parametrize(("flags", "said"), [
    (["--config=CONFIG", "--workdir=W", "--bogus"],
     "error: unknown flag --bogus ('python train.py --help' lists the flags)"),
    (["--workdir=W"], "error: --config is required: python train.py "
                      "--config=configs/NAME.py --workdir=DIR"),
    ([], "error: --config and --workdir are required: python train.py "
         "--config=configs/NAME.py --workdir=DIR"),
    (["--config=CONFIG", "--workdir=W", "--num_processes=two"],
     "error: flag --num_processes=two: invalid literal for int() with base 10: 'two' "
     "('python train.py --help' lists the flags)"),
], ids=["unknown", "no-config", "neither", "bad-value"])
def test_train_py_says_a_flag_mistake_in_one_line(tmp_path, flags, said):
  """absl said 'FATAL Flags parsing error: ...' and 'Pass --helpshort or --helpfull ...'."""
  flags = [flag.replace("CONFIG", str(CONFIGS / "default.py")).replace("=W", f"={tmp_path}")
           for flag in flags]
  result = subprocess.run([sys.executable, str(CONFIGS.parent / "train.py"), *flags],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [said], result.stderr


@pytest.mark.slow  # Spawns processes.
def test_train_py_reports_an_unusable_compilation_cache_folder(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder\n")
  result = subprocess.run(
      [sys.executable, str(CONFIGS.parent / "train.py"), f"--config={CONFIGS / 'default.py'}",
       f"--workdir={tmp_path / 'workdir'}", f"--compilation_cache_dir={blocker / 'cache'}"],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert f"error: Compilation cache folder {blocker / 'cache'} cannot be created" in result.stderr
  assert not (tmp_path / "workdir" / "checkpoints").exists()


def test_a_tfds_folder_in_a_bucket_is_refused_in_one_line():
  """array_record reads its files as local files: a gs:// TFDS folder's first read hangs."""
  config = _config()
  config.data.tfds_data_dir = "gs://bucket/tensorflow_datasets"
  with pytest.raises(ConfigError) as error:
    config_lib.load(config)
  assert str(error.value).startswith(
      "config.data.tfds_data_dir must be a local folder: TFDS's array_record files are read as "
      "local files (prepare the data on each host's disk, or mount the bucket with gcsfuse")


# ------------------------------------------------------------------ model presets in the configs
# Every shipped config and variant, as --config=FILE[:VARIANT] names it.
SHIPPED = ["default", "multi30k_en_de", "multi30k_en_de:bf16", "multi30k_en_de:cpu",
           "multi30k_en_de:bf16,cpu", "multi30k_en_de:mini", "wmt14_en_de_base",
           "wmt14_en_de_base:bf16", "wmt14_en_de_big", "wmt14_en_de_big:bf16"]
# D, N heads, F, encoder and decoder layers of each preset, written out here (not read from
# ModelConfig) so that a changed preset fails.
PRESET_DIMS = {"tiny": (64, 4, 256, 2, 2), "mini": (128, 4, 256, 4, 4),
               "small": (256, 4, 1024, 3, 3),
               "base": (512, 8, 2048, 6, 6), "big": (1024, 16, 4096, 6, 6)}
# The fields every shipped config resolves to the same value.
COMMON_FIELDS = dict(
    positional_encoding="sinusoidal", norm_placement="post", layer_norm_epsilon=1e-6,
    attention_bias=False, activation="relu", sinusoid_layout="interleaved",
    scale_embeddings=True, logits_bias=False, share_embeddings=True, tie_output_projection=True,
    share_layer_weights=False, param_dtype="float32", attention_implementation=None,
    alignment_layer=-1, alignment_heads=0,  # Fields added later (issues 33, 40) keep defaults.
    quantization="none", position_offset=0, embedding_norm=False,  # and issue 59's.
    decoder_start_id=0, qkv_init_gain=1.0,
    norm_type="layer", mlp_bias=True, relative_attention_num_buckets=0,  # Issue 88's T5 options.
    relative_attention_max_distance=128, attention_scale=True, attention_head_dim=0,
    scale_tied_logits=False)
# Every shipped config's resolved model as it was on 2026-11-26, before the config files were cut
# down to their preset plus the fields that differ from it: the regression target.
QUICK_START = dict(vocab_size=512, emb_dim=64, num_heads=4, mlp_dim=256, num_encoder_layers=2,
                   num_decoder_layers=2, dropout_rate=0.1, attention_dropout_rate=0.0,
                   max_len=64, dtype="float32")
MULTI30K = dict(vocab_size=8000, emb_dim=256, num_heads=4, mlp_dim=1024, num_encoder_layers=3,
                num_decoder_layers=3, dropout_rate=0.3, attention_dropout_rate=0.1, max_len=128,
                dtype="float32")
MULTI30K_MINI = dict(vocab_size=10000, emb_dim=128, num_heads=4, mlp_dim=256,
                     num_encoder_layers=4, num_decoder_layers=4, dropout_rate=0.3,
                     attention_dropout_rate=0.0, max_len=128, dtype="float32")
WMT14_BASE = dict(vocab_size=37000, emb_dim=512, num_heads=8, mlp_dim=2048,
                  num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.1,
                  attention_dropout_rate=0.1, max_len=256, dtype="float32")
WMT14_BIG = dict(vocab_size=37000, emb_dim=1024, num_heads=16, mlp_dim=4096,
                 num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.3,
                 attention_dropout_rate=0.1, max_len=256, dtype="float32")
BF16 = dict(dtype="bfloat16")
RESOLVED = {
    "default": QUICK_START,
    "multi30k_en_de": MULTI30K, "multi30k_en_de:bf16": {**MULTI30K, **BF16},
    "multi30k_en_de:cpu": MULTI30K, "multi30k_en_de:bf16,cpu": {**MULTI30K, **BF16},
    "multi30k_en_de:mini": MULTI30K_MINI,
    "wmt14_en_de_base": WMT14_BASE, "wmt14_en_de_base:bf16": {**WMT14_BASE, **BF16},
    "wmt14_en_de_big": WMT14_BIG, "wmt14_en_de_big:bf16": {**WMT14_BIG, **BF16},
}
# What each config sets on top of its preset, on purpose: kept whatever the preset.
FILE_FIELDS = {
    "default": dict(attention_dropout_rate=0.0),
    "multi30k_en_de": dict(dropout_rate=0.3, max_len=128),
    "multi30k_en_de:bf16": dict(dropout_rate=0.3, max_len=128, **BF16),
    "multi30k_en_de:cpu": dict(dropout_rate=0.3, max_len=128),
    "multi30k_en_de:bf16,cpu": dict(dropout_rate=0.3, max_len=128, **BF16),
    "multi30k_en_de:mini": dict(max_len=128),  # Its preset's dropout is already 0.3.
    "wmt14_en_de_base": dict(max_len=256), "wmt14_en_de_base:bf16": dict(max_len=256, **BF16),
    "wmt14_en_de_big": dict(max_len=256), "wmt14_en_de_big:bf16": dict(max_len=256, **BF16),
}


def _read(shipped: str, *overrides: str):
  """The ConfigDict that `--config=configs/SHIPPED.py[:VARIANT] --config.KEY=V ...` gives."""
  name, _, variant = shipped.partition(":")
  local_dir = ["--config.data.local_dir=/x"] if name.startswith("multi30k") else []
  argv = [f"--config={CONFIGS / name}.py" + (f":{variant}" if variant else ""), *local_dir,
          *(f"--config.{override}" for override in overrides)]
  return experiment_flags.config_from_flags(argv)


def _dims(model: ModelConfig) -> tuple[int, ...]:
  return (model.emb_dim, model.num_heads, model.mlp_dim, model.num_encoder_layers,
          model.num_decoder_layers)


@pytest.mark.parametrize("shipped", SHIPPED)
def test_shipped_configs_resolve_to_the_models_they_always_had(shipped):
  model = _load(_read(shipped), devices=1).model
  assert dataclasses.asdict(model) == {**COMMON_FIELDS, **RESOLVED[shipped]}


@pytest.mark.parametrize("preset", list(PRESET_DIMS))
@pytest.mark.parametrize("shipped", SHIPPED)
def test_a_preset_on_the_command_line_gives_its_dims_and_keeps_the_files_fields(shipped, preset):
  config = _read(shipped, f"model.preset={preset}")
  model = _load(config, devices=1).model
  assert _dims(model) == PRESET_DIMS[preset]
  file_fields = FILE_FIELDS[shipped]
  # The file's fields on top of the preset, and nothing else of the file (or of default.py).
  assert model == getattr(ModelConfig, preset)(model.vocab_size, **file_fields)
  text = model_config.describe_model(model, config.model.preset)
  d, n, f, encoder, decoder = PRESET_DIMS[preset]
  assert text.startswith(f"{preset} preset: D {d}, {n} heads, F {f}, {encoder}+{decoder} layers,")
  preset_alone = getattr(ModelConfig, preset)(model.vocab_size)
  listed = {name: value for name, value in file_fields.items()
            if value != getattr(preset_alone, name)}
  if listed:
    assert text.endswith("; on top of the preset: " + ", ".join(
        f"{name}={value!r}" for name, value in listed.items()))
  else:
    assert "on top of the preset" not in text


@pytest.mark.parametrize("preset", list(PRESET_DIMS))
@pytest.mark.parametrize("shipped", SHIPPED)
def test_a_field_on_the_command_line_wins_over_the_preset_and_the_file(shipped, preset):
  # 96 divides by every preset's heads; max_len 320 covers every config's data lengths.
  changed = dict(emb_dim=96, dropout_rate=0.2, attention_dropout_rate=0.05, max_len=320,
                 dtype="float16", share_embeddings=False)
  config = _read(shipped, f"model.preset={preset}",
                 *(f"model.{name}={value}" for name, value in changed.items()))
  # Parsed as literals even where the file does not set the field.
  assert {name: (type(config.model[name]), config.model[name]) for name in changed} == {
      name: (type(value), value) for name, value in changed.items()}
  model = _load(config, devices=1).model
  assert {name: getattr(model, name) for name in changed} == changed
  assert _dims(model)[1:] == PRESET_DIMS[preset][1:]
  text = model_config.describe_model(model, preset)
  assert text.startswith(f"{preset} preset: D 96, ")
  assert "emb_dim=96" in text and "share_embeddings=False" in text and "max_len=320" in text


def test_describe_model_lists_what_differs_from_the_preset():
  big = ModelConfig.big(37000, attention_dropout_rate=0.0)
  assert model_config.describe_model(big, "big") == (
      "big preset: D 1024, 16 heads, F 4096, 6+6 layers, vocab 37000, max_len 256, float32 "
      "compute; on top of the preset: attention_dropout_rate=0.0")
  assert model_config.describe_model(ModelConfig.tiny(512), "tiny") == (
      "tiny preset: D 64, 4 heads, F 256, 2+2 layers, vocab 512, max_len 64, float32 compute")
  # The same model described against another preset lists what that preset lacks.
  assert model_config.describe_model(ModelConfig.tiny(512), "small") == (
      "small preset: D 64, 4 heads, F 256, 2+2 layers, vocab 512, max_len 64, float32 compute; "
      "on top of the preset: emb_dim=64, mlp_dim=256, num_encoder_layers=2, "
      "num_decoder_layers=2, max_len=64")
  imported = ModelConfig(vocab_size=100, emb_dim=64, num_heads=4, activation="swish")
  assert model_config.describe_model(imported) == (
      "no preset: D 64, 4 heads, F 2048, 6+6 layers, vocab 100, max_len 256, float32 compute; "
      "beyond the field defaults: emb_dim=64, num_heads=4, activation='swish'")
  with pytest.raises(ConfigError, match=r"config\.model\.preset must be one of .*'huge'"):
    model_config.describe_model(big, "huge")


def test_model_group_holds_every_field_and_the_presets_name():
  config = ModelConfig.big(37000, attention_dropout_rate=0.0, dtype="bfloat16")
  group = model_config.model_group(config, "big")
  assert group["preset"] == "big"
  assert set(group) == {"preset"} | {field.name for field in dataclasses.fields(ModelConfig)
                                     if field.name != "vocab_size"}
  assert model_config.model_config_from(group, 37000) == config
  # Every field is written, so the group still gives this model under any preset's definition.
  assert model_config.model_config_from({**group, "preset": "tiny"}, 37000) == config
  assert model_config.model_group(config)["preset"] == ""
  with pytest.raises(ConfigError, match=r"config\.model\.preset must be one of"):
    model_config.model_group(config, "huge")


# configs/default.py (the quick-start recipe) against the groups' dataclass defaults (the paper's
# settings, what a Python user who builds `TrainConfig()` etc. gets): exactly these fields
# differ, as the README's config reference says. A new difference must be added on purpose.
QUICK_START_OVER_DATACLASSES = {
    "data.synthetic_num_train": (50_000, 20_000), "data.synthetic_num_eval": (500, 200),
    "data.synthetic_num_test": (1000, 500), "data.vocab_size": (1000, 512),
    "data.vocab_max_chars": (10_000_000, 2_000_000), "data.eval_max_length": (64, 40),
    "train.num_train_steps": (100_000, 600), "train.schedule": ("rsqrt", "warmup_rsqrt"),
    "train.learning_rate": (1.0, 3e-3), "train.warmup_steps": (4000, 200),
    "train.grad_clip_norm": (0.0, 1.0), "checkpoint.save_every_steps": (1000, 300),
    "checkpoint.max_to_keep": (5, 3), "eval.eval_every_steps": (1000, 300),
}


def test_default_py_differs_from_the_dataclass_defaults_only_where_the_readme_says():
  config = _config()
  groups = {"data": config_lib.DataConfig, "train": config_lib.TrainConfig,
            "checkpoint": config_lib.CheckpointConfig, "eval": config_lib.EvalConfig,
            "search": config_lib.SearchConfig}
  differences = {}
  for group, cls in groups.items():
    for field in dataclasses.fields(cls):
      if (field.name in config[group] and field.default is not dataclasses.MISSING
          and field.default != config[group][field.name]):
        differences[f"{group}.{field.name}"] = (field.default, config[group][field.name])
  assert differences == QUICK_START_OVER_DATACLASSES
  assert set(config) - set(groups) == {"model"}  # The model: the tiny preset (ModelConfig: base).
  assert config.model.preset == "tiny"
