"""Fine-tuning from a checkpoint (`config.train.init_from`): parameters, model and vocabulary
from the source, a fresh optimizer at step 0, resuming like any run, and one clear error for
each way to get it wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import REPO, run_train_py, shrunk_settings

from flax_transformer import Transformer, Translator
from flax_transformer import config as config_lib
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import ConfigError
from flax_transformer.data import pipeline
from flax_transformer.data.tokenizer import train_tokenizer
from flax_transformer.experiment_flags import load_config_file
from flax_transformer.interop import marian
from flax_transformer.model.config import model_group
from flax_transformer.training import init_from, trainer
from flax_transformer.workdir import average_checkpoints, restore_params

pytestmark = pytest.mark.slow  # trains with train.py.

# The run's data and loop: conftest.py's SHRUNK on a new sample of the synthetic pair (data.seed
# 1), 20 steps (checkpoints at 10 and 20), saved synchronously (the runs share this process).
RUN = {"data__synthetic_num_train": 600, "data__synthetic_num_eval": 32, "data__seed": 1,
       "train__num_train_steps": 20, "checkpoint__async_save": False}


def _config(tfds_dir: Path, source: str, **overrides) -> ml_collections.ConfigDict:
  """configs/default.py with SHRUNK, RUN and `overrides` (`group__key=value`), but for SHRUNK's
  model: the config file's (64 wide, 2+2 layers) stays, so that a test can tell it from the
  source's (conftest.py's trained_workdir: SHRUNK's)."""
  config = load_config_file(REPO / "configs" / "default.py")
  settings = shrunk_settings(tfds_dir, **{**RUN, "train__init_from": source, **overrides})
  for key, value in settings.items():
    group, name = key.split(".")
    if group != "model" or f"{group}__{name}" in overrides:
      config[group][name] = value
  return config


@pytest.fixture
def source(trained_workdir, tmp_path):
  """A copy of the trained workdir that a test may change or delete."""
  shutil.copytree(trained_workdir, tmp_path / "source")
  return tmp_path / "source"


def _setup(config, workdir: Path):
  """The fine-tuning job as train_and_evaluate builds it, before any step."""
  saved = workdir_lib.saved_config(workdir)
  config, exp, source = trainer._resolve(config, workdir, {}, saved)
  return trainer._setup(config, exp, workdir, source, saved)


def _tree_equal(a, b) -> bool:
  return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


def test_step_0_is_the_sources_params_with_a_fresh_optimizer(source, tmp_path):
  job = _setup(_config(tmp_path / "tfds", str(source)), tmp_path / "ft")
  try:
    params, _ = restore_params(source)
    assert int(job.state.step) == 0
    assert _tree_equal(job.state.params, params)
    # Adam's moments and count as optimizer.init makes them: all zeros.
    assert all(not np.any(np.asarray(leaf)) for leaf in jax.tree.leaves(job.state.opt_state))
    assert job.recipe.model.config == Translator.from_workdir(source).model_config
  finally:
    job.manager.close()
    job.writer.close()
  assert (tmp_path / "ft" / "vocab.model").read_bytes() == (source / "vocab.model").read_bytes()
  saved = json.loads((tmp_path / "ft" / "config.json").read_text())
  assert saved["model"] == model_group(job.recipe.model.config)
  assert saved["train"]["init_from"] == str(source)


@pytest.mark.parametrize("where", ["step", "averaged"])
def test_a_steps_or_an_averaged_checkpoint_can_be_the_source(source, tmp_path, where):
  spec = str(source / "checkpoints" / "300") if where == "step" else str(
      average_checkpoints(source, 2))
  job = _setup(_config(tmp_path / "tfds", spec), tmp_path / "ft")
  try:
    want = restore_params(source, 300)[0] if where == "step" else restore_params(
        source, checkpoint=spec)[0]
    assert _tree_equal(job.state.params, want)
    assert not _tree_equal(job.state.params, restore_params(source)[0])
  finally:
    job.manager.close()
    job.writer.close()


def test_resuming_a_fine_tuning_run_is_exact_and_needs_no_source(source, tmp_path):
  tfds = tmp_path / "tfds"
  trainer.train_and_evaluate(_config(tfds, str(source)), str(tmp_path / "straight"),
                             model_overrides={"dropout_rate": 0.2})
  config = _config(tfds, str(source), train__num_train_steps=10)
  trainer.train_and_evaluate(config, str(tmp_path / "resumed"),
                             model_overrides={"dropout_rate": 0.2})
  shutil.rmtree(source)  # The restart reads nothing of it.
  trainer.train_and_evaluate(_config(tfds, str(source)), str(tmp_path / "resumed"),
                             model_overrides={"dropout_rate": 0.2})
  straight, resumed = (restore_params(tmp_path / name) for name in ("straight", "resumed"))
  assert straight[1] == resumed[1] == 20
  assert _tree_equal(straight[0], resumed[0])
  saved = json.loads((tmp_path / "resumed" / "config.json").read_text())
  assert saved["model"]["dropout_rate"] == 0.2 and saved["model"]["emb_dim"] == 32
  # A restart that leaves init_from out still resumes with the run's own model, not the config
  # file's (the default config's 64-wide model would not fit the checkpoint).
  plan = _plan(tmp_path, "", workdir=tmp_path / "resumed")
  assert plan.source is None and plan.config["model"] == saved["model"]
  config_lib.load(plan.config)


def _nll(translator: Translator, pairs: list[tuple[str, str]]) -> float:
  """Mean negative log-likelihood per target token, teacher-forced."""
  tokenizer = translator.tokenizer
  rows = [(tokenizer.tokenize(s) + [1], tokenizer.tokenize_target(t) + [1]) for s, t in pairs]
  inputs = np.zeros((len(rows), max(len(s) for s, _ in rows)), np.int32)
  targets = np.zeros((len(rows), max(len(t) for _, t in rows)), np.int32)
  for i, (s, t) in enumerate(rows):
    inputs[i, :len(s)], targets[i, :len(t)] = s, t
  logits = Transformer(translator.model_config).apply(
      {"params": translator.params}, jnp.asarray(inputs), jnp.asarray(targets))
  log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(targets)[..., None],
                                  axis=-1)[..., 0]
  return float(-(log_probs * (targets > 0)).sum() / (targets > 0).sum())


def test_a_marian_import_fine_tunes_and_its_loss_goes_down(marian_model_dir, tmp_path):
  marian.import_marian(marian_model_dir, tmp_path / "imported")
  config = _config(tmp_path / "tfds", str(tmp_path / "imported"), data__max_length=48,
                   data__batch_tokens=768, data__eval_max_length=48, train__num_train_steps=40)
  trainer.train_and_evaluate(config, str(tmp_path / "ft"))
  finetuned = tmp_path / "ft"
  for name in ("source.spm", "target.spm", "vocab.json"):  # Marian's vocabulary, kept.
    assert (finetuned / name).read_bytes() == (tmp_path / "imported" / name).read_bytes()
  pairs = pipeline.split_texts(config_lib.load(config).data, "validation")
  before = _nll(Translator.from_workdir(tmp_path / "imported"), pairs)
  after = _nll(Translator.from_workdir(finetuned), pairs)
  print(f"held-out NLL per token: {before:.3f} before, {after:.3f} after 40 steps")
  assert after < before
  assert Translator.from_workdir(finetuned).translate([pairs[0][0]])[0]  # It serves.


# ------------------------------------------------------------------------------ errors
def _plan(tmp_path: Path, spec: str, overrides=None, workdir=None, **settings):
  config = _config(tmp_path / "tfds", spec, **settings)
  workdir = workdir or tmp_path / "ft"
  return init_from.plan(config, workdir, overrides or {}, workdir_lib.saved_config(workdir))


def test_only_training_fields_may_be_overridden(source, tmp_path):
  plan = _plan(tmp_path, str(source), {"dropout_rate": 0.3, "attention_dropout_rate": 0.05})
  assert plan.source == init_from.Source(source)
  assert (plan.config["model"]["dropout_rate"], plan.config["model"]["emb_dim"]) == (0.3, 32)
  with pytest.raises(ConfigError) as error:
    _plan(tmp_path, str(source), {"emb_dim": 64, "num_heads": 8, "dropout_rate": 0.3})
  assert str(error.value) == (
      "With config.train.init_from the model is the source's; these config.model overrides "
      "would change it: emb_dim (the source's 32, given 64), num_heads (the source's 4, given "
      "8). Drop them (only dropout_rate, attention_dropout_rate, dtype, param_dtype, "
      "attention_implementation may change).")


@pytest.mark.parametrize("spec, message", [
    ("{tmp}/nowhere", "config.train.init_from='{tmp}/nowhere' is not a workdir (no "
     "config.json), a WORKDIR/checkpoints/<step> or a WORKDIR/averaged/<name> folder."),
    ("{source}/checkpoints/999", "config.train.init_from='{source}/checkpoints/999': no "
     "checkpoint for step 999 in {source}/checkpoints (saved: [200, 300, 400])."),
    ("{source}/averaged/step_9_last_2", "config.train.init_from="
     "'{source}/averaged/step_9_last_2': no averaged checkpoint at "
     "{source}/averaged/step_9_last_2."),
])
def test_a_bad_source_is_named(source, tmp_path, spec, message):
  spec = spec.format(tmp=tmp_path, source=source)
  with pytest.raises(ConfigError) as error:
    _plan(tmp_path, spec)
  assert str(error.value) == message.format(tmp=tmp_path, source=source)


def test_a_conflicting_vocab_path_is_an_error(source, tmp_path):
  other = train_tokenizer(["a b c d e f g h", "i j k l m n o p"] * 20, vocab_size=30,
                          model_type="unigram")
  (tmp_path / "other.model").write_bytes(other.proto)
  with pytest.raises(ConfigError, match=r"config\.data\.vocab_path='.*other\.model' differs "
                     r"from the vocabulary of config\.train\.init_from \(.*vocab\.model\); "
                     r"fine-tuning keeps the source's vocabulary"):
    _plan(tmp_path, str(source), data__vocab_path=str(tmp_path / "other.model"))
  # The source's own vocabulary named again is no conflict.
  assert _plan(tmp_path, str(source), data__vocab_path=str(source / "vocab.model"))
  # A workdir that already holds another vocabulary (say, of an aborted run) is one too.
  (tmp_path / "ft").mkdir()
  (tmp_path / "ft" / "vocab.model").write_bytes(other.proto)
  with pytest.raises(ConfigError) as error:
    _plan(tmp_path, str(source))
  assert str(error.value) == (
      f"{tmp_path / 'ft'} already holds another vocabulary (vocab.model) than "
      f"config.train.init_from ({source / 'vocab.model'}); use a new --workdir.")


def test_lengths_are_checked_against_the_sources_model(source, tmp_path):
  # The config file's model (max_len 16 here) is replaced before the config is checked: the
  # source's max_len (48) admits data.max_length 24.
  config = _config(tmp_path / "tfds", str(source), model__max_len=16)
  with pytest.raises(ConfigError, match="exceeds the model's max_len"):
    config_lib.load(config)
  plan = init_from.plan(config, tmp_path / "ft", {}, None)
  assert config_lib.load(plan.config).model.max_len == 48


def test_train_py_reports_a_shape_override_in_one_line(source, tmp_path):
  # SHRUNK's model flags (conftest.py) are the source's but for this one.
  result = run_train_py(tmp_path / "ft", check=False, train__init_from=source,
                        model__num_encoder_layers=3)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "error: With config.train.init_from the model is the source's; these config.model "
      "overrides would change it: num_encoder_layers (the source's 1, given 3). Drop them "
      "(only dropout_rate, attention_dropout_rate, dtype, param_dtype, "
      "attention_implementation may change).")
  assert "Traceback" not in result.stderr


def test_train_py_tells_an_imported_workdir_is_no_run_to_resume(marian_model_dir, tmp_path):
  marian.import_marian(marian_model_dir, tmp_path / "imported")
  result = run_train_py(tmp_path / "imported", check=False)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].endswith(
      "holds parameters only (an imported model, say), nothing to resume; train from it into a "
      f"new workdir with --config.train.init_from={tmp_path / 'imported'}.")
  assert "Traceback" not in result.stderr
