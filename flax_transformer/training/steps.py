"""The pure train and eval steps, and their `jax.jit` over the mesh with explicit shardings.

Batches are dicts of int32 [B, L] arrays with the model's keyword names ('inputs', 'targets',
and for packed train rows the segment ids and positions). B is the global batch; it is split
over the mesh's 'data' axis, and with gradient accumulation into `accum_steps` micro-batches of
B / accum_steps rows, run one after another so that activations of one micro-batch are alive at
a time. The loss is normalised by the real target tokens of the whole global batch, so k
micro-batches give the gradient of one step on their concatenation.

With guided alignment (`guided_alignment_weight` > 0) the batch also holds 'alignment', bool
[B, L, L] (target piece t aligned to source piece s, `data.pipeline`), split like the other
arrays; the objective adds weight * `loss.alignment_loss_sum` of the alignment layer's
cross-attention (`model.alignment.logits_and_alignment`, one pass), normalised by the same
target tokens. With weight 0 the step is the plain one, traced exactly as before.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from flax_transformer.conventions import ALIGNMENT_KEY  # bool [B, L, L] of guided alignment.
from flax_transformer.model.alignment import logits_and_alignment
from flax_transformer.runtime import sharding as sharding_lib
from flax_transformer.training import loss as loss_lib
from flax_transformer.training.state import TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


def train_step(
    state: TrainState, batch: Batch, *, model: nn.Module, optimizer: optax.GradientTransformation,
    schedule: optax.Schedule, label_smoothing: float, accum_steps: int = 1,
    micro_sharding: NamedSharding | None = None, guided_alignment_weight: float = 0.0,
) -> tuple[TrainState, Metrics]:
  """One optimizer update on `batch`; returns the new state and float32 scalar metrics.

  Metrics: sums 'loss', 'nll', 'correct', 'num_tokens' over the batch's real target tokens, and
  'grad_norm' (global norm before clipping) and 'learning_rate' of this update. With
  `guided_alignment_weight` > 0 also 'alignment_loss', the sum of guided alignment's cross
  entropy (unweighted; 'loss' stays the translation loss alone).
  """
  dropout_key = jax.random.fold_in(state.rng, state.step)
  num_tokens = jnp.sum(batch["targets"] != 0).astype(jnp.float32)

  def loss_fn(params, micro_batch, key):
    logits = model.apply(
        {"params": params}, **micro_batch, train=True, rngs={"dropout": key})  # [B, T, V]
    sums = loss_lib.loss_sums(logits, micro_batch["targets"], label_smoothing)
    return sums.loss / num_tokens, sums

  def guided_loss_fn(params, micro_batch, key):
    model_inputs = {k: v for k, v in micro_batch.items() if k != ALIGNMENT_KEY}
    # [B, T, V], [B, T, S]
    logits, attention = logits_and_alignment(
        model, {"params": params}, **model_inputs, train=True, rngs={"dropout": key})
    sums = loss_lib.loss_sums(logits, micro_batch["targets"], label_smoothing)
    alignment = loss_lib.alignment_loss_sum(attention, micro_batch[ALIGNMENT_KEY])
    objective = (sums.loss + guided_alignment_weight * alignment) / num_tokens
    return objective, (sums, alignment)

  zero_sums = loss_lib.LossSums(*(jnp.zeros((), jnp.float32) for _ in range(4)))
  if guided_alignment_weight > 0:
    grad_fn = jax.grad(guided_loss_fn, has_aux=True)
    zero_aux = (zero_sums, jnp.zeros((), jnp.float32))
  else:
    grad_fn, zero_aux = jax.grad(loss_fn, has_aux=True), zero_sums
  if accum_steps == 1:
    grads, aux = grad_fn(state.params, batch, dropout_key)
  else:
    grads, aux = _accumulate(grad_fn, state.params, batch, dropout_key, accum_steps,
                             micro_sharding, zero_aux)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if guided_alignment_weight > 0:
    sums, alignment = aux
    metrics = dict(sums._asdict(), alignment_loss=alignment)
  else:
    metrics = dict(aux._asdict())
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def _accumulate(grad_fn, params, batch, key, accum_steps, micro_sharding, zero_aux):
  """Sums gradients and loss sums (`zero_aux`'s structure) over `accum_steps` micro-batches
  with a `lax.scan`.

  Micro-batch i takes rows i, i + k, i + 2k, ... so each device holds an equal share of every
  micro-batch (a contiguous split would put each micro-batch on a few devices only).
  """

  def split(x):  # [B, L, ...] -> [k, B / k, L, ...]
    micro = jnp.swapaxes(x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]), 0, 1)
    if micro_sharding is not None:
      micro = jax.lax.with_sharding_constraint(micro, micro_sharding)
    return micro

  micro_batches = jax.tree.map(split, batch)

  def body(carry, inputs):
    index, micro_batch = inputs
    grads, sums = grad_fn(params, micro_batch, jax.random.fold_in(key, index))
    return jax.tree.map(jnp.add, carry, (grads, sums)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  (grads, aux), _ = jax.lax.scan(
      body, (zeros, zero_aux), (jnp.arange(accum_steps), micro_batches))
  return grads, aux


def eval_step(params: Any, batch: Batch, *, model: nn.Module, label_smoothing: float) -> Metrics:
  """Loss sums of `batch` without dropout ('loss', 'nll', 'correct', 'num_tokens')."""
  logits = model.apply({"params": params}, **batch, train=False)  # [B, T, V]
  return dict(loss_lib.loss_sums(logits, batch["targets"], label_smoothing)._asdict())


def jit_train_step(
    mesh: Mesh, state_shardings: TrainState, *, model: nn.Module,
    optimizer: optax.GradientTransformation, schedule: optax.Schedule, label_smoothing: float,
    accum_steps: int = 1, guided_alignment_weight: float = 0.0,
):
  """`train_step` jitted over `mesh`: state in and out with `state_shardings` (donated), the
  batch split on 'data', metrics replicated."""
  step = functools.partial(
      train_step, model=model, optimizer=optimizer, schedule=schedule,
      label_smoothing=label_smoothing, accum_steps=accum_steps,
      micro_sharding=sharding_lib.micro_batch_sharding(mesh),
      guided_alignment_weight=guided_alignment_weight)
  return jax.jit(
      _with_activation_sharding(step, mesh),
      in_shardings=(state_shardings, sharding_lib.batch_sharding(mesh)),
      out_shardings=(state_shardings, sharding_lib.replicated(mesh)),
      donate_argnums=0)


def jit_eval_step(mesh: Mesh, param_shardings: Any, *, model: nn.Module, label_smoothing: float):
  """`eval_step` jitted over `mesh` (params as trained, batch split on 'data')."""
  step = functools.partial(eval_step, model=model, label_smoothing=label_smoothing)
  return jax.jit(
      _with_activation_sharding(step, mesh),
      in_shardings=(param_shardings, sharding_lib.batch_sharding(mesh)),
      out_shardings=sharding_lib.replicated(mesh))


def _with_activation_sharding(step, mesh: Mesh):
  """`step`, traced with the model's activations split on 'data' along the batch."""

  @functools.wraps(step)
  def traced(*args):
    with sharding_lib.split_batch_over(mesh):
      return step(*args)

  return traced
