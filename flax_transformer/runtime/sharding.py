"""The one place where sharding is decided: the mesh and its axis name, the logical-to-mesh axis
rules, where activations are split while a step is traced, and multi-host batch assembly.

Training, serving, planning and the model all read their mesh axis and rules from here; no other
module names a mesh axis. The mesh has one axis, `DATA_AXIS` ('data'): over every device of every
process for training (`make_mesh`), over this process's devices for serving (`local_mesh`). The
model names the axes of its parameters logically ('vocab', 'embed', 'heads', 'kv', 'mlp') and
this module maps them onto the mesh:

* data parallel (`fsdp=False`): parameters and optimizer state replicated, batch split on 'data';
* FSDP (`fsdp=True`): each parameter and its optimizer moments are also split on 'data' along
  their first logical axis in `FSDP_RULES` order whose size the device count divides (a dimension
  that does not divide stays whole, so every parameter of any model size is placed).

Shardings are derived without allocating: `jax.eval_shape(init)` -> `nn.get_partition_spec` ->
`nn.logical_to_mesh_sharding`. While a train or eval step is traced (`split_batch_over`), the
model's activations are constrained to rows split over 'data' (`batch_split`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"

# Logical parameter axis -> mesh axis. Order matters: a parameter takes the first rule whose mesh
# axis it has not used yet, so [embed, mlp] is split on embed and a [mlp] bias on mlp.
FSDP_RULES = (
    ("embed", DATA_AXIS),
    ("mlp", DATA_AXIS),
    ("vocab", DATA_AXIS),
    ("heads", DATA_AXIS),
    ("kv", DATA_AXIS),
)
REPLICATED_RULES = tuple((name, None) for name, _ in FSDP_RULES)


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh with axis 'data' over `devices` (default: all devices of all processes)."""
  devices = jax.devices() if devices is None else devices
  if devices == jax.devices():
    return jax.make_mesh(
        (len(devices),), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def local_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh with axis 'data' over this process's devices (default: all of them), for
  serving; the same object for the same devices, so Translators on it share compiled programs."""
  return _local_mesh(tuple(jax.local_devices() if devices is None else devices))


@functools.cache
def _local_mesh(devices: tuple[jax.Device, ...]) -> Mesh:
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows of every batch array split over 'data'; the other dimensions whole."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def micro_batch_sharding(mesh: Mesh) -> NamedSharding:
  """Gradient accumulation's [k, B / k, ...] micro-batches: each one's rows split over 'data'."""
  return NamedSharding(mesh, PartitionSpec(None, DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding that keeps a full copy on every device of `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def logical_shardings(boxed_abstract: Any, mesh: Mesh, fsdp: bool) -> Any:
  """NamedShardings for a tree whose leaves carry flax logical-axis metadata (or not: replicated).

  Args:
    boxed_abstract: the output of `jax.eval_shape` over an init that returns boxed parameters.
    mesh: the mesh from `make_mesh`.
    fsdp: split parameters over 'data' (True) or replicate them (False).
  """
  specs = nn.get_partition_spec(boxed_abstract)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, FSDP_RULES if fsdp else REPLICATED_RULES)
  shapes = nn.meta.unbox(boxed_abstract)
  return jax.tree.map(lambda s, x: _divisible(s, x.shape, mesh), shardings, shapes)


def _divisible(sharding: NamedSharding, shape: tuple[int, ...], mesh: Mesh) -> NamedSharding:
  """`sharding` with every mesh axis dropped from dimensions it does not divide evenly."""
  spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
  for dim, axis in enumerate(spec):
    if axis is not None and shape[dim] % mesh.shape[axis]:
      spec[dim] = None
  return NamedSharding(mesh, PartitionSpec(*spec))


def match_by_path(tree: Any, reference: Mapping[tuple, NamedSharding], default: Any) -> Any:
  """Shardings for `tree` (e.g. optimizer state) from a {param path: sharding} table.

  A leaf whose key path ends with a parameter's path and has that parameter's shape takes the
  parameter's sharding (Adam's mu and nu mirror the parameters); any other leaf gets `default`.
  """

  def pick(path: tuple, leaf: Any) -> Any:
    keys = tuple(_key_name(k) for k in path)
    for start in range(len(keys)):
      found = reference.get(keys[start:])
      if found is not None and found[1] == tuple(leaf.shape):
        return found[0]
    return default

  return jax.tree_util.tree_map_with_path(pick, tree)


def path_table(shardings: Any, shapes: Any) -> dict[tuple, tuple[NamedSharding, tuple]]:
  """{key path of each leaf: (its sharding, its shape)} for `match_by_path`."""
  table = {}
  flat_shardings = jax.tree_util.tree_leaves_with_path(shardings)
  for (path, sharding), shape in zip(flat_shardings, jax.tree.leaves(shapes), strict=True):
    table[tuple(_key_name(k) for k in path)] = (sharding, tuple(shape.shape))
  return table


def _key_name(key: Any) -> Any:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return getattr(key, attr)
  return str(key)


def global_batch(local_batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict:
  """Assembles each process's rows into global arrays split over 'data' (multi-host safe).

  Every process passes its own rows (global rows / process count, in process order); on one
  process this is a sharded `device_put`.
  """
  return {
      name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
      for name, value in local_batch.items()
  }


# ------------------------------------------------------------------- activations while tracing
# Where activations' batch dimension is split while a step is traced: a mesh (its 'data' axis),
# set by `split_batch_over` (training's steps); None elsewhere, and then `batch_split` does nothing.
_BATCH_SPLIT: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar(
    "flax_transformer_batch_split", default=None)


@contextlib.contextmanager
def split_batch_over(mesh: Mesh) -> Iterator[None]:
  """Inside: `batch_split` constrains activations to rows split over `mesh`'s 'data' axis."""
  token = _BATCH_SPLIT.set(mesh)
  try:
    yield
  finally:
    _BATCH_SPLIT.reset(token)


def batch_split(x: jax.Array) -> jax.Array:
  """`x` [B, ...] constrained to rows split over the 'data' axis of `split_batch_over`'s mesh,
  the other dimensions whole; `x` itself outside it.

  With FSDP the weights are split over the same mesh axis as the batch, and without this XLA
  may meet a [B, T, D] x [D, F] product by gathering every row's activations onto every chip
  (all B rows of the [B, T, V] logits) instead of the weights, which takes several times the
  memory per chip (big on a v5e-8: 10.58 GiB per chip without, 3.58 GiB with;
  docs/performance.md, "Measured design choices").
  """
  mesh = _BATCH_SPLIT.get()
  if mesh is None:
    return x
  return jax.lax.with_sharding_constraint(x, batch_sharding(mesh))
