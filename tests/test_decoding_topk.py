"""`decoding.topk`: the blocked top-k equals a full sort."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding import (
  topk,
)


@pytest.mark.parametrize("vocab", [1000, 1009, 8000])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_blocked_top_k_equals_a_full_sort(vocab, k):
  # 1000 = 20 blocks of 50; 1009 (prime) = 15 blocks of 64 and a 49-column tail.
  x = np.random.default_rng(vocab + k).normal(size=(7, vocab)).astype(np.float32)
  x[0, :] = -np.inf  # A fully masked row.
  x[1, 3::5] = 9.0  # Many ties above everything else.
  x[2, -4:] = 50.0 + np.arange(4)  # The best values in the tail.
  values, indices = jax.jit(topk.top_k, static_argnums=1)(jnp.asarray(x), k)
  np.testing.assert_array_equal(values, -np.sort(-x, axis=1)[:, :k])
  np.testing.assert_array_equal(np.take_along_axis(x, np.asarray(indices), axis=1), values)
  assert all(len(set(row)) == k for row in np.asarray(indices).tolist())
