"""Tests for flax_transformer.decoding.search on toy step functions whose answers are known or
enumerable.

The references are independent: NumPy brute-force enumeration of every hypothesis, NumPy greedy
decoding, analytic optima of a Markov chain, and binomial confidence bounds for sampling.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding import (
  Ranking,
  SearchProblem,
  beam_search,
  beam_state,
  greedy_search,
  loop,
  sample,
  search,
  topk,
)
from flax_transformer.decoding.loop import LoopOptions

EOS = 1
PAD = 0  # Also BOS.
NUM_HASHES = 31


def _hash(h, token):
  """A running hash of the prefix; identical for NumPy and JAX int32 values."""
  return (h * 7 + token + 1) % NUM_HASHES


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  return x - np.log(np.sum(np.exp(x - x.max()))) - x.max()


def _length_penalty(n, alpha):
  return ((5.0 + n) / 6.0) ** alpha


class HashToy:
  """Next-token logits that depend on the whole prefix (via a running hash) and the position.

  Per sentence b: logits = table[b, hash(prefix)] + position_bias[len(prefix)]. The state holds
  the hash per row and a 0-d `index` (the position); the table is per sentence and reaches the
  step function through the closure, `shared_state`, or the (reordered) state.
  """

  def __init__(self, seed, batch, max_len, vocab=5, eos_logits=None):
    rng = np.random.default_rng(seed)
    self.batch, self.max_len, self.vocab = batch, max_len, vocab
    self.table = (2.0 * rng.normal(size=(batch, NUM_HASHES, vocab))).astype(np.float32)
    self.position_bias = rng.normal(size=(max_len, vocab)).astype(np.float32)
    if eos_logits is not None:
      self.position_bias[:, EOS] = eos_logits
    self.initial_hash = rng.integers(0, NUM_HASHES, size=batch).astype(np.int32)

  def initial_state(self, table_in_state=False):
    state = {"hash": jnp.asarray(self.initial_hash), "index": jnp.zeros((), jnp.int32)}
    if table_in_state:
      state["table"] = jnp.asarray(self.table)
    return state

  def step(self, ids, state, shared=None):
    """ids [R, 1]; the table comes from `shared`, the state, or the closure, in that order."""
    if state["index"].shape != ():
      raise AssertionError(f"the 0-d index leaf arrived with shape {state['index'].shape}")
    rows = ids.shape[0]
    table = shared["table"] if shared is not None else state.get("table", jnp.asarray(self.table))
    if table.shape[0] != rows:  # One table per sentence, K consecutive rows per sentence.
      table = table[jnp.arange(rows) // (rows // table.shape[0])]
    new_hash = _hash(state["hash"], ids[:, 0])
    logits = table[jnp.arange(rows), new_hash] + jnp.asarray(self.position_bias)[state["index"]]
    return logits, {**state, "hash": new_hash, "index": state["index"] + 1}

  def log_probs(self, b, prefix):
    """NumPy float64 log-probabilities of the next token after `prefix` in sentence b."""
    h = int(self.initial_hash[b])
    for token in (PAD, *prefix):
      h = _hash(h, token)
    return _log_softmax(self.table[b, h] + self.position_bias[len(prefix)])


def brute_force(log_probs, vocab, max_len, alpha, min_length=0, max_tokens=None):
  """Every hypothesis, finished ones first, each group best first: [(finished, score, seq)]."""
  emittable = [t for t in range(vocab) if t not in (PAD, EOS)]
  hypotheses = []
  for n in range(max_len):  # n tokens before EOS.
    for prefix in itertools.product(emittable, repeat=n):
      forced = max_tokens is not None and n == max_tokens
      if (max_tokens is not None and n > max_tokens) or (n < min_length and not forced):
        continue
      total = sum(log_probs(prefix[:i])[t] for i, t in enumerate(prefix))
      score = (total + log_probs(prefix)[EOS]) / _length_penalty(n + 1, alpha)
      if np.isfinite(score):
        hypotheses.append((True, score, (*prefix, EOS)))
  if max_tokens is None or max_tokens >= max_len:
    for seq in itertools.product(emittable, repeat=max_len):
      total = sum(log_probs(seq[:i])[t] for i, t in enumerate(seq))
      hypotheses.append((False, total / _length_penalty(max_len, alpha), seq))
  return sorted(hypotheses, key=lambda h: (not h[0], -h[1]))


def _padded(seq, max_len):
  return list(seq) + [PAD] * (max_len - len(seq))


def _assert_matches_brute_force(sequences, scores, toy, alpha, **limits):
  beams = sequences.shape[1]
  for b in range(toy.batch):
    max_tokens = limits.get("max_lengths", [None] * toy.batch)[b]
    expected = brute_force(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len, alpha,
                           limits.get("min_length", 0), max_tokens)[:beams]
    expected += [(False, -np.inf, ())] * (beams - len(expected))  # Empty slots: zeros, -inf.
    np.testing.assert_array_equal(
        np.asarray(sequences[b]), [_padded(h[2], toy.max_len) for h in expected])
    np.testing.assert_allclose(np.asarray(scores[b]), [h[1] for h in expected], rtol=2e-6)


def _search(toy, beams, alpha, mode="closure", finish_rule="every_beam",
            length_normalization="gnmt", return_all=True, **limits):
  """beam_search on `toy`; by default with the rule whose large-K answer is brute force's."""
  step, state, shared = toy.step, toy.initial_state(), None
  if mode == "shared":
    shared = {"table": jnp.asarray(toy.table)}
  elif mode == "state":
    state = toy.initial_state(table_in_state=True)
  problem = SearchProblem(step, state, batch_size=toy.batch, max_decode_len=toy.max_len,
                          eos_id=EOS, shared_state=shared, **limits)
  return beam_search(problem, beam_size=beams, return_all=return_all,
                     ranking=Ranking(alpha, length_normalization, finish_rule))


# A first-order Markov chain (t5x decoding_test style) over PAD/BOS, EOS, A, B. Greedy takes A
# (0.6) and then EOS (0.45): p = 0.27. The best sequence is B EOS: 0.4 * 0.9 = 0.36.
A, B = 2, 3
MARKOV = np.array([
    # PAD/BOS EOS   A     B
    [0.0, 0.0, 0.6, 0.4],  # after BOS
    [0.0, 1.0, 0.0, 0.0],  # after EOS (never used)
    [0.0, 0.45, 0.35, 0.2],  # after A
    [0.0, 0.9, 0.05, 0.05],  # after B
])


def _markov_step(ids, state):
  with np.errstate(divide="ignore"):
    return jnp.asarray(np.log(MARKOV), jnp.float32)[ids[:, 0]], state


def test_markov_chain_beam_two_finds_the_best_sequence_greedy_does_not():
  state = {"unused": jnp.zeros((1,), jnp.int32)}
  common = dict(batch_size=1, max_decode_len=3, eos_id=EOS)
  greedy, greedy_score = greedy_search(SearchProblem(_markov_step, state, **common))
  beam, beam_scores = beam_search(SearchProblem(_markov_step, state, **common), beam_size=2,
                                  ranking=Ranking(length_penalty=0.0))
  probs = {seq: np.prod([MARKOV[prev, t] for prev, t in zip((PAD, *seq), seq, strict=False)])
           for n in (1, 2, 3) for seq in itertools.product(range(4), repeat=n)
           if seq[-1] == EOS and EOS not in seq[:-1] and PAD not in seq}
  best = max(probs, key=probs.get)
  assert best == (B, EOS)  # The analytic optimum, confirmed by enumeration.
  np.testing.assert_array_equal(beam[0, 0], _padded(best, 3))
  np.testing.assert_allclose(beam_scores[0, 0], np.log(probs[best]), rtol=1e-6)
  np.testing.assert_array_equal(greedy[0], [A, EOS, PAD])
  np.testing.assert_allclose(greedy_score[0], np.log(0.27), rtol=1e-6)
  assert beam_scores[0, 0] > greedy_score[0]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_as_large_as_the_prefix_count_equals_brute_force(alpha):
  # 3 emittable tokens, L = 3: at most 9 alive prefixes, 13 finished and 27 unfinished
  # hypotheses; K = 16 also shows 3 unfinished ones ranked after the 13 finished.
  toy = HashToy(seed=int(alpha * 10), batch=2, max_len=3)
  sequences, scores = _search(toy, beams=16, alpha=alpha, mode="shared")
  assert sequences.shape == (2, 16, 3) and sequences.dtype == jnp.int32
  _assert_matches_brute_force(sequences, scores, toy, alpha)


@pytest.mark.parametrize("limits", [dict(max_lengths=[1, 2]), dict(min_length=2)])
def test_length_limits_equal_brute_force_with_the_same_limits(limits):
  toy = HashToy(seed=3, batch=2, max_len=3)
  kwargs = dict(limits)
  if "max_lengths" in kwargs:
    kwargs["max_lengths"] = jnp.asarray(kwargs["max_lengths"], jnp.int32)
  sequences, scores = _search(toy, beams=9, alpha=0.6, **kwargs)
  _assert_matches_brute_force(sequences, scores, toy, 0.6, **limits)
  lengths = np.sum(np.asarray(sequences) != PAD, axis=-1)  # [B, K]
  if "max_lengths" in limits:
    assert lengths[0].max() == 2 and lengths[1].max() == 3  # tokens incl. EOS <= cap + 1
  else:
    assert lengths.min() == 3  # no EOS before 2 tokens


def test_shared_state_equals_the_same_table_carried_per_beam():
  # Per-beam state is repeated and reordered every step; shared state must reach every beam of
  # its sentence untouched. Both routes must give the brute-force answer.
  toy = HashToy(seed=5, batch=3, max_len=4)
  shared = _search(toy, beams=4, alpha=0.6, mode="shared")
  per_beam = _search(toy, beams=4, alpha=0.6, mode="state")
  np.testing.assert_array_equal(shared[0], per_beam[0])
  np.testing.assert_allclose(shared[1], per_beam[1], rtol=1e-6)
  for b in range(toy.batch):
    expected = brute_force(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len, 0.6)
    np.testing.assert_array_equal(shared[0][b, 0], _padded(expected[0][2], toy.max_len))


def test_sequences_hold_one_eos_then_zeros_and_finished_rank_first():
  # EOS is possible but unlikely: unfinished hypotheses have higher raw scores, yet every
  # finished one ranks above them.
  toy = HashToy(seed=7, batch=2, max_len=3, eos_logits=-6.0)
  sequences, scores = _search(toy, beams=16, alpha=0.6)
  _assert_matches_brute_force(sequences, scores, toy, 0.6)
  seqs = np.asarray(sequences)
  finished = (seqs == EOS).any(-1)  # [B, K]
  assert finished[:, :13].all() and not finished[:, 13:].any()
  assert (np.asarray(scores)[:, 13:].max(-1) > np.asarray(scores)[:, :13].min(-1)).all()
  for seq in seqs[finished]:
    end = list(seq).index(EOS)
    assert (seq[:end] != PAD).all() and (seq[end + 1:] == PAD).all()


def test_no_hypothesis_finishes_all_rank_by_normalized_score():
  toy = HashToy(seed=8, batch=2, max_len=3, eos_logits=-np.inf)
  sequences, scores = _search(toy, beams=5, alpha=0.6)
  assert not (np.asarray(sequences) == EOS).any()
  _assert_matches_brute_force(sequences, scores, toy, 0.6)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_one_equals_greedy(alpha):
  # EOS is impossible before position 4 and nearly certain there, so greedy's answer is also
  # the best answer on the greedy path (beam 1 keeps finished hypotheses apart).
  eos_logits = np.array([-np.inf] * 4 + [30.0] * 4, np.float32)
  toy = HashToy(seed=11, batch=3, max_len=8, vocab=7, eos_logits=eos_logits)
  greedy, greedy_scores = greedy_search(SearchProblem(toy.step, toy.initial_state(),
                                                      batch_size=3, max_decode_len=8, eos_id=EOS))
  beam, beam_scores = _search(toy, beams=1, alpha=alpha)
  np.testing.assert_array_equal(np.asarray(greedy)[:, 4], EOS)
  np.testing.assert_array_equal(beam[:, 0], greedy)
  np.testing.assert_allclose(beam_scores[:, 0], greedy_scores / _length_penalty(5, alpha),
                             rtol=1e-6)


def _divisor(n, alpha, normalization):
  """The length normalizations, written out from GNMT's and fairseq's formulas."""
  if normalization == "gnmt":
    return ((5.0 + n) / 6.0) ** alpha
  return float(n) ** alpha


def field_beam_search(log_probs, vocab, max_len, beams, alpha, normalization, min_length=0,
                      max_tokens=None):
  """The finishing rule of CTranslate2's BeamSearch::search, in float64 NumPy: each step ranks
  every (beam, token) extension by summed log-probability; an EOS among the `beams` best
  finishes (normalized), the best `beams` non-EOS ones stay alive; at the last step every one of
  the `beams` best finishes, EOS or not; stop once `beams` hypotheses have finished and keep the
  `beams` best. Returns [(score, seq)], best first."""
  alive, finished = [((), 0.0)], []
  for step in range(max_len):
    forced = max_tokens is not None and step >= max_tokens
    last = step == max_len - 1
    candidates = []
    for prefix, total in alive:
      row = log_probs(prefix)
      for token in range(vocab):
        eos_ok = forced or step >= min_length
        if token == PAD or (token == EOS and not eos_ok) or (forced and token != EOS):
          continue
        candidates.append((total + row[token], (*prefix, token)))
    candidates.sort(key=lambda c: -c[0])
    alive = []
    for rank, (total, seq) in enumerate(candidates):
      if not np.isfinite(total):
        continue
      if rank < beams and (seq[-1] == EOS or last):
        finished.append((total / _divisor(len(seq), alpha, normalization), seq))
      elif seq[-1] != EOS and len(alive) < beams:
        alive.append((seq, total))
    if len(finished) >= beams or not alive or last:
      break
  finished.sort(key=lambda h: -h[0])
  return finished[:beams]


def _assert_matches_field_rule(toy, beams, alpha, normalization, **limits):
  kwargs = dict(limits)
  if "max_lengths" in kwargs:
    kwargs["max_lengths"] = jnp.asarray(kwargs["max_lengths"], jnp.int32)
  sequences, scores = _search(toy, beams=beams, alpha=alpha, finish_rule="top_k",
                              length_normalization=normalization, **kwargs)
  for b in range(toy.batch):
    max_tokens = limits.get("max_lengths", [None] * toy.batch)[b]
    expected = field_beam_search(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len,
                                 beams, alpha, normalization, limits.get("min_length", 0),
                                 max_tokens)
    got = [(float(score), tuple(int(t) for t in seq if t != PAD))
           for seq, score in zip(np.asarray(sequences[b]), np.asarray(scores[b]), strict=True)
           if np.isfinite(score)]  # Empty slots (zeros, -inf) where fewer than K exist.
    assert [seq for _, seq in got] == [tuple(seq) for _, seq in expected], b
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in expected], rtol=2e-6)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("normalization", search.LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("beams", [2, 4])
def test_top_k_rule_equals_the_peers_rule_in_numpy(beams, alpha, normalization):
  # EOS is likely (logit +1 against four N(0, 4) tokens): hypotheses finish at every length,
  # several at one step, and many EOS extensions rank below the K best and must not finish.
  toy = HashToy(seed=61, batch=4, max_len=7, vocab=6, eos_logits=1.0)
  _assert_matches_field_rule(toy, beams, alpha, normalization)


@pytest.mark.parametrize("limits", [dict(min_length=3), dict(max_lengths=[1, 4, 0, 6])])
def test_top_k_rule_with_length_limits_equals_numpy(limits):
  toy = HashToy(seed=62, batch=4, max_len=7, vocab=6, eos_logits=1.0)
  _assert_matches_field_rule(toy, 3, 0.6, "gnmt", **limits)


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_top_k_rule_ranks_beams_cut_at_the_limit_with_the_finished_ones(alpha):
  # EOS rarer and L short: the limit stops most sentences with some hypotheses finished, and a
  # cut beam may outrank a finished one (CTranslate2 finishes every beam at its last step).
  toy = HashToy(seed=63, batch=6, max_len=4, vocab=6, eos_logits=-0.5)
  _assert_matches_field_rule(toy, 4, alpha, "fairseq")
  sequences, _ = _search(toy, beams=4, alpha=alpha, finish_rule="top_k",
                         length_normalization="fairseq")
  ends = [[EOS in row for row in rows] for rows in np.asarray(sequences).tolist()]
  # The control: some sentence ranks a cut beam above a finished hypothesis.
  assert any(not e[i] and any(e[i + 1:]) for e in ends for i in range(len(e))), ends


def test_top_k_rule_differs_from_every_beam_where_eos_has_weight():
  # The control: the two rules must disagree on this toy, or the tests above prove nothing.
  toy = HashToy(seed=61, batch=4, max_len=7, vocab=6, eos_logits=1.0)
  top_k = _search(toy, beams=4, alpha=0.6, finish_rule="top_k")[0]
  every_beam = _search(toy, beams=4, alpha=0.6, finish_rule="every_beam")[0]
  assert not np.array_equal(np.asarray(top_k), np.asarray(every_beam))


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("limits", [{}, dict(min_length=2), dict(max_lengths=[2, 5, 0, 3, 7])])
@pytest.mark.parametrize("seed", [71, 72, 73])
def test_top_k_rule_with_one_beam_is_greedy(seed, limits):
  # EOS likely: every_beam with K = 1 stops short of greedy here; the field's rule must not.
  toy = HashToy(seed=seed, batch=5, max_len=8, vocab=9, eos_logits=0.5)
  kwargs = dict(limits)
  if "max_lengths" in kwargs:
    kwargs["max_lengths"] = jnp.asarray(kwargs["max_lengths"], jnp.int32)
  greedy, greedy_scores = greedy_search(SearchProblem(
      toy.step, toy.initial_state(), batch_size=5, max_decode_len=8, eos_id=EOS, **kwargs))
  for normalization in search.LENGTH_NORMALIZATIONS:
    beam, beam_scores = _search(toy, beams=1, alpha=0.6, finish_rule="top_k",
                                length_normalization=normalization, **kwargs)
    np.testing.assert_array_equal(beam[:, 0], greedy)
    lengths = (np.asarray(greedy) != PAD).sum(-1)
    divisors = [_divisor(n, 0.6, normalization) for n in lengths]
    np.testing.assert_allclose(beam_scores[:, 0], np.asarray(greedy_scores) / divisors,
                               rtol=1e-6)


def test_every_beam_rule_with_one_beam_is_not_greedy_where_eos_has_weight():
  toy = HashToy(seed=71, batch=5, max_len=8, vocab=9, eos_logits=0.5)
  greedy, _ = greedy_search(SearchProblem(toy.step, toy.initial_state(), batch_size=5,
                                          max_decode_len=8, eos_id=EOS))
  beam, _ = _search(toy, beams=1, alpha=0.6, finish_rule="every_beam")
  assert not np.array_equal(np.asarray(beam[:, 0]), np.asarray(greedy))


def test_length_normalizations_follow_their_formulas():
  for n in (1, 2, 7, 30):
    for alpha in (0.0, 0.6, 1.0):
      for normalization in search.LENGTH_NORMALIZATIONS:
        np.testing.assert_allclose(search.length_penalty_divisor(n, alpha, normalization),
                                   _divisor(n, alpha, normalization), rtol=1e-6)
  with pytest.raises(ValueError, match="length_normalization must be one of"):
    search.length_penalty_divisor(3, 0.6, "marian")
  with pytest.raises(ValueError, match="finish_rule must be one of"):
    Ranking(finish_rule="first")


# Position-only next-token probabilities over PAD, EOS, A, B. Stopping after step 0 keeps [EOS]
# (log .45 = -0.80), but with alpha = 1 the 6-token A A A A A EOS scores (log .3 + 5 log .98) /
# (11 / 6) = -0.71: an early exit must divide the alive sum by the penalty of the longest
# reachable length, not the next one (-1.20 / (7 / 6) = -1.03 would wrongly stop).
POSITIONAL = np.array([[0.0, 0.45, 0.3, 0.25]] + [[0.0, 0.01, 0.98, 0.01]] * 4
                      + [[0.0, 0.98, 0.01, 0.01]])


def _positional_step(ids, state):
  logits = jnp.log(jnp.asarray(POSITIONAL, jnp.float32))[state["index"]]
  return jnp.broadcast_to(logits, (ids.shape[0], 4)), {"index": state["index"] + 1}


def test_early_exit_bound_allows_for_the_length_penalty():
  problem = SearchProblem(_positional_step, {"index": jnp.zeros((), jnp.int32)}, batch_size=1,
                          max_decode_len=6, eos_id=EOS)
  sequences, scores = beam_search(problem, beam_size=1, ranking=Ranking(1.0, "gnmt", "every_beam"))
  with np.errstate(divide="ignore"):
    table = np.log(POSITIONAL)
  best = brute_force(lambda prefix: table[len(prefix)], 4, 6, alpha=1.0)[0]
  assert best[2] == (A, A, A, A, A, EOS)
  np.testing.assert_array_equal(sequences[0, 0], best[2])
  np.testing.assert_allclose(scores[0, 0], best[1], rtol=1e-6)


def _numpy_greedy(toy, b, min_length=0, max_tokens=None):
  prefix, total = [], 0.0
  while len(prefix) < toy.max_len:
    log_probs = toy.log_probs(b, prefix)
    allowed = log_probs.copy()
    allowed[PAD] = -np.inf
    if len(prefix) < min_length:
      allowed[EOS] = -np.inf
    token = EOS if max_tokens is not None and len(prefix) >= max_tokens else int(allowed.argmax())
    prefix.append(token)
    total += log_probs[token]
    if token == EOS:
      break
  return _padded(prefix, toy.max_len), total


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
    expected, total = _numpy_greedy(toy, b, limits.get("min_length", 0), caps[b])
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


class HistoryToy(HashToy):
  """HashToy whose state keeps every input token in a buffer, a stand-in for an attention cache.

  The buffer [rows, capacity] gets the input token at `index` and the step rehashes positions
  0..index from scratch, so a token lost in a resize, written past the capacity (clamped onto
  the last slot) or left behind by the beam reorder changes the logits. `capacities` records
  the buffer sizes the step was traced with.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.capacities = []

  def initial_state(self, capacity):
    return {"tokens": jnp.zeros((self.batch, capacity), jnp.int32),
            "start": jnp.asarray(self.initial_hash), "index": jnp.zeros((), jnp.int32)}

  def step(self, ids, state):
    tokens, index = state["tokens"], state["index"]
    self.capacities.append(tokens.shape[1])
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, ids, index, axis=1)
    # _hash applied to positions 0..index in order, in closed form: start * 7^(index + 1) +
    # sum_j (token_j + 1) * 7^(index - j), mod NUM_HASHES (one reduction, not a loop of steps).
    powers = jnp.asarray([pow(7, m, NUM_HASHES) for m in range(tokens.shape[1] + 1)])
    positions = jnp.arange(tokens.shape[1])
    weights = jnp.where(positions <= index, powers[jnp.maximum(index - positions, 0)], 0)
    running = (state["start"] * powers[index + 1]
               + jnp.sum((tokens + 1) * weights, axis=1)) % NUM_HASHES
    rows = ids.shape[0]
    table = jnp.asarray(self.table)[jnp.arange(rows) // (rows // self.batch)]
    logits = table[jnp.arange(rows), running] + jnp.asarray(self.position_bias)[index]
    return logits, {**state, "tokens": tokens, "index": index + 1}

  @staticmethod
  def resize(state, capacity):
    tokens = state["tokens"]
    if capacity <= tokens.shape[1]:
      return {**state, "tokens": tokens[:, :capacity]}
    return {**state, "tokens": jnp.pad(tokens, ((0, 0), (0, capacity - tokens.shape[1])))}


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_with_a_growing_state_equals_brute_force(alpha):
  # L = 5 in segments of 2: capacities 2, 4, 5. K = 81 holds every alive prefix (3 ** 4), so
  # the search is exact, and beams are reordered across both resizes.
  toy = HistoryToy(seed=31, batch=2, max_len=5, eos_logits=-1.0)
  ranking = Ranking(alpha, finish_rule="every_beam")

  def run(state, beam_size, resize_state=None, segment_length=16):
    problem = SearchProblem(toy.step, state, batch_size=2, max_decode_len=5, eos_id=EOS,
                            resize_state=resize_state)
    return beam_search(problem, beam_size=beam_size, ranking=ranking,
                       loop_options=LoopOptions(segment_length=segment_length))

  sequences, scores = run(toy.initial_state(1), beam_size=81,
                          resize_state=HistoryToy.resize, segment_length=2)
  assert sorted(set(toy.capacities)) == [2, 4, 5]
  _assert_matches_brute_force(sequences, scores, toy, alpha)
  # With pruning (K = 3), growing the buffer must not change what a full-size buffer finds.
  grown = run(toy.initial_state(1), beam_size=3, resize_state=HistoryToy.resize,
              segment_length=2)
  full_size = run(toy.initial_state(5), beam_size=3)
  np.testing.assert_array_equal(grown[0], full_size[0])
  np.testing.assert_allclose(grown[1], full_size[1], rtol=1e-6)


def test_history_toy_catches_a_segment_that_ends_mid_iteration(monkeypatch):
  # The control for the test above: an odd capacity before L makes the two-step beam loop
  # write past it (clamped onto the last slot), and the toy must then disagree.
  toy = HistoryToy(seed=31, batch=2, max_len=5, eos_logits=-1.0)
  monkeypatch.setattr(loop, "growth_schedule", lambda max_len, segment, steps: (3, max_len))
  problem = SearchProblem(toy.step, toy.initial_state(1), batch_size=2, max_decode_len=5,
                          eos_id=EOS, resize_state=HistoryToy.resize)
  sequences, scores = beam_search(problem, beam_size=81,
                                  ranking=Ranking(0.6, finish_rule="every_beam"))
  with pytest.raises(AssertionError):
    _assert_matches_brute_force(sequences, scores, toy, 0.6)


def test_a_resize_that_changes_a_leaf_rank_is_a_clear_error():
  toy = HistoryToy(seed=31, batch=2, max_len=5)
  flatten = lambda state, capacity: {**state, "tokens": state["tokens"].reshape(-1)}
  with pytest.raises(ValueError, match=r"resize_state\(state, 2\) must keep the state's"):
    beam_search(SearchProblem(toy.step, toy.initial_state(5), batch_size=2, max_decode_len=5,
                              eos_id=EOS, resize_state=flatten),
                beam_size=2, loop_options=LoopOptions(segment_length=2))


def test_greedy_and_sampling_with_a_growing_state_equal_numpy_greedy():
  toy = HistoryToy(seed=37, batch=3, max_len=6, eos_logits=-0.5)
  problem = SearchProblem(toy.step, toy.initial_state(6), batch_size=3, max_decode_len=6,
                          eos_id=EOS, min_length=2, resize_state=HistoryToy.resize)
  options = LoopOptions(segment_length=2)
  greedy = greedy_search(problem, loop_options=options)
  sampled = sample(problem, jax.random.key(1), top_k=1, loop_options=options)
  assert sorted(set(toy.capacities)) == [2, 4, 6]
  for b in range(3):
    expected, total = _numpy_greedy(toy, b, min_length=2)
    for sequences, scores in (greedy, sampled):
      np.testing.assert_array_equal(sequences[b], expected)
      np.testing.assert_allclose(scores[b], total, rtol=1e-6)


@pytest.mark.parametrize("steps_per_iteration", [1, 2, 3, 8])
@pytest.mark.parametrize("segment_length", [1, 2, 7, 16])
def test_growth_schedule_steps_by_segments_then_doubles(segment_length, steps_per_iteration):
  k = steps_per_iteration
  step = -(-segment_length // k) * k  # Capacities before L are multiples of k (k steps a loop).
  for max_len in range(1, 600):
    capacities = loop.growth_schedule(max_len, segment_length, k)
    assert capacities[-1] == max_len
    assert all(c % k == 0 for c in capacities[:-1])
    assert list(capacities) == sorted(set(capacities))
    inner = capacities[:-1]
    assert list(inner[:4]) == [step * i for i in range(1, len(inner[:4]) + 1)]
    assert all(later == 2 * earlier for earlier, later in itertools.pairwise(inner[3:]))
    # No room left for another capacity of the rule, and no last segment shorter than s / 2.
    following = step * (len(inner) + 1) if len(inner) < 4 else 2 * inner[-1]
    assert following >= max_len or max_len - following < step // 2
    assert not inner or max_len - inner[-1] >= step // 2
  assert loop.growth_schedule(64) == (16, 32, 48, 64)
  assert loop.growth_schedule(300) == (16, 32, 48, 64, 128, 256, 300)
  assert loop.growth_schedule(64, 16, 3) == (18, 36, 54, 64)
  with pytest.raises(ValueError, match="segment_length must be a positive int"):
    loop.growth_schedule(10, 0)
  with pytest.raises(ValueError, match="steps_per_iteration must be a positive int"):
    loop.growth_schedule(10, 2, 0)


# 2: the CPU's default for beams, a divisor of L = 10; 3 and 8: neither, and 8 runs past the
# early exit within its first iteration. (4 added nothing to 3 and 8 but five compiles a case.)
STEPS_PER_ITERATION = (1, 2, 3, 8)


def _recording_positions(step, positions):
  """`step` that appends the position of every call it runs (its 0-d index) to `positions`."""

  def recorded(ids, state):
    jax.debug.callback(lambda index: positions.append(int(index)), state["index"])
    return step(ids, state)

  return recorded


def _search_with(method, toy, step, state, resize_state=None, **loop_options):
  problem = SearchProblem(step, state, batch_size=toy.batch, max_decode_len=toy.max_len,
                          eos_id=EOS, min_length=2, resize_state=resize_state)
  options = LoopOptions(**loop_options)
  if method.startswith("beam"):
    rule = "every_beam" if method == "beam_every_beam" else "top_k"
    return beam_search(problem, beam_size=3, ranking=Ranking(0.6, finish_rule=rule),
                       loop_options=options)
  if method == "greedy":
    return greedy_search(problem, loop_options=options)
  return sample(problem, jax.random.key(5), temperature=2.0, loop_options=options)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("growing", [False, True], ids=["fixed_state", "growing_state"])
@pytest.mark.parametrize("early_exit", [True, False], ids=["early_exit", "all_L_steps"])
@pytest.mark.parametrize("method", ["beam", "beam_every_beam", "greedy", "sample"])
def test_outputs_are_the_same_for_every_steps_per_iteration(method, early_exit, growing):
  # L = 10 is a multiple of neither 3 nor 8, so the last iteration runs past L. With EOS likely
  # (allowed from 2 tokens on) the loop exits early, mid-iteration for most k; with EOS
  # impossible it runs all L steps. The growing state has capacities 2, 4, 6, 8, 10 at k = 1.
  toy = HistoryToy(seed=44, batch=3, max_len=10, eos_logits=2.0 if early_exit else -np.inf)
  outputs, positions = {}, {}
  for k in STEPS_PER_ITERATION:
    positions[k] = []
    step = _recording_positions(toy.step, positions[k])
    growth = dict(resize_state=HistoryToy.resize, segment_length=2) if growing else {}
    run = jax.jit(functools.partial(_search_with, method, toy, step, steps_per_iteration=k,
                                       **growth))  # One compile of all segments.
    outputs[k] = run(toy.initial_state(1 if growing else toy.max_len))
  for k in STEPS_PER_ITERATION:
    np.testing.assert_array_equal(outputs[k][0], outputs[1][0], err_msg=f"k={k}")
    np.testing.assert_array_equal(outputs[k][1], outputs[1][1], err_msg=f"k={k}")
    assert len(positions[k]) % k == 0  # Whole iterations of k steps.
    if early_exit:
      assert len(positions[k]) < toy.max_len  # The loop stopped before L.
    else:
      assert len(positions[k]) == -(-toy.max_len // k) * k  # ... and here ran past L.
  if early_exit:
    assert len(positions[1]) < 8  # At k = 1 the exit comes before k = 8's first test.
  lengths = (np.asarray(outputs[1][0]) != PAD).sum(-1)
  assert (lengths < toy.max_len).all() if early_exit else (lengths == toy.max_len).all()


def test_default_steps_per_iteration_follows_the_backend(monkeypatch):
  table = loop.STEPS_PER_ITERATION
  assert loop.default_steps_per_iteration(beam=True) == (
      table.get(jax.default_backend(), table["cpu"])[0])
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert loop.default_steps_per_iteration(beam=True) == 2
  assert loop.default_steps_per_iteration(beam=False) == 1
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # Unlisted: the CPU's settings.
  assert loop.default_steps_per_iteration(beam=True) == 2
  with pytest.raises(ValueError, match="steps_per_iteration must be a positive int"):
    greedy_search(SearchProblem(_fixed_step, {}, batch_size=1, max_decode_len=3, eos_id=EOS),
                  loop_options=LoopOptions(steps_per_iteration=0))


FIXED_LOGITS = np.log(np.array([0.1, 0.05, 0.5, 0.3, 0.15, 0.0 + 1e-30]))  # PAD never emitted.


def _fixed_step(ids, state):
  return jnp.broadcast_to(jnp.asarray(FIXED_LOGITS, jnp.float32), (ids.shape[0], 6)), state


def _first_token_counts(rows, **settings):
  state = {"unused": jnp.zeros((rows,), jnp.int32)}
  problem = SearchProblem(_fixed_step, state, batch_size=rows, max_decode_len=1, eos_id=EOS)
  sequences, scores = sample(problem, jax.random.key(42), **settings)
  first = np.asarray(sequences[:, 0])
  np.testing.assert_allclose(scores, _log_softmax(FIXED_LOGITS)[first], rtol=1e-5)
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


def test_beam_search_is_jittable_and_return_all_false_gives_the_best():
  toy = HashToy(seed=19, batch=2, max_len=4)
  # The problem's arrays are the jitted function's arguments; its settings are static.
  run = jax.jit(lambda state, shared, caps: beam_search(
      SearchProblem(toy.step, state, batch_size=2, max_decode_len=4, eos_id=EOS,
                    shared_state=shared, max_lengths=caps),
      beam_size=3, ranking=Ranking(0.6, finish_rule="every_beam")))
  shared = {"table": jnp.asarray(toy.table)}
  caps = jnp.asarray([2, 9], jnp.int32)
  jitted = run(toy.initial_state(), shared, caps)
  eager = _search(toy, beams=3, alpha=0.6, mode="shared", max_lengths=caps)
  np.testing.assert_array_equal(jitted[0], eager[0])
  np.testing.assert_allclose(jitted[1], eager[1], rtol=1e-6)
  best, best_score = _search(toy, beams=3, alpha=0.6, mode="shared", max_lengths=caps,
                             return_all=False)
  assert best.shape == (2, 4) and best_score.shape == (2,)
  np.testing.assert_array_equal(best, eager[0][:, 0])


def test_bad_arguments_raise_clear_errors():
  toy = HashToy(seed=23, batch=2, max_len=3)
  state = {**toy.initial_state(), "hash": jnp.zeros((3,), jnp.int32)}
  with pytest.raises(ValueError, match=r"initial_state\['hash'\].*batch_size=2"):
    SearchProblem(toy.step, state, batch_size=2, max_decode_len=3, eos_id=EOS)
  with pytest.raises(ValueError, match="eos_id must be a positive int"):
    SearchProblem(toy.step, toy.initial_state(), batch_size=2, max_decode_len=3, eos_id=0)
  with pytest.raises(ValueError, match="expand_state and reorder_state go together; got only "
                     "expand_state"):
    SearchProblem(toy.step, toy.initial_state(), batch_size=2, max_decode_len=3, eos_id=EOS,
                  expand_state=lambda s, k: s)
  with pytest.raises(ValueError, match="same structure, shapes and dtypes"):
    bad_step = lambda ids, s: (toy.step(ids, s)[0], {**s, "index": s["index"] + 0.5})
    beam_search(SearchProblem(bad_step, toy.initial_state(), batch_size=2, max_decode_len=3,
                              eos_id=EOS), beam_size=2)
  with pytest.raises(ValueError, match="top_p must lie in"):
    sample(SearchProblem(toy.step, toy.initial_state(), batch_size=2, max_decode_len=3,
                         eos_id=EOS), jax.random.key(0), top_p=0.0)


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


def test_large_vocabulary_beam_search_equals_the_lax_top_k_version(monkeypatch):
  toy = HashToy(seed=29, batch=2, max_len=5, vocab=1009)
  blocked = _search(toy, beams=4, alpha=0.6)
  monkeypatch.setattr(beam_state, "top_k", lambda x, k: jax.lax.top_k(x, k))
  reference = _search(toy, beams=4, alpha=0.6)
  np.testing.assert_array_equal(blocked[0], reference[0])
  np.testing.assert_allclose(blocked[1], reference[1], rtol=1e-6)


class _SharedTableToy:
  """Logits from one table shared by all rows, indexed by a per-row running hash: a row's
  logits depend on its own initial hash and tokens alone, so any row can be run by itself."""

  def __init__(self, seed, vocab=6):
    rng = np.random.default_rng(seed)
    self.table = jnp.asarray(rng.normal(size=(NUM_HASHES, vocab)).astype(np.float32))

  def step(self, ids, state):
    new_hash = _hash(state["hash"], ids[:, 0])
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
  problem = SearchProblem(_fixed_step, state, batch_size=rows, max_decode_len=1, eos_id=EOS)
  sequences, _ = sample(problem, keys, temperature=0.5)
  counts = np.bincount(np.asarray(sequences[:, 0]), minlength=6)
  tempered = np.where(np.arange(6) == PAD, 0.0, np.exp(FIXED_LOGITS / 0.5))
  _assert_frequencies(counts, tempered / tempered.sum())
