"""Decoding with the real (tiny, random) Transformer, and sacreBLEU scoring.

References: the model's own teacher-forced forward pass (rescoring), a search that recomputes
cross-attention from a per-beam copy of the encoder output, greedy decoding, and a hand-written
BLEU for `score_translations`.
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import ModelConfig, Transformer
from flax_transformer.decoding import (
  Ranking,
  SearchProblem,
  beam_search,
  greedy_search,
  sample,
)
from flax_transformer.decoding.bridge import (
  grows_cache,
  make_tokens_to_logits,
  output_length_caps,
  prepare_search,
  sequence_log_probs,
)
from flax_transformer.decoding.loop import LoopOptions
from flax_transformer.scoring import score_translations

import numpy_reference

VOCAB, EOS, MAX_LEN = 19, 1, 6


@pytest.fixture(scope="module")
def model_and_variables():
  model = Transformer(ModelConfig.tiny(VOCAB, dropout_rate=0.0, attention_dropout_rate=0.0))
  # Source rows ending with EOS, padded differently: lengths 5, 3, 4.
  inputs = jnp.asarray([[5, 7, 9, 4, 1, 0], [3, 8, 1, 0, 0, 0], [12, 6, 17, 1, 0, 0]], jnp.int32)
  variables = model.init(jax.random.key(0), inputs, jnp.ones((3, MAX_LEN), jnp.int32))
  return model, variables, inputs


def translate_ids(model, variables, inputs, *, method="beam", max_decode_len, max_len_a=0.0,
                  max_len_b=None, grow_cache=False, segment_length=None,
                  steps_per_iteration=None, eos_id=EOS, min_length=0, beam_size=1,
                  length_penalty=0.6, finish_rule="top_k", return_all=True, **options):
  """prepare_search, then the search of `method` called directly, as callers do."""
  assert eos_id == EOS
  problem = prepare_search(model, variables, inputs, max_decode_len=max_decode_len,
                           max_len_a=max_len_a, max_len_b=max_len_b, min_length=min_length,
                           grow_cache=grow_cache)
  loop_options = LoopOptions(
      segment_length=segment_length or LoopOptions().segment_length,
      steps_per_iteration=steps_per_iteration)
  if method == "beam":
    return beam_search(problem, beam_size=beam_size, return_all=return_all,
                       ranking=Ranking(length_penalty, finish_rule=finish_rule),
                       loop_options=loop_options, **options)
  if method == "greedy":
    return greedy_search(problem, loop_options=loop_options, **options)
  return sample(problem, loop_options=loop_options, **options)


def _teacher_forced_scores(model, variables, inputs, sequences, alpha):
  """Length-normalized log-probability of every hypothesis [B, K, L] by the full forward pass."""
  batch, beams, length = sequences.shape
  targets = sequences.reshape(batch * beams, length)
  logits = model.apply(variables, jnp.repeat(inputs, beams, axis=0), targets)  # [B*K, L, V]
  log_probs = np.asarray(jax.nn.log_softmax(logits), np.float64)
  targets = np.asarray(targets)
  token_log_probs = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  lengths = (targets != 0).sum(-1)  # Hypotheses hold no zeros before EOS.
  totals = np.where(np.arange(length) < lengths[:, None], token_log_probs, 0.0).sum(-1)
  return (totals / ((5.0 + lengths) / 6.0) ** alpha).reshape(batch, beams)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_beam_scores_equal_teacher_forced_rescoring(model_and_variables):
  model, variables, inputs = model_and_variables
  search = jax.jit(lambda v, x: translate_ids(model, v, x, beam_size=3, max_decode_len=MAX_LEN,
                                              length_penalty=0.6, return_all=True))
  sequences, scores = search(variables, inputs)
  assert sequences.shape == (3, 3, MAX_LEN) and scores.shape == (3, 3)
  finished = (np.asarray(sequences) == EOS).any(-1)  # [B, K]; finished ones rank first
  assert (np.diff(finished.astype(int), axis=1) <= 0).all()
  for b in range(3):
    assert (np.diff(np.asarray(scores[b])[finished[b]]) <= 0).all()
  expected = _teacher_forced_scores(model, variables, inputs, np.asarray(sequences), 0.6)
  np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)
  # Distinct hypotheses per sentence (the beams did not collapse onto one).
  for b in range(3):
    assert len({tuple(row) for row in np.asarray(sequences[b])}) == 3


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_shared_cross_attention_equals_recomputing_it_per_beam(model_and_variables):
  model, variables, inputs = model_and_variables
  options = dict(beam_size=4, max_decode_len=MAX_LEN, length_penalty=0.6, eos_id=EOS,
                 return_all=True)
  shared = translate_ids(model, variables, inputs, **options)

  # The reference keeps a per-beam copy of the encoder output in the (reordered) state and
  # projects cross-attention keys/values from it at every step.
  def recomputing_step(ids, state):
    cache, encoded, source = state
    cross = model.apply(variables, encoded, source,
                        method=Transformer.precompute_cross_attention)  # leads with B*K
    logits, cache = model.apply(variables, ids, cache, cross, method=Transformer.decode_step)
    return logits, (cache, encoded, source)

  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cache = model.apply(variables, 3, MAX_LEN, method=Transformer.init_cache)
  problem = SearchProblem(recomputing_step, (cache, encoded, inputs), batch_size=3,
                          max_decode_len=MAX_LEN, eos_id=EOS)
  reference = beam_search(problem, beam_size=4, ranking=Ranking(0.6))
  np.testing.assert_array_equal(shared[0], reference[0])
  np.testing.assert_allclose(shared[1], reference[1], atol=1e-5, rtol=0)


# A cache of all L positions from the start, and a growing one: segment_length 3 (rounded up
# to 4) gives capacities 4, 8, 10 at L = 10, and 4, 6 at L = 6, resized while beams reorder.
GROWTH = [dict(grow_cache=False), dict(grow_cache=True, segment_length=3)]


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("growth", GROWTH, ids=["fixed_cache", "growing_cache"])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_cached_beam_search_equals_a_search_that_recomputes_every_prefix(model_and_variables,
                                                                         alpha, growth):
  # The reference has no cache at all: its state is the tokens decoded so far (reordered with
  # the beams), and each step runs the full teacher-forced model on them. The cached search
  # must find the same hypotheses. EOS is forbidden for 7 tokens so that beams live long and
  # are reordered many times (a cache that did not follow its beam would be caught).
  model, variables, inputs = model_and_variables
  beams, length, min_length = 4, 10, 7
  cached = translate_ids(model, variables, inputs, beam_size=beams, max_decode_len=length,
                         length_penalty=alpha, eos_id=EOS, min_length=min_length,
                         return_all=True, **growth)

  def full_forward_step(ids, state, source):
    tokens, index = state["tokens"], state["index"]  # [B*K, L], []
    tokens = jnp.where(index > 0, tokens.at[:, index - 1].set(ids[:, 0]), tokens)
    # Positions from `index` on are unknown; any non-padding id keeps position `index` a query.
    targets = jnp.where(jnp.arange(length) < index, tokens, 3)
    rows = ids.shape[0]
    sources = jnp.repeat(source, rows // source.shape[0], axis=0)
    logits = model.apply(variables, sources, targets)[:, jnp.minimum(index, length - 1)]
    return logits, {"tokens": tokens, "index": index + 1}

  state = {"tokens": jnp.zeros((3, length), jnp.int32), "index": jnp.zeros((), jnp.int32)}
  problem = SearchProblem(full_forward_step, state, shared_state=inputs, batch_size=3,
                          max_decode_len=length, eos_id=EOS, min_length=min_length)
  reference = beam_search(problem, beam_size=beams, ranking=Ranking(alpha))
  lengths = (np.asarray(reference[0]) != 0).sum(-1)
  assert lengths.min() >= min_length + 1  # Long hypotheses: beams really get reordered.
  np.testing.assert_array_equal(cached[0], reference[0])
  np.testing.assert_allclose(cached[1], reference[1], atol=1e-5, rtol=0)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("options", [dict(method="beam", grow_cache=False),
                                     dict(method="beam", grow_cache=True, segment_length=3),
                                     dict(method="greedy", grow_cache=True, segment_length=3)],
                         ids=["beam_fixed_cache", "beam_growing_cache", "greedy_growing_cache"])
def test_steps_per_iteration_changes_no_output_of_the_model(model_and_variables, options):
  # L = 10 with EOS free from 4 tokens on: loops that stop early or run past L for k = 3, 8
  # (k that divides L: test_decoding_loop's chains, for every method and finishing rule).
  # A fixed cache gives bit-identical scores. A growing one has capacities that depend on k
  # (multiples of it), and attention over a different number of empty positions may round
  # differently, so there the scores agree to float32 rounding.
  model, variables, inputs = model_and_variables
  results = [translate_ids(model, variables, inputs, beam_size=3, max_decode_len=10,
                           eos_id=EOS, min_length=4, return_all=True, steps_per_iteration=k,
                           **options) for k in (None, 3, 8)]  # None: 1 on a CPU.
  tolerance = 1e-6 if options["grow_cache"] else 0.0
  for sequences, scores in results[1:]:
    np.testing.assert_array_equal(sequences, results[0][0])
    np.testing.assert_allclose(scores, results[0][1], rtol=tolerance, atol=0)


def test_grow_cache_runs_one_loop_per_segment_and_by_default_only_for_beams_on_cpu(
    model_and_variables):
  # Outputs alone cannot tell a growing cache from a fixed one; the program can: one while
  # loop per capacity of loop.growth_schedule(10, 3, k): (3, 6, 9, 10) with CPU's k = 1 step
  # per iteration, (4, 8, 10) with k = 2.
  model, variables, inputs = model_and_variables

  def loops(**options):
    jaxpr = jax.make_jaxpr(lambda v, x: translate_ids(
        model, v, x, max_decode_len=10, segment_length=3, **options))(
            variables, inputs)
    return sum(equation.primitive.name == "while" for equation in jaxpr.jaxpr.eqns)

  assert loops(beam_size=2, grow_cache=True) == 4 and loops(beam_size=2, grow_cache=False) == 1
  assert loops(beam_size=2, grow_cache=True, steps_per_iteration=2) == 3
  assert loops(method="greedy", grow_cache=True) == 4
  # "auto": beam search grows on CPU only; greedy decoding and sampling never.
  assert grows_cache("auto", "beam") == (jax.default_backend() == "cpu")
  # A few sentences (a notebook, a short command) keep the cache fixed: their program loads
  # in half the time; a bulk job's batches grow it.
  assert not grows_cache("auto", "beam", rows=8)
  assert grows_cache("auto", "beam", rows=9) == (jax.default_backend() == "cpu")
  assert grows_cache("yes", "beam", rows=1)
  assert not grows_cache("auto", "greedy") and not grows_cache("auto", "sample")
  assert grows_cache("yes", "greedy") and not grows_cache("no", "beam")
  with pytest.raises(ValueError, match="grow_cache must be one of"):
    grows_cache("maybe", "beam")


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("growth", GROWTH, ids=["fixed_cache", "growing_cache"])
def test_greedy_equals_beam_one_and_its_own_rescoring(model_and_variables, growth):
  # EOS forbidden before L - 1 tokens and forced after them: beam 1 must then follow exactly
  # the greedy path (it keeps finished hypotheses apart, so with EOS free it may differ).
  model, variables, inputs = model_and_variables
  options = dict(max_decode_len=MAX_LEN, eos_id=EOS, min_length=MAX_LEN - 1, max_len_a=0.0,
                 max_len_b=MAX_LEN - 1, **growth)
  greedy, greedy_scores = translate_ids(model, variables, inputs, method="greedy", **options)
  beam, beam_scores = translate_ids(model, variables, inputs, method="beam", beam_size=1,
                                    length_penalty=0.0, return_all=False, **options)
  np.testing.assert_array_equal(np.asarray(greedy)[:, -1], EOS)
  np.testing.assert_array_equal(beam, greedy)
  np.testing.assert_allclose(beam_scores, greedy_scores, atol=1e-5, rtol=0)
  expected = _teacher_forced_scores(model, variables, inputs, np.asarray(greedy)[:, None], 0.0)
  np.testing.assert_allclose(greedy_scores, expected[:, 0], atol=1e-4, rtol=0)


def test_relative_length_cap_forces_eos(model_and_variables):
  model, variables, inputs = model_and_variables
  # Source lengths 5, 3, 4 -> at most floor(0.5 * n + 1) = 3, 2, 3 tokens before EOS. With
  # min_length 3 every hypothesis ends exactly at its cap (the cap wins over min_length).
  sequences, _ = translate_ids(model, variables, inputs, beam_size=2, max_decode_len=MAX_LEN,
                               eos_id=EOS, max_len_a=0.5, max_len_b=1, min_length=3,
                               return_all=True)
  assert (np.asarray(sequences) == EOS).any(-1).all()
  tokens_before_eos = np.argmax(np.asarray(sequences) == EOS, axis=-1)  # [B, K]
  np.testing.assert_array_equal(tokens_before_eos, [[3, 3], [2, 2], [3, 3]])


def test_sampling_runs_with_the_model_and_scores_its_samples(model_and_variables):
  model, variables, inputs = model_and_variables
  sequences, scores = translate_ids(model, variables, inputs, method="sample",
                                    rng=jax.random.key(3), max_decode_len=MAX_LEN, eos_id=EOS,
                                    top_k=5, top_p=0.9)
  expected = _teacher_forced_scores(model, variables, inputs, np.asarray(sequences)[:, None], 0.0)
  np.testing.assert_allclose(scores, expected[:, 0], atol=1e-4, rtol=0)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_make_tokens_to_logits_matches_decode_step(model_and_variables):
  model, variables, inputs = model_and_variables
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  cache = model.apply(variables, 3, MAX_LEN, method=Transformer.init_cache)
  ids = jnp.zeros((3, 1), jnp.int32)
  logits, new_cache = make_tokens_to_logits(model, variables)(ids, cache, cross)
  teacher_forced = model.apply(variables, inputs, jnp.full((3, 1), 4, jnp.int32))[:, 0]
  np.testing.assert_allclose(logits, teacher_forced, atol=1e-5, rtol=0)
  assert int(new_cache.index) == 1


def test_score_translations_matches_a_hand_written_bleu():
  hypotheses = ["the cat sat on the mat today", "a dog runs in the big green park",
                "we like long walks by the sea"]
  references = ["the cat sat on the red mat today", "a dog runs in the green park",
                "we like long walks along the sea"]
  result = score_translations(hypotheses, references)
  assert result["bleu"] == pytest.approx(numpy_reference.bleu(hypotheses, references), abs=1e-9)
  assert result["num_sentences"] == 3
  assert "tok:13a" in result["bleu_signature"] and "case:mixed" in result["bleu_signature"]
  assert result["chrf_signature"].startswith("nrefs:1") and 0 < result["chrf"] < 100
  cased = score_translations([h.capitalize() for h in hypotheses], references)
  assert cased["bleu"] < result["bleu"] and cased["chrf"] < result["chrf"]
  identical = score_translations(references, references)
  assert identical["bleu"] == pytest.approx(100.0) and identical["chrf"] == pytest.approx(100.0)


def test_score_translations_rejects_misaligned_lists():
  with pytest.raises(ValueError, match="hypotheses has 2 lines but references has 1 line;"):
    score_translations(["a b", "c d"], ["a b"])


def _numpy_sequence_log_prob(model, variables, source, target):
  """log p(target | source) of one pair (no padding): numpy_reference's float64 forward pass
  and log-softmax, summed at the target ids."""
  params = nn.unbox(variables)["params"]
  logits = numpy_reference.transformer(params, model.config, np.asarray([source]),
                                       np.asarray([target]))[0]  # [T, V]
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return float(log_probs[np.arange(len(target)), target].sum())


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_sequence_log_probs_equal_a_numpy_log_softmax_per_pair(model_and_variables):
  model, variables, inputs = model_and_variables
  targets = [[4, 9, 1], [7, 1], [12, 3, 3, 5, 1]]  # Ending with EOS, three lengths.
  padded = np.zeros((3, 7), np.int32)
  for row, target in enumerate(targets):
    padded[row, : len(target)] = target
  got = np.asarray(jax.jit(lambda v, x, y: sequence_log_probs(model, v, x, y))(
      variables, inputs, jnp.asarray(padded)))
  sources = [np.asarray(row)[np.asarray(row) != 0] for row in np.asarray(inputs)]
  expected = [_numpy_sequence_log_prob(model, variables, s, np.asarray(t))
              for s, t in zip(sources, targets, strict=True)]
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
  assert got.dtype == np.float32 and (got < 0).all()
  # An all-padding row (batch padding) scores 0 and changes no other row, to float32 rounding:
  # another batch size may block the matmuls differently (on AMD EPYC a sum of -17.4 moved by
  # 2e-6, 1 ulp per token); rtol 5e-7 allows about 4 ulp of each sum, where a row that saw the
  # padding row would move by far more.
  with_empty = np.concatenate([padded, np.zeros((1, 7), np.int32)])
  empty_inputs = jnp.concatenate([inputs, jnp.zeros((1, inputs.shape[1]), jnp.int32)])
  got_more = np.asarray(sequence_log_probs(model, variables, empty_inputs, with_empty))
  np.testing.assert_allclose(got_more, [*got, 0.0], atol=1e-6, rtol=5e-7)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_empty_rows_end_at_once_and_change_no_other_row(model_and_variables):
  model, variables, inputs = model_and_variables
  padded = jnp.concatenate([inputs, jnp.zeros((1, inputs.shape[1]), jnp.int32)])  # Row 3 empty.
  caps = output_length_caps(padded, 1.0, 50)
  np.testing.assert_array_equal(caps, [55, 53, 54, 0])
  # Past int32 (a request's max_len_b, a huge max_len_a): no cap, where it overflowed.
  for a, b in ((1.0, 10**11), (1e300, 50), (0.0, 2**31), (float("inf"), 10**400)):
    np.testing.assert_array_equal(output_length_caps(padded, a, b), [1 << 30] * 3 + [0])
  options = dict(beam_size=2, max_decode_len=MAX_LEN, eos_id=EOS, max_len_a=1.0, max_len_b=50,
                 length_penalty=0.6, return_all=True)
  alone = translate_ids(model, variables, inputs, **options)
  more = translate_ids(model, variables, padded, **options)
  np.testing.assert_array_equal(more[0][:3], alone[0])
  np.testing.assert_allclose(more[1][:3], alone[1], atol=1e-6, rtol=0)
  assert int(more[0][3, 0, 0]) == EOS  # The empty row's best hypothesis is EOS alone.
