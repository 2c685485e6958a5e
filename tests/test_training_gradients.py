"""The train step's gradients, checked against gradients computed another way: `jax.grad` of the
objective written out here (dense label-smoothed cross entropy, guided alignment's cross entropy,
both divided by the whole batch's real target tokens), at the parameters the step was given.

An optimizer of the test's own records each step's gradient in its state and applies plain SGD,
so the gradient the step computed is read exactly (Adam's first update is about
lr * sign(g): a wrong gradient scale would not show in the parameters). Dropout is 0, so with
gradient accumulation the micro-batches see the same model as the whole batch, and every
accumulation factor, with and without guided alignment, must give the same gradients and
`grad_norm`, over two steps (the second at parameters the first moved). Measured (2026-11-28,
AMD EPYC): every gradient within 4e-7 of the largest element's size, grad_norm within 1.4e-7;
the tolerances below are 5-7 times that.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from training_cases import ALIGNMENT_VOCAB as VOCAB
from training_cases import KEYS, aligned_examples, pack_aligned

from flax_transformer import ModelConfig, Transformer
from flax_transformer.config import TrainConfig
from flax_transformer.model.alignment import logits_and_alignment
from flax_transformer.training import recipe, steps
from flax_transformer.training.state import TrainState

SMOOTHING, LEARNING_RATE, ROWS, LENGTH = 0.1, 0.5, 8, 16


def _recording_sgd(learning_rate: float) -> optax.GradientTransformation:
  """SGD whose state is the last gradient it was given (exactly, as the step passed it)."""
  init = lambda params: jax.tree.map(jnp.zeros_like, params)
  update = lambda grads, state, params=None: (
      jax.tree.map(lambda g: -learning_rate * g, grads), grads)
  return optax.GradientTransformation(init, update)


def _model() -> Transformer:
  return Transformer(ModelConfig.tiny(
      VOCAB, num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0,
      attention_dropout_rate=0.0, max_len=LENGTH, alignment_layer=0, alignment_heads=2))


def _batch() -> dict[str, np.ndarray]:
  """ROWS packed rows of 1-2 examples each, with alignments; the last row is padding."""
  rows = [aligned_examples(1 + s % 2, seed=10 + s) for s in range(ROWS - 1)] + [[]]
  return pack_aligned(rows, LENGTH)


def _objective(model, params, batch, weight: float) -> jax.Array:
  """The training objective written out: sum over real target tokens of -sum_v q_v log p_v with
  q = (1 - eps) onehot + eps / V, plus `weight` times sum over aligned target pieces of
  -sum_s a_s log(attention_s + 1e-6) with a the row's alignment normalised to sum 1; divided by
  the batch's real target tokens."""
  inputs = {k: batch[k] for k in KEYS}
  logits, attention = logits_and_alignment(model, {"params": params}, **inputs, train=False)
  log_p = jax.nn.log_softmax(logits.astype(jnp.float32))  # [B, T, V]
  q = (1 - SMOOTHING) * jax.nn.one_hot(batch["targets"], VOCAB) + SMOOTHING / VOCAB
  real = batch["targets"] != 0
  total = jnp.sum(-jnp.sum(q * log_p, axis=-1) * real)
  if weight:
    aligned = jnp.asarray(batch["alignment"], jnp.float32)  # [B, T, S]
    target = aligned / jnp.maximum(aligned.sum(-1, keepdims=True), 1.0)
    total += weight * -jnp.sum(target * jnp.log(attention + 1e-6))
  return total / jnp.sum(real)


def _run_steps(model, batch, *, weight: float, accum_steps: int, num_steps: int = 2):
  """(gradient the step used, its grad_norm, params before, params after) of each step."""
  params = jax.tree.map(jnp.asarray, model.init(
      jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"])
  optimizer = _recording_sgd(LEARNING_RATE)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params), rng=jax.random.PRNGKey(1))
  step = jax.jit(functools.partial(
      steps.train_step, model=model, optimizer=optimizer, schedule=optax.constant_schedule(1.0),
      label_smoothing=SMOOTHING, accum_steps=accum_steps, guided_alignment_weight=weight))
  if not weight:
    batch = {k: batch[k] for k in KEYS}
  out = []
  for _ in range(num_steps):
    before = state.params
    state, metrics = step(state, batch)
    out.append((state.opt_state, float(metrics["grad_norm"]), before, state.params))
  return out


def _flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


@pytest.mark.slow  # Compile-bound (a train step per case, about 10 s each): CI runs it.
@pytest.mark.parametrize("weight", [0.0, 0.7], ids=["plain", "guided"])
@pytest.mark.parametrize("accum_steps", [1, 2, 4])
def test_step_gradient_equals_grad_of_the_written_objective(weight, accum_steps):
  model, batch = _model(), _batch()
  reference_grad = jax.jit(jax.grad(functools.partial(_objective, model, weight=weight)))
  wanted = []
  for index, (grads, grad_norm, before, after) in enumerate(
      _run_steps(model, batch, weight=weight, accum_steps=accum_steps)):
    want = _flat(reference_grad(before, batch))
    wanted.append(want)
    got = _flat(grads)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * scale,
                               err_msg=f"step {index}")
    np.testing.assert_allclose(grad_norm, np.sqrt(np.sum(want**2)), rtol=2e-6)
    np.testing.assert_allclose(_flat(after), _flat(before) - LEARNING_RATE * want, rtol=1e-5,
                               atol=1e-6)
  # The two steps' gradients differ (the second is at the moved parameters).
  assert np.abs(wanted[1] - wanted[0]).max() > 0.05 * np.abs(wanted[0]).max()


@pytest.mark.slow  # Compile-bound (8 devices, FSDP; 18 s): CI runs it.
def test_the_jitted_step_on_eight_devices_with_fsdp_and_accumulation_has_the_same_gradient(
    monkeypatch):
  """The step as training runs it (`recipe.build`: jitted over 8 devices, parameters split by
  FSDP, the batch and each of 2 micro-batches split over 'data', the state donated), with the
  recording SGD in place of the configured optimizer: the same check, with guided alignment
  (the plain step's sharding: tests/test_training_steps.py)."""
  model, weight = _model(), 0.7
  batch = pack_aligned([aligned_examples(1 + s % 2, seed=30 + s) for s in range(15)] + [[]], LENGTH)
  optimizer = _recording_sgd(LEARNING_RATE)
  monkeypatch.setattr(recipe.optim, "make_optimizer",
                      lambda train, d_model: (optimizer, optax.constant_schedule(1.0)))
  train = TrainConfig(schedule="constant", learning_rate=1.0, warmup_steps=0, num_train_steps=2,
                      grad_clip_norm=0.0, label_smoothing=SMOOTHING, fsdp=True,
                      grad_accum_steps=2, guided_alignment_weight=weight)
  built = recipe.build(model.config, train, rows=16, length=LENGTH, devices=jax.devices())
  assert len(built.mesh.devices.flat) == 8
  reference_grad = jax.jit(jax.grad(functools.partial(_objective, model, weight=weight)))
  state = built.init_state()
  for index in range(2):
    before = jax.device_get(state.params)
    state, metrics = built.train_step(state, built.place_batch(batch))
    want = _flat(reference_grad(before, batch))
    np.testing.assert_allclose(_flat(jax.device_get(state.opt_state)), want, rtol=1e-5,
                               atol=2e-6 * np.abs(want).max(), err_msg=f"step {index}")
    np.testing.assert_allclose(float(metrics["grad_norm"]), np.sqrt(np.sum(want**2)), rtol=2e-6)
