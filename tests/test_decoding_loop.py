"""`decoding.loop`: a growing state by segments and several steps per loop iteration change
no output of any search (brute force, NumPy greedy)."""

import functools
import itertools

import jax
import numpy as np
import pytest

from flax_transformer.decoding import (
  Ranking,
  SearchProblem,
  beam_search,
  greedy_search,
  loop,
  sample,
)
from flax_transformer.decoding.loop import LoopOptions

from search_toys import (
  EOS,
  PAD,
  HistoryToy,
  assert_matches_brute_force,
  fixed_step,
  numpy_greedy,
)


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
    return beam_search(problem, beam_size=beam_size, ranking=ranking,  # Two steps a turn.
                       loop_options=LoopOptions(segment_length, steps_per_iteration=2))

  sequences, scores = run(toy.initial_state(1), beam_size=81,
                          resize_state=HistoryToy.resize, segment_length=2)
  assert sorted(set(toy.capacities)) == [2, 4, 5]
  assert_matches_brute_force(sequences, scores, toy, alpha)
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
                                  ranking=Ranking(0.6, finish_rule="every_beam"),
                                  loop_options=LoopOptions(steps_per_iteration=2))
  with pytest.raises(AssertionError):
    assert_matches_brute_force(sequences, scores, toy, 0.6)


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
    expected, total = numpy_greedy(toy, b, min_length=2)
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


# 1: the CPU's default; 2: the GPU's for beams, a divisor of L = 10; 3 and 8: neither, and 8
# runs past the early exit within its first iteration. (4 added nothing to 3 and 8 but five
# compiles a case.)
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
  assert loop.default_steps_per_iteration(beam=True) == 1
  assert loop.default_steps_per_iteration(beam=False) == 1
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert loop.default_steps_per_iteration(beam=True) == 2
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # Unlisted: the CPU's settings.
  assert loop.default_steps_per_iteration(beam=True) == 1
  with pytest.raises(ValueError, match="steps_per_iteration must be a positive int"):
    greedy_search(SearchProblem(fixed_step, {}, batch_size=1, max_decode_len=3, eos_id=EOS),
                  loop_options=LoopOptions(steps_per_iteration=0))
