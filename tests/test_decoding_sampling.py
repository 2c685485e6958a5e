"""`decoding.sampling`: greedy decoding against NumPy greedy, and sampling against the
tempered distribution (binomial confidence bounds) and per-row keys."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding import (
  SearchProblem,
  greedy_search,
  sample,
)

from search_toys import (
  EOS,
  FIXED_LOGITS,
  NUM_HASHES,
  PAD,
  A,
  B,
  HashToy,
  fixed_step,
  hash_token,
  log_softmax,
  numpy_greedy,
)


@pytest.mark.parametrize("limits", [{}, dict(min_length=3, max_lengths=[2, 4, 9])])
def test_greedy_equals_numpy_greedy(limits):
  toy = HashToy(seed=13, batch=3, max_len=6, eos_logits=1.0)
  kwargs = dict(limits)
  if "max_lengths" in kwargs:
    kwargs["max_lengths"] = jnp.asarray(kwargs["max_lengths"], jnp.int32)
  sequences, scores = greedy_search(SearchProblem(
      toy.step, toy.initial_state(), batch_size=3, max_decode_len=6, eos_id=EOS, **kwargs))
  for b in range(3):
    caps = limits.get("max_lengths", [None] * 3)
    expected, total = numpy_greedy(toy, b, limits.get("min_length", 0), caps[b])
    np.testing.assert_array_equal(sequences[b], expected)
    np.testing.assert_allclose(scores[b], total, rtol=1e-6)


def test_sampling_with_top_k_one_equals_greedy():
  toy = HashToy(seed=17, batch=4, max_len=6, eos_logits=0.5)
  common = dict(batch_size=4, max_decode_len=6, eos_id=EOS, min_length=1)
  greedy = greedy_search(SearchProblem(toy.step, toy.initial_state(), **common))
  sampled = sample(SearchProblem(toy.step, toy.initial_state(), **common), jax.random.key(0),
                   top_k=1, temperature=0.7)
  np.testing.assert_array_equal(sampled[0], greedy[0])
  np.testing.assert_allclose(sampled[1], greedy[1], rtol=1e-6)


def _first_token_counts(rows, **settings):
  state = {"unused": jnp.zeros((rows,), jnp.int32)}
  problem = SearchProblem(fixed_step, state, batch_size=rows, max_decode_len=1, eos_id=EOS)
  sequences, scores = sample(problem, jax.random.key(42), **settings)
  first = np.asarray(sequences[:, 0])
  np.testing.assert_allclose(scores, log_softmax(FIXED_LOGITS)[first], rtol=1e-5)
  return np.bincount(first, minlength=6)


def _assert_frequencies(counts, probs):
  """Each token's frequency within 5 binomial standard deviations of its probability."""
  rows = counts.sum()
  tolerance = 5 * np.sqrt(probs * (1 - probs) / rows) + 1e-12
  assert (np.abs(counts / rows - probs) <= tolerance).all(), (counts / rows, probs)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampling_follows_the_tempered_distribution_without_padding(temperature):
  counts = _first_token_counts(20000, temperature=temperature)
  tempered = np.where(np.arange(6) == PAD, 0.0, np.exp(FIXED_LOGITS / temperature))
  _assert_frequencies(counts, tempered / tempered.sum())


def test_top_p_and_top_k_restrict_the_support():
  # Emittable probabilities (PAD excluded): EOS .05, A .5, B .3, 4 .15, 5 ~0.
  counts = _first_token_counts(20000, top_p=0.75)
  assert set(np.flatnonzero(counts)) == {A, B}  # .5 < .75 <= .5 + .3
  _assert_frequencies(counts, np.array([0, 0, 0.5, 0.3, 0, 0]) / 0.8)
  counts = _first_token_counts(20000, top_k=3)
  assert set(np.flatnonzero(counts)) == {A, B, 4}
  _assert_frequencies(counts, np.array([0, 0, 0.5, 0.3, 0.15, 0]) / 0.95)


class _SharedTableToy:
  """Logits from one table shared by all rows, indexed by a per-row running hash: a row's
  logits depend on its own initial hash and tokens alone, so any row can be run by itself."""

  def __init__(self, seed, vocab=6):
    rng = np.random.default_rng(seed)
    self.table = jnp.asarray(rng.normal(size=(NUM_HASHES, vocab)).astype(np.float32))

  def step(self, ids, state):
    new_hash = hash_token(state["hash"], ids[:, 0])
    return self.table[new_hash], {"hash": new_hash}


def _sample_rows(toy, hashes, keys, **kwargs):
  state = {"hash": jnp.asarray(hashes, jnp.int32)}
  return sample(SearchProblem(toy.step, state, batch_size=len(hashes), max_decode_len=8,
                              eos_id=EOS), keys, **kwargs)


def test_per_row_keys_make_each_rows_sample_independent_of_the_other_rows():
  toy = _SharedTableToy(seed=31)
  base = jax.random.key(9)
  hashes = np.array([3, 17, 3, 25, 8])
  lines = np.array([100, 101, 102, 103, 104], np.uint32)
  keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(lines)
  together = _sample_rows(toy, hashes, keys, top_k=4)
  # Each row alone (batch of one), and all rows in reverse order, give the same samples.
  for row in range(len(hashes)):
    alone = _sample_rows(toy, hashes[row:row + 1], keys[row:row + 1], top_k=4)
    np.testing.assert_array_equal(alone[0][0], together[0][row])
    np.testing.assert_allclose(alone[1][0], together[1][row], rtol=1e-6)
  reverse = _sample_rows(toy, hashes[::-1], keys[::-1], top_k=4)
  np.testing.assert_array_equal(reverse[0][::-1], together[0])
  # Rows 0 and 2 start alike but draw from different keys, so their samples differ; raw key
  # data gives the same as typed keys; one key for the batch still works as before.
  assert not np.array_equal(together[0][0], together[0][2])
  raw = _sample_rows(toy, hashes, jax.random.key_data(keys), top_k=4)
  np.testing.assert_array_equal(raw[0], together[0])
  shared = _sample_rows(toy, hashes, base, top_k=4)
  assert shared[0].shape == together[0].shape
  with pytest.raises(ValueError, match=r"one key per row \(5,\)"):
    _sample_rows(toy, hashes, keys[:3])


def test_per_row_keys_sample_the_tempered_distribution():
  rows = 20000
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(4), i))(jnp.arange(rows))
  state = {"unused": jnp.zeros((rows,), jnp.int32)}
  problem = SearchProblem(fixed_step, state, batch_size=rows, max_decode_len=1, eos_id=EOS)
  sequences, _ = sample(problem, keys, temperature=0.5)
  counts = np.bincount(np.asarray(sequences[:, 0]), minlength=6)
  tempered = np.where(np.arange(6) == PAD, 0.0, np.exp(FIXED_LOGITS / 0.5))
  _assert_frequencies(counts, tempered / tempered.sum())
