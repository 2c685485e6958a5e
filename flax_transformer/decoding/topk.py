"""Top-k over the vocabulary, fast on CPU: the searches' one selection primitive."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def top_k(x: Array, k: int) -> tuple[Array, Array]:
  """The k largest values of every row of x [R, V] and their int32 indices, largest first.

  Same result as `lax.top_k` (up to the order of ties), several times faster on CPU for small k
  and large V: XLA's top-k and argmax are scalar loops there, while max-reductions vectorize. The
  k best values lie in the k blocks (of about 64 columns) with the largest maxima, so one max
  per block, a top-k over the block maxima and a top-k over those k blocks suffice.
  """
  rows, size = x.shape
  block = _block_size(size)
  blocks = size // block
  if blocks <= 2 * k:
    values, indices = lax.top_k(x, k)
    return values, indices.astype(jnp.int32)
  main = blocks * block  # Columns past `main` (fewer than one block) are always candidates.
  grouped = x[:, :main].reshape(rows, blocks, block)
  _, best_blocks = lax.top_k(jnp.max(grouped, axis=-1), k)  # [R, k]
  candidates = jnp.take_along_axis(grouped, best_blocks[..., None], axis=1).reshape(rows, -1)
  candidate_ids = (best_blocks[..., None] * block + jnp.arange(block)).reshape(rows, -1)
  if main < size:
    candidates = jnp.concatenate([candidates, x[:, main:]], axis=1)
    tail_ids = jnp.broadcast_to(jnp.arange(main, size), (rows, size - main))
    candidate_ids = jnp.concatenate([candidate_ids, tail_ids], axis=1)
  values, picked = lax.top_k(candidates, k)
  return values, jnp.take_along_axis(candidate_ids, picked, axis=1).astype(jnp.int32)


def _block_size(size: int) -> int:
  """A block length near 64 that divides `size` when one in [48, 96] does, else 64."""
  divisors = [b for b in range(48, 97) if size % b == 0]
  return min(divisors, key=lambda b: abs(b - 64)) if divisors else 64
