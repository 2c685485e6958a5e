"""The pure train and eval steps, and their `jax.jit` over the mesh with explicit shardings.

Batches are dicts of int32 [B, L] arrays with the model's keyword names ('inputs', 'targets',
and for packed train rows the segment ids and positions). B is the global batch; it is split
over the mesh's 'data' axis, and with gradient accumulation into `accum_steps` micro-batches of
B / accum_steps rows, run one after another so that activations of one micro-batch are alive at
a time. The loss is normalised by the real target tokens of the whole global batch, so k
micro-batches give the gradient of one step on their concatenation.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from flax_transformer.runtime import sharding as sharding_lib
from flax_transformer.training import loss as loss_lib
from flax_transformer.training.state import TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


def train_step(
    state: TrainState, batch: Batch, *, model: nn.Module, optimizer: optax.GradientTransformation,
    schedule: optax.Schedule, label_smoothing: float, accum_steps: int = 1,
    micro_sharding: NamedSharding | None = None,
) -> tuple[TrainState, Metrics]:
  """One optimizer update on `batch`; returns the new state and float32 scalar metrics.

  Metrics: sums 'loss', 'nll', 'correct', 'num_tokens' over the batch's real target tokens, and
  'grad_norm' (global norm before clipping) and 'learning_rate' of this update.
  """
  dropout_key = jax.random.fold_in(state.rng, state.step)
  num_tokens = jnp.sum(batch["targets"] != 0).astype(jnp.float32)

  def loss_fn(params, micro_batch, key):
    logits = model.apply(
        {"params": params}, **micro_batch, train=True, rngs={"dropout": key})  # [B, T, V]
    sums = loss_lib.loss_sums(logits, micro_batch["targets"], label_smoothing)
    return sums.loss / num_tokens, sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, dropout_key)
  else:
    grads, sums = _accumulate(grad_fn, state.params, batch, dropout_key, accum_steps,
                              micro_sharding)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums._asdict())
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def _accumulate(grad_fn, params, batch, key, accum_steps, micro_sharding):
  """Sums gradients and loss sums over `accum_steps` micro-batches with a `lax.scan`.

  Micro-batch i takes rows i, i + k, i + 2k, ... so each device holds an equal share of every
  micro-batch (a contiguous split would put each micro-batch on a few devices only).
  """

  def split(x):  # [B, L] -> [k, B / k, L]
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
  zero_sums = loss_lib.LossSums(*(jnp.zeros((), jnp.float32) for _ in range(4)))
  (grads, sums), _ = jax.lax.scan(
      body, (zeros, zero_sums), (jnp.arange(accum_steps), micro_batches))
  return grads, sums


def eval_step(params: Any, batch: Batch, *, model: nn.Module, label_smoothing: float) -> Metrics:
  """Loss sums of `batch` without dropout ('loss', 'nll', 'correct', 'num_tokens')."""
  logits = model.apply({"params": params}, **batch, train=False)  # [B, T, V]
  return dict(loss_lib.loss_sums(logits, batch["targets"], label_smoothing)._asdict())


def jit_train_step(
    mesh: Mesh, state_shardings: TrainState, *, model: nn.Module,
    optimizer: optax.GradientTransformation, schedule: optax.Schedule, label_smoothing: float,
    accum_steps: int = 1,
):
  """`train_step` jitted over `mesh`: state in and out with `state_shardings` (donated), the
  batch split on 'data', metrics replicated."""
  step = functools.partial(
      train_step, model=model, optimizer=optimizer, schedule=schedule,
      label_smoothing=label_smoothing, accum_steps=accum_steps,
      micro_sharding=sharding_lib.micro_batch_sharding(mesh))
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
