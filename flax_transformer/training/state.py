"""The train state (params, optimizer state, step, RNG) and its sharded initialisation."""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from flax_transformer.runtime import sharding as sharding_lib


@flax.struct.dataclass
class TrainState:
  """Everything a train step reads and writes; a pytree, donated to the jitted step."""

  step: jax.Array  # int32 []: updates applied so far.
  params: Any  # The model's params (float32 master weights), unboxed.
  opt_state: optax.OptState
  rng: jax.Array  # uint32 [2]: base dropout key; step s uses fold_in(rng, s).


def abstract_state(
    model: nn.Module, optimizer: optax.GradientTransformation, seed: int, max_length: int
) -> tuple[TrainState, Any]:
  """(unboxed abstract TrainState, boxed abstract params), computed without allocating."""
  init = _init_fn(model, optimizer, max_length)
  return jax.eval_shape(init, jax.random.PRNGKey(seed)), abstract_params(model, seed, max_length)


def abstract_params(model: nn.Module, seed: int = 0, max_length: int = 8) -> Any:
  """The model's parameters as boxed `jax.ShapeDtypeStruct`s (logical axes kept), unallocated."""
  return jax.eval_shape(lambda: _init_params(model, seed, max_length))


def state_shardings(
    model: nn.Module, optimizer: optax.GradientTransformation, mesh: Mesh, *, fsdp: bool,
    seed: int = 0, max_length: int = 8,
) -> tuple[TrainState, TrainState]:
  """(abstract TrainState, TrainState of NamedShardings) for `mesh`.

  Parameters follow the model's logical axis names through `sharding.FSDP_RULES` (or are
  replicated without FSDP); optimizer-state leaves that mirror a parameter share its sharding;
  the step, the RNG and scalars are replicated.
  """
  abstract, boxed_params = abstract_state(model, optimizer, seed, max_length)
  param_shardings = sharding_lib.logical_shardings(boxed_params, mesh, fsdp)
  table = sharding_lib.path_table(param_shardings, abstract.params)
  replicated = sharding_lib.replicated(mesh)
  shardings = TrainState(
      step=replicated,
      params=param_shardings,
      opt_state=sharding_lib.match_by_path(abstract.opt_state, table, replicated),
      rng=replicated)
  return abstract, shardings


def create_train_state(
    model: nn.Module, optimizer: optax.GradientTransformation, shardings: TrainState, *,
    seed: int, max_length: int = 8,
) -> TrainState:
  """Initialises the state directly into `shardings` (no full copy on any one device).

  `seed` fixes both the parameter initialisation and the dropout key.
  """
  init = jax.jit(_init_fn(model, optimizer, max_length), out_shardings=shardings)
  return init(jax.random.PRNGKey(seed))


def state_from_params(params: Any, optimizer: optax.GradientTransformation,
                      shardings: TrainState, *, seed: int) -> TrainState:
  """A state at step 0 around given `params` (already placed by `shardings.params`): a fresh
  optimizer state, and the dropout key `create_train_state` would draw for `seed`."""
  dropout_key = jax.random.split(jax.random.PRNGKey(seed))[1]

  def init(params: Any, key: jax.Array) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), rng=key)

  return jax.jit(init, out_shardings=shardings)(params, dropout_key)


def _init_params(model: nn.Module, seed: int, max_length: int) -> Any:
  params_key = jax.random.split(jax.random.PRNGKey(seed))[0]
  ids = jnp.ones((1, max_length), jnp.int32)  # [B, S] and [B, T]
  return model.init(params_key, ids, ids)["params"]


def _init_fn(model: nn.Module, optimizer: optax.GradientTransformation, max_length: int):
  def init(key: jax.Array) -> TrainState:
    params_key, dropout_key = jax.random.split(key)
    ids = jnp.ones((1, max_length), jnp.int32)  # [B, S] and [B, T]
    params = nn.meta.unbox(model.init(params_key, ids, ids)["params"])
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
        rng=dropout_key)

  return init
