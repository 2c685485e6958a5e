"""The searches as slot machines (`decoding.slots`), run as the engine runs them: one problem of
one sentence per slot under `jax.vmap`, the slots started at different times so that each is at
its own position, against the references of tests/search_toys.py: CTranslate2's rule in
float64 NumPy ("top_k"), brute force ("every_beam"), NumPy greedy decoding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding import beam_search, slots
from flax_transformer.decoding.search import Ranking, SearchProblem

from search_toys import (
  EOS,
  PAD,
  HashToy,
  brute_force,
  field_beam_search,
  numpy_greedy,
  padded,
)

STARTS = (0, 3, 1, 5)  # The global step at which each slot's sentence arrives.
# Whole words in the toy vocabularies: tokens 3 and 5 continue the word before them.
CONTINUES = (False, False, False, True, False, True, False, False)


def slot_problem(toy: HashToy, table: jax.Array, initial_hash: jax.Array,
                 constraints: jax.Array | None = None, ordered: bool = False) -> SearchProblem:
  """Sentence b's problem (B = 1): its own table and start hash (and constraints [1, C, P],
  whole words as `CONTINUES` spells them, met in order when `ordered`)."""
  state = {"hash": initial_hash, "index": jnp.zeros((), jnp.int32)}
  words = None if constraints is None else jnp.asarray(CONTINUES[:toy.vocab])
  return SearchProblem(toy.step, state, batch_size=1, max_decode_len=toy.max_len, eos_id=EOS,
                       shared_state={"table": table}, constraints=constraints,
                       ordered_constraints=ordered, word_continues=words)


def run_slots(toy: HashToy, machine, constraints: np.ndarray | None = None,
              plain: tuple[np.ndarray, np.ndarray] | None = None, ordered: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
  """Every sentence of `toy` in its own slot, slot b starting at STARTS[b] and stepped on every
  global step after that, as `serving.engine.advance` steps a table; each slot's result read
  once it is complete. Returns sequences [B, K, L] and scores [B, K]. `constraints` [B, C, P]
  and `plain` (a `BeamSlots` run's answer): a `ConstrainedBeamSlots` machine's data."""
  tables = jnp.asarray(toy.table)[:, None]  # [B, 1, hashes, V]
  hashes = jnp.asarray(toy.initial_hash)[:, None]  # [B, 1]
  terms = None if constraints is None else jnp.asarray(constraints)[:, None]  # [B, 1, C, P]
  problem = lambda t, h, c: slot_problem(toy, t, h, c, ordered)
  if plain is None:
    state = jax.vmap(lambda t, h, c: machine.start(problem(t, h, c)))(tables, hashes, terms)
  else:
    state = jax.vmap(lambda t, h, c, s, v: machine.start(problem(t, h, c), s, v))(
        tables, hashes, terms, jnp.asarray(plain[0])[:, None], jnp.asarray(plain[1])[:, None])

  @jax.jit
  def global_step(state, started):
    stepped = jax.vmap(lambda t, h, c, s: machine.step(problem(t, h, c), s))(
        tables, hashes, terms, state)
    keep = lambda new, old: jnp.where(
        started.reshape(-1, *([1] * (new.ndim - 1))), new, old)
    return jax.tree.map(keep, stepped, state)

  complete = jax.jit(jax.vmap(lambda t, h, c, s: machine.complete(problem(t, h, c), s)[0]))
  result = jax.jit(jax.vmap(lambda t, h, c, s: machine.result(problem(t, h, c), s)))
  results = {}
  for time in range(max(STARTS) + 4 * toy.max_len):
    started = jnp.asarray([time >= s for s in STARTS[:toy.batch]])
    state = global_step(state, started)
    done = np.asarray(complete(tables, hashes, terms, state))
    sequences, scores = result(tables, hashes, terms, state)
    for b in np.flatnonzero(done):
      results.setdefault(int(b), (np.asarray(sequences[b, 0]), np.asarray(scores[b, 0])))
    if len(results) == toy.batch:
      break
  assert len(results) == toy.batch, "a slot never completed"
  return (np.stack([results[b][0] for b in range(toy.batch)]),
          np.stack([results[b][1] for b in range(toy.batch)]))


@pytest.mark.parametrize("beams", [1, 3])
def test_beam_slots_follow_ctranslate2s_rule(beams):
  toy = HashToy(seed=7, batch=4, max_len=5, vocab=5)
  sequences, scores = run_slots(toy, slots.BeamSlots(beams, Ranking(0.6, "gnmt", "top_k")))
  for b in range(toy.batch):
    expected = field_beam_search(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len,
                                 beams, 0.6, "gnmt")
    got = [(float(s), tuple(int(t) for t in seq if t != PAD))
           for seq, s in zip(sequences[b], scores[b], strict=True) if np.isfinite(s)]
    assert [seq for _, seq in got] == [tuple(seq) for _, seq in expected], b
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in expected], rtol=2e-6)


def test_beam_slots_with_every_beam_find_brute_forces_best():
  toy = HashToy(seed=3, batch=4, max_len=4, vocab=4)
  beams = 8  # Wide enough that the rule keeps the exact best.
  sequences, scores = run_slots(toy, slots.BeamSlots(beams, Ranking(0.6, "gnmt", "every_beam")))
  for b in range(toy.batch):
    best = brute_force(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len, 0.6)[0]
    np.testing.assert_array_equal(sequences[b, 0], padded(best[2], toy.max_len))
    np.testing.assert_allclose(scores[b, 0], best[1], rtol=2e-6)


def test_greedy_slots_equal_numpy_greedy():
  toy = HashToy(seed=11, batch=4, max_len=6, vocab=6)
  sequences, scores = run_slots(toy, slots.SequentialSlots("greedy"))
  for b in range(toy.batch):
    expected, total = numpy_greedy(toy, b)
    np.testing.assert_array_equal(sequences[b, 0], expected)
    np.testing.assert_allclose(scores[b, 0], total, rtol=2e-6)


def test_constrained_slots_answer_what_the_batched_constrained_search_answers():
  """`ConstrainedBeamSlots` from each sentence's plain answer (its `BeamSlots` slot's), the slots
  started at different times, against the batched constrained search (itself checked against
  NumPy references of DBA in tests/test_decoding_constraints.py): the same hypotheses and
  scores, for a sentence whose plain best holds its terms (complete at once with the plain
  answer), sentences it does not settle (one and two phrases, ordered) and one without."""
  toy = HashToy(seed=29, batch=4, max_len=7, vocab=8, eos_logits=-2.0)
  ranking, beams = Ranking(0.6, "gnmt", "top_k"), 3
  plain = run_slots(toy, slots.BeamSlots(beams, ranking))
  best = [int(t) for t in plain[0][0, 0] if t not in (PAD, EOS)]
  words = [t for i, t in enumerate(best) if not CONTINUES[t]
           and (i + 1 == len(best) or not CONTINUES[best[i + 1]])]  # One-piece words.
  phrases = np.zeros((toy.batch, 2, 2), np.int32)  # [B, C, P]
  phrases[0, 0, 0] = words[-1]  # Settled by the plain answer.
  phrases[1, 0] = (6, 3)  # "6 3" as a word of its own, then "4".
  phrases[1, 1, 0] = 4
  phrases[3, 0, 0] = 7  # Sentence 2: none.
  # Ordered (unordered: tests/test_serving_engine.py, on a trained model).
  problem = SearchProblem(toy.step, toy.initial_state(), batch_size=toy.batch,
                          max_decode_len=toy.max_len, eos_id=EOS, constraints=phrases,
                          ordered_constraints=True,
                          word_continues=jnp.asarray(CONTINUES[:toy.vocab]))
  expected = jax.jit(lambda: beam_search(problem, beam_size=beams, ranking=ranking))()
  sequences, scores = run_slots(toy, slots.ConstrainedBeamSlots(beams, ranking), phrases,
                                plain, ordered=True)
  np.testing.assert_array_equal(sequences, expected[0])
  # Float32 rounding apart: the plain answers' scores come from programs of other shapes.
  np.testing.assert_allclose(scores, expected[1], rtol=2e-6)
  assert not np.array_equal(sequences[1], plain[0][1])  # The terms changed it.
  np.testing.assert_array_equal(sequences[0], plain[0][0])  # Settled: the plain answer.
  assert scores[0, 0] == plain[1][0, 0]
