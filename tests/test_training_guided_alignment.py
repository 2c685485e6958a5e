"""Guided alignment training: the loss against a float64 NumPy reference (its own forward pass
and cross entropy), packed rows equal to unpacked ones, 8-device sharding equal to one step on one
device (accumulation: tests/test_training_gradients.py), a short run that learns the alignment,
the recipe's batch, and a missing `.align` reported before anything compiles."""

import gzip

import jax
import numpy as np
import pytest
from conftest import REPO
from training_cases import ALIGNMENT_VOCAB, KEYS, aligned_examples, pack_aligned

from flax_transformer import ModelConfig, Transformer
from flax_transformer.config import TrainConfig
from flax_transformer.data.builders import MissingDataError
from flax_transformer.experiment_flags import config_from_flags
from flax_transformer.model.alignment import logits_and_alignment
from flax_transformer.training import loss as loss_lib
from flax_transformer.training import recipe, steps, trainer

import numpy_reference as ref


def _train_config(**overrides) -> TrainConfig:
  settings = dict(schedule="constant", learning_rate=3e-3, warmup_steps=0, num_train_steps=100,
                  grad_clip_norm=1.0, label_smoothing=0.1, seed=1, guided_alignment_weight=1.0)
  settings.update(overrides)
  return TrainConfig(**settings)


def _model_config(**overrides) -> ModelConfig:
  settings = dict(num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0,
                  attention_dropout_rate=0.0, max_len=16, alignment_layer=0, alignment_heads=2)
  settings.update(overrides)
  return ModelConfig.tiny(ALIGNMENT_VOCAB, **settings)


def _metrics(model_config, train, batch, devices=None, num_steps=1):
  """Metrics of `num_steps` train steps on `batch`, and the final state."""
  rows, length = batch["inputs"].shape
  built = recipe.build(model_config, train, rows=rows, length=length,
                       devices=devices or jax.devices()[:1])
  state, out = built.init_state(), []
  for _ in range(num_steps):
    state, metrics = built.train_step(state, built.place_batch(batch))
    out.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  return out, state


def _numpy_alignment_loss(params, config, batch) -> float:
  """Float64: the cross-attention of the alignment layer from `numpy_reference`'s own forward
  pass (its attention weights recorded as it runs), and the cross entropy written out."""
  recorded = []
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(ref, "attention", ref.recording_attention(recorded))
    ref.transformer(jax.device_get(params), config, batch["inputs"], batch["targets"])
  # Calls: encoder self-attention, then (self, cross) per decoder layer.
  cross = recorded[config.num_encoder_layers + 2 * config.alignment_layer + 1]  # [b, n, t, s]
  weights = cross[:, :config.alignment_heads].mean(axis=1)  # [b, t, s]
  total = 0.0
  for b, t in zip(*np.nonzero(batch["alignment"].any(axis=-1)), strict=True):
    target = batch["alignment"][b, t] / batch["alignment"][b, t].sum()
    total -= np.sum(target * np.log(weights[b, t] + 1e-6))
  return total


def test_alignment_loss_sum_equals_numpy():
  rng = np.random.default_rng(0)
  attention = rng.dirichlet(np.ones(5), size=(2, 3))  # [b 2, t 3, s 5]
  attention[0, 0, 4] = 0.0  # An underflowed weight where nothing is aligned stays finite.
  alignment = rng.random((2, 3, 5)) < 0.4
  alignment[0, 0, 4] = False
  alignment[1, 2] = False  # A row without alignment carries no loss.
  expected = 0.0
  for b, t in np.ndindex(2, 3):
    if alignment[b, t].any():
      target = alignment[b, t] / alignment[b, t].sum()
      expected -= np.sum(target * np.log(attention[b, t] + 1e-6))
  got = loss_lib.alignment_loss_sum(attention.astype(np.float32), alignment)
  np.testing.assert_allclose(float(got), expected, rtol=1e-6)
  normalised = alignment / np.maximum(alignment.sum(-1, keepdims=True), 1)
  np.testing.assert_allclose(float(loss_lib.alignment_loss_sum(attention, normalised)),
                             expected, rtol=1e-6)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_step_alignment_loss_equals_numpy_forward_pass():
  config = _model_config()
  examples = aligned_examples(3)
  batch = pack_aligned([[ex] for ex in examples], length=8)
  built = recipe.build(config, _train_config(), rows=3, length=8, devices=jax.devices()[:1])
  state = built.init_state()
  params = jax.device_get(state.params)
  _, metrics = built.train_step(state, built.place_batch(batch))
  expected = _numpy_alignment_loss(params, config, {k: batch[k] for k in (
      "inputs", "targets", "alignment")})
  assert expected > 1.0
  np.testing.assert_allclose(float(metrics["alignment_loss"]), expected, rtol=2e-5)
  assert float(metrics["num_tokens"]) == sum(len(ex["targets"]) for ex in examples)


@pytest.mark.slow  # Compile-bound (over 15 s on the 2-core AMD VM): the fast tier leaves it.
def test_packed_rows_give_the_loss_of_unpacked_rows():
  config, train = _model_config(), _train_config()
  examples = aligned_examples(4, seed=1)
  built = recipe.build(config, train, rows=4, length=16, devices=jax.devices()[:1])
  results = []
  for rows in ([[ex] for ex in examples], [examples[:2], examples[2:], [], []]):
    _, metrics = built.train_step(built.init_state(), built.place_batch(pack_aligned(rows, 16)))
    results.append(jax.device_get(metrics))
  unpacked, packed = results
  assert packed["alignment_loss"] > 1.0
  for key in ("alignment_loss", "loss", "num_tokens"):
    np.testing.assert_allclose(packed[key], unpacked[key], rtol=2e-5)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_eight_devices_equal_one_step_on_one_device():
  """With dropout (the same masks on 8 devices as on 1). Accumulation draws other dropout masks
  per micro-batch: tests/test_training_gradients.py checks it exactly, with dropout 0, against
  `jax.grad` of the objective written out."""
  config, train = _model_config(dropout_rate=0.1), _train_config()
  batch = pack_aligned([aligned_examples(2, seed=s) for s in range(8)], length=16)
  reference, state = _metrics(config, train, batch, num_steps=2)
  got, other = _metrics(config, train, batch, jax.devices(), num_steps=2)
  np.testing.assert_allclose(got[0]["alignment_loss"], reference[0]["alignment_loss"], rtol=1e-5)
  np.testing.assert_allclose(got[1]["alignment_loss"], reference[1]["alignment_loss"], rtol=1e-4)
  np.testing.assert_allclose(got[0]["grad_norm"], reference[0]["grad_norm"], rtol=1e-5)
  _assert_adam_params_close(other.params, state.params)
  np.testing.assert_allclose(got[0]["num_tokens"], reference[0]["num_tokens"])


def _assert_adam_params_close(got, want):
  """Parameters after the same Adam steps from the same start, summed in another order.

  Adam divides each update by the gradient's own root mean square (eps 1e-9), so an element
  whose gradient is near zero moves by up to the learning rate whichever way its rounding
  falls: summing over 8 devices instead of 1 flips a few such (1 of 4,096 in one matrix on
  CI's machine on 2026-11-27; none of the 184,768 on a 2-core AMD VM on 2026-12-06). Nearly
  every element agrees closely, in every parameter: a wrong gradient moves most elements
  apart, and a parameter that the 8 devices update wrongly (one LayerNorm's 64 elements left
  at their start, 64 of 184,768: under the whole tree's 0.1%) moves most of its own apart.
  (A bound on how far an element moves apart, 2 * num_steps * learning_rate, could not fail:
  Adam moves each element by about the learning rate per step whatever its gradient.)
  """
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want),
                          strict=True):
    apart = ~np.isclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-3,
                        atol=2e-4)
    # One flip anywhere, or 0.1% of a large one.
    assert apart.sum() <= 1 + 1e-3 * apart.size, (
        f"{jax.tree_util.keystr(path)}: {apart.sum()}/{apart.size} elements apart")
  got, want = (np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(t)])
               for t in (got, want))
  apart = ~np.isclose(got, want, rtol=1e-3, atol=2e-4)
  assert apart.sum() <= 1e-3 * apart.size, f"{apart.sum()}/{apart.size} elements apart"


def _alignment_loss(config, params, batch) -> float:
  """The alignment loss of `params` on `batch` without dropout (a forward pass)."""
  model = Transformer(config)
  inputs = {k: batch[k] for k in KEYS}
  _, attention = logits_and_alignment(model, {"params": params}, **inputs, train=False)
  return float(loss_lib.alignment_loss_sum(attention, batch["alignment"]))


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_short_guided_run_learns_the_alignment():
  config = _model_config()
  batch = pack_aligned([aligned_examples(2, seed=s) for s in range(4)], length=16)
  guided, guided_state = _metrics(config, _train_config(), batch, num_steps=40)
  first, last = guided[0]["alignment_loss"], _alignment_loss(config, guided_state.params, batch)
  assert last < 0.3 * first, (first, last)
  # The same steps without the weight do not pull the attention towards the alignment.
  plain_batch = {k: batch[k] for k in KEYS}  # A plain step takes no alignments.
  plain, plain_state = _metrics(config, _train_config(guided_alignment_weight=0.0), plain_batch,
                                num_steps=40)
  assert "alignment_loss" not in plain[-1]
  assert _alignment_loss(config, plain_state.params, batch) > 2 * last


def test_recipe_batch_carries_alignments_only_when_guided():
  config = _model_config()
  plain = recipe.build(config, _train_config(guided_alignment_weight=0.0), rows=8, length=16)
  guided = recipe.build(config, _train_config(), rows=8, length=16)
  assert "alignment" not in plain.abstract_batch() and not plain.guided_alignment
  spec = guided.abstract_batch()["alignment"]
  assert spec.shape == (8, 16, 16) and spec.dtype == np.bool_
  assert spec.sharding == guided.batch_sharding
  assert steps.ALIGNMENT_KEY == "alignment"


def test_missing_alignments_stop_training_before_it_compiles(tmp_path, monkeypatch):
  folder = tmp_path / "text"
  folder.mkdir()
  for lang, words in (("en", "a b c"), ("de", "x y")):
    for split in ("train", "val", "test"):
      with gzip.open(folder / f"{split}.{lang}.gz", "wt") as f:
        f.write(f"{words}\n" * 50)
  config = config_from_flags([
      f"--config={REPO / 'configs' / 'default.py'}", "--config.data.source=local",
      f"--config.data.local_dir={folder}", f"--config.data.tfds_data_dir={tmp_path / 'tfds'}",
      "--config.data.eval_split=val", "--config.data.vocab_size=20",
      "--config.train.guided_alignment_weight=0.5"])

  def no_compile(*args):
    raise AssertionError("compiled before the missing alignments were reported")

  monkeypatch.setattr(trainer, "_compile", no_compile)
  with pytest.raises(MissingDataError, match=r"train\.align or .*train\.align\.gz"):
    trainer.train_and_evaluate(config, str(tmp_path / "work"))
