"""Toy step functions for the search tests, and the independent NumPy references they are
checked against: brute-force enumeration, the field's beam rule (CTranslate2's) and greedy
decoding, each written from the definitions in float64."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.decoding import (
  Ranking,
  SearchProblem,
  beam_search,
)

EOS = 1
PAD = 0  # Also BOS.
NUM_HASHES = 31


def hash_token(h, token):
  """A running hash of the prefix; identical for NumPy and JAX int32 values."""
  return (h * 7 + token + 1) % NUM_HASHES


def log_softmax(x):
  x = np.asarray(x, np.float64)
  return x - np.log(np.sum(np.exp(x - x.max()))) - x.max()


def length_penalty(n, alpha):
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
    new_hash = hash_token(state["hash"], ids[:, 0])
    logits = table[jnp.arange(rows), new_hash] + jnp.asarray(self.position_bias)[state["index"]]
    return logits, {**state, "hash": new_hash, "index": state["index"] + 1}

  def log_probs(self, b, prefix):
    """NumPy float64 log-probabilities of the next token after `prefix` in sentence b."""
    h = int(self.initial_hash[b])
    for token in (PAD, *prefix):
      h = hash_token(h, token)
    return log_softmax(self.table[b, h] + self.position_bias[len(prefix)])


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
      score = (total + log_probs(prefix)[EOS]) / length_penalty(n + 1, alpha)
      if np.isfinite(score):
        hypotheses.append((True, score, (*prefix, EOS)))
  if max_tokens is None or max_tokens >= max_len:
    for seq in itertools.product(emittable, repeat=max_len):
      total = sum(log_probs(seq[:i])[t] for i, t in enumerate(seq))
      hypotheses.append((False, total / length_penalty(max_len, alpha), seq))
  return sorted(hypotheses, key=lambda h: (not h[0], -h[1]))


def padded(seq, max_len):
  return list(seq) + [PAD] * (max_len - len(seq))


def assert_matches_brute_force(sequences, scores, toy, alpha, **limits):
  beams = sequences.shape[1]
  for b in range(toy.batch):
    max_tokens = limits.get("max_lengths", [None] * toy.batch)[b]
    expected = brute_force(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len, alpha,
                           limits.get("min_length", 0), max_tokens)[:beams]
    expected += [(False, -np.inf, ())] * (beams - len(expected))  # Empty slots: zeros, -inf.
    np.testing.assert_array_equal(
        np.asarray(sequences[b]), [padded(h[2], toy.max_len) for h in expected])
    np.testing.assert_allclose(np.asarray(scores[b]), [h[1] for h in expected], rtol=2e-6)


def search_toy(toy, beams, alpha, mode="closure", finish_rule="every_beam",
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


def divisor(n, alpha, normalization):
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
        finished.append((total / divisor(len(seq), alpha, normalization), seq))
      elif seq[-1] != EOS and len(alive) < beams:
        alive.append((seq, total))
    if len(finished) >= beams or not alive or last:
      break
  finished.sort(key=lambda h: -h[0])
  return finished[:beams]


def assert_matches_field_rule(toy, beams, alpha, normalization, **limits):
  kwargs = dict(limits)
  if "max_lengths" in kwargs:
    kwargs["max_lengths"] = jnp.asarray(kwargs["max_lengths"], jnp.int32)
  sequences, scores = search_toy(toy, beams=beams, alpha=alpha, finish_rule="top_k",
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


def numpy_greedy(toy, b, min_length=0, max_tokens=None):
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
  return padded(prefix, toy.max_len), total


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
    # hash_token applied to positions 0..index in order, in closed form: start * 7^(index + 1) +
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


FIXED_LOGITS = np.log(np.array([0.1, 0.05, 0.5, 0.3, 0.15, 0.0 + 1e-30]))  # PAD never emitted.


def fixed_step(ids, state):
  return jnp.broadcast_to(jnp.asarray(FIXED_LOGITS, jnp.float32), (ids.shape[0], 6)), state
