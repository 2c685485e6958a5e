"""`decoding.beam`: beam search on toy step functions whose answers are known or enumerable:
brute force, the field's rule in NumPy, a Markov chain's analytic optimum."""

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
  sample,
  search,
)

from search_toys import (
  EOS,
  PAD,
  A,
  B,
  HashToy,
  assert_matches_brute_force,
  assert_matches_field_rule,
  brute_force,
  divisor,
  length_penalty,
  padded,
  search_toy,
)

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
  np.testing.assert_array_equal(beam[0, 0], padded(best, 3))
  np.testing.assert_allclose(beam_scores[0, 0], np.log(probs[best]), rtol=1e-6)
  np.testing.assert_array_equal(greedy[0], [A, EOS, PAD])
  np.testing.assert_allclose(greedy_score[0], np.log(0.27), rtol=1e-6)
  assert beam_scores[0, 0] > greedy_score[0]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_as_large_as_the_prefix_count_equals_brute_force(alpha):
  # 3 emittable tokens, L = 3: at most 9 alive prefixes, 13 finished and 27 unfinished
  # hypotheses; K = 16 also shows 3 unfinished ones ranked after the 13 finished.
  toy = HashToy(seed=int(alpha * 10), batch=2, max_len=3)
  sequences, scores = search_toy(toy, beams=16, alpha=alpha, mode="shared")
  assert sequences.shape == (2, 16, 3) and sequences.dtype == jnp.int32
  assert_matches_brute_force(sequences, scores, toy, alpha)


@pytest.mark.parametrize("limits", [dict(max_lengths=[1, 2]), dict(min_length=2)])
def test_length_limits_equal_brute_force_with_the_same_limits(limits):
  toy = HashToy(seed=3, batch=2, max_len=3)
  kwargs = dict(limits)
  if "max_lengths" in kwargs:
    kwargs["max_lengths"] = jnp.asarray(kwargs["max_lengths"], jnp.int32)
  sequences, scores = search_toy(toy, beams=9, alpha=0.6, **kwargs)
  assert_matches_brute_force(sequences, scores, toy, 0.6, **limits)
  lengths = np.sum(np.asarray(sequences) != PAD, axis=-1)  # [B, K]
  if "max_lengths" in limits:
    assert lengths[0].max() == 2 and lengths[1].max() == 3  # tokens incl. EOS <= cap + 1
  else:
    assert lengths.min() == 3  # no EOS before 2 tokens


def test_shared_state_equals_the_same_table_carried_per_beam():
  # Per-beam state is repeated and reordered every step; shared state must reach every beam of
  # its sentence untouched. Both routes must give the brute-force answer.
  toy = HashToy(seed=5, batch=3, max_len=4)
  shared = search_toy(toy, beams=4, alpha=0.6, mode="shared")
  per_beam = search_toy(toy, beams=4, alpha=0.6, mode="state")
  np.testing.assert_array_equal(shared[0], per_beam[0])
  np.testing.assert_allclose(shared[1], per_beam[1], rtol=1e-6)
  for b in range(toy.batch):
    expected = brute_force(functools.partial(toy.log_probs, b), toy.vocab, toy.max_len, 0.6)
    np.testing.assert_array_equal(shared[0][b, 0], padded(expected[0][2], toy.max_len))


def test_sequences_hold_one_eos_then_zeros_and_finished_rank_first():
  # EOS is possible but unlikely: unfinished hypotheses have higher raw scores, yet every
  # finished one ranks above them.
  toy = HashToy(seed=7, batch=2, max_len=3, eos_logits=-6.0)
  sequences, scores = search_toy(toy, beams=16, alpha=0.6)
  assert_matches_brute_force(sequences, scores, toy, 0.6)
  seqs = np.asarray(sequences)
  finished = (seqs == EOS).any(-1)  # [B, K]
  assert finished[:, :13].all() and not finished[:, 13:].any()
  assert (np.asarray(scores)[:, 13:].max(-1) > np.asarray(scores)[:, :13].min(-1)).all()
  for seq in seqs[finished]:
    end = list(seq).index(EOS)
    assert (seq[:end] != PAD).all() and (seq[end + 1:] == PAD).all()


def test_no_hypothesis_finishes_all_rank_by_normalized_score():
  toy = HashToy(seed=8, batch=2, max_len=3, eos_logits=-np.inf)
  sequences, scores = search_toy(toy, beams=5, alpha=0.6)
  assert not (np.asarray(sequences) == EOS).any()
  assert_matches_brute_force(sequences, scores, toy, 0.6)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_one_equals_greedy(alpha):
  # EOS is impossible before position 4 and nearly certain there, so greedy's answer is also
  # the best answer on the greedy path (beam 1 keeps finished hypotheses apart).
  eos_logits = np.array([-np.inf] * 4 + [30.0] * 4, np.float32)
  toy = HashToy(seed=11, batch=3, max_len=8, vocab=7, eos_logits=eos_logits)
  greedy, greedy_scores = greedy_search(SearchProblem(toy.step, toy.initial_state(),
                                                      batch_size=3, max_decode_len=8, eos_id=EOS))
  beam, beam_scores = search_toy(toy, beams=1, alpha=alpha)
  np.testing.assert_array_equal(np.asarray(greedy)[:, 4], EOS)
  np.testing.assert_array_equal(beam[:, 0], greedy)
  np.testing.assert_allclose(beam_scores[:, 0], greedy_scores / length_penalty(5, alpha),
                             rtol=1e-6)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("normalization", search.LENGTH_NORMALIZATIONS)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("beams", [2, 4])
def test_top_k_rule_equals_the_peers_rule_in_numpy(beams, alpha, normalization):
  # EOS is likely (logit +1 against four N(0, 4) tokens): hypotheses finish at every length,
  # several at one step, and many EOS extensions rank below the K best and must not finish.
  toy = HashToy(seed=61, batch=4, max_len=7, vocab=6, eos_logits=1.0)
  assert_matches_field_rule(toy, beams, alpha, normalization)


@pytest.mark.parametrize("limits", [dict(min_length=3), dict(max_lengths=[1, 4, 0, 6])])
def test_top_k_rule_with_length_limits_equals_numpy(limits):
  toy = HashToy(seed=62, batch=4, max_len=7, vocab=6, eos_logits=1.0)
  assert_matches_field_rule(toy, 3, 0.6, "gnmt", **limits)


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_top_k_rule_ranks_beams_cut_at_the_limit_with_the_finished_ones(alpha):
  # EOS rarer and L short: the limit stops most sentences with some hypotheses finished, and a
  # cut beam may outrank a finished one (CTranslate2 finishes every beam at its last step).
  toy = HashToy(seed=63, batch=6, max_len=4, vocab=6, eos_logits=-0.5)
  assert_matches_field_rule(toy, 4, alpha, "fairseq")
  sequences, _ = search_toy(toy, beams=4, alpha=alpha, finish_rule="top_k",
                         length_normalization="fairseq")
  ends = [[EOS in row for row in rows] for rows in np.asarray(sequences).tolist()]
  # The control: some sentence ranks a cut beam above a finished hypothesis.
  assert any(not e[i] and any(e[i + 1:]) for e in ends for i in range(len(e))), ends


def test_top_k_rule_differs_from_every_beam_where_eos_has_weight():
  # The control: the two rules must disagree on this toy, or the tests above prove nothing.
  toy = HashToy(seed=61, batch=4, max_len=7, vocab=6, eos_logits=1.0)
  top_k = search_toy(toy, beams=4, alpha=0.6, finish_rule="top_k")[0]
  every_beam = search_toy(toy, beams=4, alpha=0.6, finish_rule="every_beam")[0]
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
    beam, beam_scores = search_toy(toy, beams=1, alpha=0.6, finish_rule="top_k",
                                length_normalization=normalization, **kwargs)
    np.testing.assert_array_equal(beam[:, 0], greedy)
    lengths = (np.asarray(greedy) != PAD).sum(-1)
    divisors = [divisor(n, 0.6, normalization) for n in lengths]
    np.testing.assert_allclose(beam_scores[:, 0], np.asarray(greedy_scores) / divisors,
                               rtol=1e-6)


def test_every_beam_rule_with_one_beam_is_not_greedy_where_eos_has_weight():
  toy = HashToy(seed=71, batch=5, max_len=8, vocab=9, eos_logits=0.5)
  greedy, _ = greedy_search(SearchProblem(toy.step, toy.initial_state(), batch_size=5,
                                          max_decode_len=8, eos_id=EOS))
  beam, _ = search_toy(toy, beams=1, alpha=0.6, finish_rule="every_beam")
  assert not np.array_equal(np.asarray(beam[:, 0]), np.asarray(greedy))


def test_length_normalizations_follow_their_formulas():
  for n in (1, 2, 7, 30):
    for alpha in (0.0, 0.6, 1.0):
      for normalization in search.LENGTH_NORMALIZATIONS:
        np.testing.assert_allclose(search.length_penalty_divisor(n, alpha, normalization),
                                   divisor(n, alpha, normalization), rtol=1e-6)
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
  eager = search_toy(toy, beams=3, alpha=0.6, mode="shared", max_lengths=caps)
  np.testing.assert_array_equal(jitted[0], eager[0])
  np.testing.assert_allclose(jitted[1], eager[1], rtol=1e-6)
  best, best_score = search_toy(toy, beams=3, alpha=0.6, mode="shared", max_lengths=caps,
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


def test_large_vocabulary_beam_search_equals_the_lax_top_k_version(monkeypatch):
  toy = HashToy(seed=29, batch=2, max_len=5, vocab=1009)
  blocked = search_toy(toy, beams=4, alpha=0.6)
  monkeypatch.setattr(beam_state, "top_k", lambda x, k: jax.lax.top_k(x, k))
  reference = search_toy(toy, beams=4, alpha=0.6)
  np.testing.assert_array_equal(blocked[0], reference[0])
  np.testing.assert_allclose(blocked[1], reference[1], rtol=1e-6)
