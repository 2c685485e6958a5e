"""Learning-rate schedules and the optax optimizer of the training job.

Every schedule maps optax's update count c (0 for the first update) to the learning rate of
update number s = c + 1, so "step" below counts updates from 1 as the paper does ("step_num"):
the first update never gets a zero learning rate.

Schedules (`config.train.schedule`):
  rsqrt          the paper's: lr = learning_rate * D^-0.5 * min(s^-0.5, s * warmup^-1.5),
                 D = d_model; learning_rate = 1.0 reproduces the paper (peak 7.0e-4 at D 512,
                 warmup 4000).
  warmup_rsqrt   lr = learning_rate * min(s / warmup, sqrt(warmup / s)): linear warmup to
                 learning_rate at s = warmup, then inverse square root decay.
  warmup_cosine  linear warmup to learning_rate, then cosine decay to
                 learning_rate * end_learning_rate_factor at s = num_train_steps.
  constant       linear warmup to learning_rate, then constant.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("rsqrt", "warmup_rsqrt", "warmup_cosine", "constant")
OPTIMIZERS = ("adam", "adamw")


def make_schedule(
    name: str,
    *,
    learning_rate: float,
    warmup_steps: int,
    num_train_steps: int,
    d_model: int,
    end_learning_rate_factor: float = 0.0,
) -> optax.Schedule:
  """The schedule `name` (see the module docstring) as a function of optax's update count."""
  if name not in SCHEDULES:
    raise ValueError(f"config.train.schedule must be one of {SCHEDULES}, got {name!r}.")
  warmup = float(max(warmup_steps, 1))

  def schedule(count: jax.Array) -> jax.Array:
    step = jnp.asarray(count, jnp.float32) + 1.0
    warmup_fraction = jnp.minimum(step / warmup, 1.0)
    if name == "rsqrt":
      return learning_rate * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup**-1.5)
    if name == "warmup_rsqrt":
      return learning_rate * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
    if name == "constant":
      return learning_rate * warmup_fraction
    decay_steps = max(num_train_steps - warmup_steps, 1)
    progress = jnp.clip((step - warmup_steps) / decay_steps, 0.0, 1.0)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    end = end_learning_rate_factor
    decayed = learning_rate * (end + (1.0 - end) * cosine)
    return jnp.where(step <= warmup_steps, learning_rate * warmup_fraction, decayed)

  return schedule


def make_optimizer(train: Any, d_model: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Adam or AdamW with the configured schedule, after optional global-norm clipping.

  Args:
    train: the validated `config.train` group (`flax_transformer.config.TrainConfig`).
    d_model: the model's D, used by the `rsqrt` schedule.

  Returns:
    (optimizer, schedule). AdamW decays only matrices (ndim >= 2), never biases, LayerNorm or
    T5's relative-position tables (`relative_attention_bias`, [buckets, N]: biases, which
    Hugging Face's Trainer does not decay either).
  """
  schedule = make_schedule(
      train.schedule, learning_rate=train.learning_rate, warmup_steps=train.warmup_steps,
      num_train_steps=train.num_train_steps, d_model=d_model,
      end_learning_rate_factor=train.end_learning_rate_factor)
  if train.optimizer == "adamw":
    optimizer = optax.adamw(
        schedule, b1=train.adam_b1, b2=train.adam_b2, eps=train.adam_eps,
        weight_decay=train.weight_decay, mask=_matrices)
  else:
    optimizer = optax.adam(schedule, b1=train.adam_b1, b2=train.adam_b2, eps=train.adam_eps)
  if train.grad_clip_norm > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), optimizer)
  return optimizer, schedule


def _matrices(params: Any) -> Any:
  """True at each parameter weight decay applies to (make_optimizer's rule)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, p: p.ndim >= 2 and not any(
          getattr(key, "key", None) == "relative_attention_bias" for key in path), params)
