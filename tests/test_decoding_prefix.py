"""The target prefix of the searches (`decoding.search`, "Target prefix"): every hypothesis
starts with its row's prefix, the prefix adds nothing to the score (checked against a float64
NumPy sum of the teacher-forced log-probabilities), rows do not depend on each other, and
prefixes of any length share one program. CTranslate2's `target_prefix` is the anchor of the
beam search's rules: tests/test_interop_ctranslate2.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import decoding
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.decoding import bridge, search
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.transformer import Transformer

import random_workdir

V, L = 37, 14
INPUTS = np.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, EOS_ID, 0, 0, 0], [12, 13, 14, EOS_ID, 0, 0],
                   [15, EOS_ID, 0, 0, 0, 0]], np.int32)
# Prefixes of 3, 0 (none), 1 and 5 tokens, zeros after.
PREFIX = np.zeros((4, L), np.int32)
PREFIX[0, :3] = [20, 21, 22]
PREFIX[2, :1] = [23]
PREFIX[3, :5] = [24, 25, 26, 27, 28]
LENGTHS = (PREFIX != PAD_ID).sum(axis=1)


@pytest.fixture(scope="module")
def model():
  config = ModelConfig.tiny(V, dropout_rate=0.0, attention_dropout_rate=0.0, max_len=32)
  model = Transformer(config)
  params = model.init(jax.random.key(3), jnp.asarray(INPUTS), jnp.ones((4, 3), jnp.int32))
  return model, random_workdir.perturbed(params["params"], seed=4)


def _searched(model, method: str, prefix=PREFIX, inputs=INPUTS, **settings):
  module, params = model
  problem = bridge.prepare_search(module, {"params": params}, jnp.asarray(inputs),
                                  max_decode_len=L,
                                  target_prefix=None if prefix is None else jnp.asarray(prefix))
  if method == "beam":
    return decoding.beam_search(problem, beam_size=settings.get("beam_size", 3))
  if method == "greedy":
    sequences, scores = decoding.greedy_search(problem)
  else:
    sequences, scores = decoding.sample(problem, jax.random.key(settings.get("seed", 0)),
                                      temperature=1.5)
  return sequences[:, None], scores[:, None]


_RESULTS: dict = {}


def _default(model, method: str, prefixed: bool = True) -> list[np.ndarray]:
  """The search of INPUTS with PREFIX (or none) by `method`, compiled once per module."""
  key = (method, prefixed)
  if key not in _RESULTS:
    prefix = PREFIX if prefixed else None
    _RESULTS[key] = [np.asarray(x) for x in jax.jit(
        lambda: _searched(model, method, prefix=prefix))()]
  return _RESULTS[key]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_every_hypothesis_starts_with_its_prefix(model, method):
  sequences, scores = _default(model, method)
  for row, length in enumerate(LENGTHS):
    for hypothesis, score in zip(sequences[row], scores[row], strict=True):
      if score > -np.inf:
        np.testing.assert_array_equal(hypothesis[:length], PREFIX[row, :length])
        assert EOS_ID not in hypothesis[:length]
  # The prefix changed the outputs: without it, row 3 does not start with its prefix.
  free = _default(model, method, prefixed=False)[0]
  assert not np.array_equal(free[3, 0, :5], PREFIX[3, :5])


def _token_log_probs(model, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """float64 [B, T]: log p(targets[t] | inputs, targets[:t]) by a teacher-forced pass."""
  module, params = model
  logits = np.asarray(module.apply({"params": params}, jnp.asarray(inputs),
                                   jnp.asarray(targets)), np.float64)
  log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - logits.max(-1, keepdims=True)
  return np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


@pytest.mark.parametrize("method", ["greedy", "sample"])
def test_a_prefix_adds_nothing_to_the_score(model, method):
  """The score is log p(continuation | source, prefix): the tokens after the prefix, EOS
  included, summed in float64 from a teacher-forced pass of the whole output."""
  sequences, scores = _default(model, method)
  sequences, scores = sequences[:, 0], scores[:, 0]
  token_log_probs = _token_log_probs(model, INPUTS, sequences)
  positions = np.arange(L)[None, :]
  after_prefix = (positions >= LENGTHS[:, None]) & (sequences != PAD_ID)
  expected = np.where(after_prefix, token_log_probs, 0.0).sum(axis=1)
  np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
  # And the whole output's log-probability differs where there is a prefix: the test can fail.
  whole = np.where(sequences != PAD_ID, token_log_probs, 0.0).sum(axis=1)
  assert np.all(np.abs(whole - expected)[LENGTHS > 0] > 1e-3)


def test_beam_scores_are_the_continuations_length_normalised(model):
  sequences, scores = _default(model, "beam")
  ranking = search.Ranking()
  for row in range(len(INPUTS)):
    targets = sequences[row]
    token_log_probs = _token_log_probs(model, np.repeat(INPUTS[row:row + 1], 3, axis=0), targets)
    for k in range(3):
      tokens = targets[k][targets[k] != PAD_ID]
      continuation = token_log_probs[k, LENGTHS[row]:len(tokens)].sum()
      np.testing.assert_allclose(scores[row, k],
                                 continuation / float(ranking.divisor(len(tokens))),
                                 rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("method", ["beam"])
def test_rows_do_not_depend_on_each_other(model, method):
  together = _default(model, method)
  for row in range(len(INPUTS)):
    alone = [np.asarray(x) for x in jax.jit(
        lambda row=row: _searched(model, method, prefix=PREFIX[row:row + 1],
                                  inputs=INPUTS[row:row + 1]))()]
    np.testing.assert_array_equal(together[0][row], alone[0][0])
    np.testing.assert_allclose(together[1][row], alone[1][0], rtol=1e-5, atol=1e-6)


def test_prefixes_of_any_length_share_one_program(model):
  module, params = model
  traces = []

  @jax.jit
  def run(params, prefix):
    traces.append(1)
    problem = bridge.prepare_search(module, {"params": params}, jnp.asarray(INPUTS),
                                    max_decode_len=L, target_prefix=prefix)
    return decoding.beam_search(problem, beam_size=2)

  outputs = []
  for shift in range(4):  # Each call a new mix of lengths: 0 .. 5 tokens per row.
    prefix = np.roll(PREFIX, shift, axis=0)
    outputs.append(np.asarray(run(params, jnp.asarray(prefix))[0]))
    lengths = (prefix != PAD_ID).sum(axis=1)
    for row, length in enumerate(lengths):
      np.testing.assert_array_equal(outputs[-1][row, 0, :length], prefix[row, :length])
  assert len(traces) == 1


def test_greedy_with_empty_prefixes_is_greedy(model):
  empty = np.zeros_like(PREFIX)
  prefixed = jax.jit(lambda: _searched(model, "greedy", prefix=empty))()
  plain = _default(model, "greedy", prefixed=False)
  np.testing.assert_array_equal(prefixed[0], plain[0])
  np.testing.assert_array_equal(prefixed[1], plain[1])


def test_a_prefix_of_the_wrong_shape_is_refused(model):
  module, params = model
  for shape in [(3, L), (4, L + 1), (4,)]:
    with pytest.raises(ValueError, match="target_prefix must be int"):
      bridge.prepare_search(module, {"params": params}, jnp.asarray(INPUTS), max_decode_len=L,
                            target_prefix=jnp.zeros(shape, jnp.int32))
