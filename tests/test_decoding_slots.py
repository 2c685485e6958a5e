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

from flax_transformer.decoding import slots
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


def slot_problem(toy: HashToy, table: jax.Array, initial_hash: jax.Array) -> SearchProblem:
  """Sentence b's problem (B = 1): its own table and start hash."""
  state = {"hash": initial_hash, "index": jnp.zeros((), jnp.int32)}
  return SearchProblem(toy.step, state, batch_size=1, max_decode_len=toy.max_len, eos_id=EOS,
                       shared_state={"table": table})


def run_slots(toy: HashToy, machine) -> tuple[np.ndarray, np.ndarray]:
  """Every sentence of `toy` in its own slot, slot b starting at STARTS[b] and stepped on every
  global step after that, as `serving.engine.advance` steps a table; each slot's result read
  once it is complete. Returns sequences [B, K, L] and scores [B, K]."""
  tables = jnp.asarray(toy.table)[:, None]  # [B, 1, hashes, V]
  hashes = jnp.asarray(toy.initial_hash)[:, None]  # [B, 1]
  state = jax.vmap(lambda t, h: machine.start(slot_problem(toy, t, h)))(tables, hashes)

  @jax.jit
  def global_step(state, started):
    stepped = jax.vmap(lambda t, h, s: machine.step(slot_problem(toy, t, h), s))(
        tables, hashes, state)
    keep = lambda new, old: jnp.where(
        started.reshape(-1, *([1] * (new.ndim - 1))), new, old)
    return jax.tree.map(keep, stepped, state)

  complete = jax.vmap(lambda t, h, s: machine.complete(slot_problem(toy, t, h), s)[0])
  results = {}
  for time in range(max(STARTS) + 4 * toy.max_len):
    started = jnp.asarray([time >= s for s in STARTS[:toy.batch]])
    state = global_step(state, started)
    done = np.asarray(complete(tables, hashes, state))
    sequences, scores = jax.vmap(lambda t, h, s: machine.result(slot_problem(toy, t, h), s))(
        tables, hashes, state)
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
