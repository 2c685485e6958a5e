"""The one recipe of the train step: what `train.py` runs, what `plan` compiles, what tests build.

    recipe = build(model_config, exp.train, rows=exp.data.global_rows, length=exp.data.max_length)
    state = recipe.init_state()                       # placed by recipe.shardings
    state, metrics = recipe.train_step(state, recipe.place_batch(local_rows))
    lowered = recipe.lower()                          # on abstract inputs: nothing allocated

`build` makes the model, the optimizer and its schedule, the mesh, the train state's shardings
(data parallel or FSDP, `runtime.sharding`), the batch sharding and the jitted step, traced with
the model's activations split over the mesh (`sharding.split_batch_over`, inside
`steps.jit_train_step`). The trainer and `planning.plan_train` both call it, so the program
`plan` compiles for a topology is the program training runs there; a test compares the two
lowered programs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from flax_transformer.config import Experiment, TrainConfig
from flax_transformer.data.pipeline import ALIGNMENT_KEY, TRAIN_KEYS
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.transformer import Transformer
from flax_transformer.runtime import sharding
from flax_transformer.training import optim, steps
from flax_transformer.training import state as state_lib
from flax_transformer.training.state import TrainState

# (state, batch) -> (state, metrics); the state is donated.
TrainStep = Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class TrainRecipe:
  """Everything a train step needs, built once by `build`."""

  model: Transformer
  train: TrainConfig
  optimizer: optax.GradientTransformation
  schedule: optax.Schedule
  mesh: Mesh  # One axis, 'data', over the devices.
  abstract_state: TrainState  # jax.ShapeDtypeStruct leaves, as `shardings` places them.
  shardings: TrainState  # A NamedSharding per leaf of the state.
  batch_sharding: NamedSharding  # Rows of every batch array split over 'data'.
  train_step: TrainStep  # `steps.train_step`, jitted over `mesh`.
  rows: int  # Rows of one global batch.
  length: int  # Tokens per row.

  @property
  def parameter_count(self) -> int:
    """Parameters of the model (all processes, all shards)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(self.abstract_state.params))

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """One global batch as int32 [rows, length] `ShapeDtypeStruct`s, placed as the step takes
    it: what the data pipeline's packed rows become (`pipeline.TRAIN_KEYS`), plus, with guided
    alignment, 'alignment' bool [rows, length, length]."""
    batch = {key: jax.ShapeDtypeStruct((self.rows, self.length), jnp.int32,
                                       sharding=self.batch_sharding) for key in TRAIN_KEYS}
    if self.guided_alignment:
      batch[ALIGNMENT_KEY] = jax.ShapeDtypeStruct(
          (self.rows, self.length, self.length), jnp.bool_, sharding=self.batch_sharding)
    return batch

  @property
  def guided_alignment(self) -> bool:
    """Whether the step trains with guided alignment: its batches need 'alignment' arrays
    (`pipeline.train_iterator(..., alignments=True)`)."""
    return self.train.guided_alignment_weight > 0

  def lower(self, state: TrainState | None = None,
            batch: Mapping[str, jax.Array] | None = None) -> jax.stages.Lowered:
    """The step lowered for `state` and `batch` (default: the abstract ones, allocating
    nothing)."""
    state = self.abstract_state if state is None else state
    return self.train_step.lower(state, self.abstract_batch() if batch is None else batch)

  def init_state(self) -> TrainState:
    """A fresh state (parameters and dropout key from config.train.seed), created in place."""
    return state_lib.create_train_state(self.model, self.optimizer, self.shardings,
                                        seed=self.train.seed)

  def state_from_params(self, params: Any) -> TrainState:
    """A state at step 0 around `params` (placed by `shardings.params`): fine-tuning."""
    return state_lib.state_from_params(params, self.optimizer, self.shardings,
                                       seed=self.train.seed)

  def place_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows of a batch as global arrays split over 'data' (multi-host safe)."""
    return sharding.global_batch(local_batch, self.batch_sharding)

  @functools.cached_property
  def eval_step(self) -> Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]]:
    """`steps.eval_step` jitted over the mesh, parameters as the train state holds them."""
    return steps.jit_eval_step(self.mesh, self.shardings.params, model=self.model,
                               label_smoothing=self.train.label_smoothing)


def build(model_config: ModelConfig, train: TrainConfig, *, rows: int, length: int,
          devices: Sequence[jax.Device] | None = None) -> TrainRecipe:
  """The train step of `model_config` trained as `train` says, on [rows, length] batches, over
  a mesh of `devices` (default: every device of every process).

  Shardings are derived without allocating (`jax.eval_shape`); nothing is compiled here.
  """
  model = Transformer(model_config)
  optimizer, schedule = optim.make_optimizer(train, model_config.emb_dim)
  mesh = sharding.make_mesh(None if devices is None else list(devices))
  abstract, shardings = state_lib.state_shardings(
      model, optimizer, mesh, fsdp=train.fsdp, seed=train.seed)
  placed = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        abstract, shardings)
  train_step = steps.jit_train_step(
      mesh, shardings, model=model, optimizer=optimizer, schedule=schedule,
      label_smoothing=train.label_smoothing, accum_steps=train.grad_accum_steps,
      guided_alignment_weight=train.guided_alignment_weight)
  return TrainRecipe(model=model, train=train, optimizer=optimizer, schedule=schedule,
                     mesh=mesh, abstract_state=placed, shardings=shardings,
                     batch_sharding=sharding.batch_sharding(mesh), train_step=train_step,
                     rows=rows, length=length)


def from_experiment(exp: Experiment, *, vocab_size: int | None = None,
                    devices: Sequence[jax.Device] | None = None) -> TrainRecipe:
  """`build` for an experiment config: its model (for `vocab_size` pieces, default
  config.data.vocab_size), config.train, and its global batch (batch_tokens // max_length rows
  of max_length)."""
  model_config = exp.model if vocab_size is None else exp.model_config(vocab_size)
  return build(model_config, exp.train, rows=exp.data.global_rows, length=exp.data.max_length,
               devices=devices)
