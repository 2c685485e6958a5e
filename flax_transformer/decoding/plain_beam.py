"""The plain beam search (no constraints): K alive beams and K finished hypotheses per
sentence, kept apart, under a `search.Ranking`'s finishing rule and length normalization
(`beam.beam_search` is its public entry). `run`, the loop around a beam step, is the setup both
beam searches share: the constrained one (`constrained_beam`) runs it with its own step and
calls `search` for its plain answer first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.decoding import loop
from flax_transformer.decoding.beam_state import (
  NEG_INF,
  BeamState,
  Finished,
  StepContext,
  advanced,
  beam_rows,
  best_possible,
  demote_second_eos,
  finish,
  initial_beam_state,
  ranked_hypotheses,
  scored_step,
)
from flax_transformer.decoding.loop import LoopOptions
from flax_transformer.decoding.search import Ranking, SearchProblem, check_step_fn

Array = jax.Array


def search(problem: SearchProblem, beam_size: int, ranking: Ranking,
           loop_options: LoopOptions) -> tuple[Array, Array]:
  """Beam search without constraints (`problem.constraints` is not read): (sequences int32
  [B, K, L], scores float32 [B, K]), best first, as `beam.beam_search` returns them."""
  final = run(problem, beam_size, ranking, loop_options, beam_step)
  return ranked_hypotheses(final, ranking)


def run(problem: SearchProblem, beam_size: int, ranking: Ranking, loop_options: LoopOptions,
        step: Callable[[StepContext, BeamState], BeamState],
        start: Callable[[BeamState], BeamState] = lambda state: state) -> BeamState:
  """A beam search's loop: the state of K beams (`beam_start`, then `start` of it), checked
  against the step function, then `step` until every sentence is done or L steps ran, the
  callable's state grown segment by segment (`loop.segmented_loop`). Returns the final state."""
  steps = loop.resolved_steps("beam_search", loop_options.steps_per_iteration, beam=True)
  capacities, initial_state = loop.capacities(problem.max_decode_len, problem.resize_state,
                                              loop_options.segment_length, steps,
                                              problem.initial_state)
  state = start(beam_start(problem, beam_size, initial_state))
  check_step_fn(problem.step_fn(), state.last_ids.reshape(-1, 1), state.alive_state,
                problem.eos_id)
  step = functools.partial(step, StepContext.of(problem, beam_rows(problem)[1], ranking))
  grow = lambda s, capacity: s.replace(
      alive_state=loop.resized(problem.resize_state, s.alive_state, capacity))
  return loop.segmented_loop(capacities, grow, lambda s: ~jnp.all(s.done), step, steps, state)


def beam_start(problem: SearchProblem, beam_size: int, initial_state=None) -> BeamState:
  """Beam search's loop state before step 0: the callable's state (`initial_state`, default
  the problem's) expanded to K beams, only beam 0 alive."""
  expand, _ = beam_rows(problem)
  initial_state = problem.initial_state if initial_state is None else initial_state
  return initial_beam_state(expand(initial_state, beam_size), problem.batch_size, beam_size,
                            problem.max_decode_len, problem.bos_id)


def beam_step(context: StepContext, state: BeamState) -> BeamState:
  """One position for every beam: score the candidates, keep K finished and K alive.

  A loop iteration runs k steps (`loop.segmented_loop`), so steps can follow the last position or
  the early exit. A step past L changes nothing but the state. A step after a sentence is
  `done` changes none of its outputs: its EOS candidates are dropped, and `ranked_hypotheses`
  reads its alive beams only when it is not done ("top_k") or has fewer than K finished
  ("every_beam"), which `done` allows only when no alive beam (all -inf) is left.
  ("every_beam": a done sentence's EOS candidates could not have entered its K finished
  anyway, see `_every_beam_done`.)
  """
  batch, beams, max_len = state.alive_seqs.shape
  valid = state.step < max_len
  scored, new_state = scored_step(context, state)
  token_log_probs = scored.token_log_probs

  # Alive candidates: the C best non-EOS tokens of every beam -> [B, K*C], keep the K best.
  candidates = state.alive_log_probs[..., None] + token_log_probs.reshape(batch, beams, -1)
  candidates = jnp.where(scored.forced[:, None], NEG_INF, candidates.reshape(batch, -1))
  alive_log_probs, flat = lax.top_k(candidates, beams)  # [B, K]

  # Finished candidates: alive beams followed by EOS -> [B, K], summed log-probabilities.
  eos_sums = state.alive_log_probs + scored.eos_log_probs.reshape(batch, beams)
  finishes = (scored.eos_allowed[:, None] & valid & ~state.done[:, None]
              & (eos_sums > NEG_INF))
  ranking = context.ranking
  if ranking.finish_rule == "top_k":
    # The K best extensions of the step lie among the K EOS ones and the K best others.
    kth_best = lax.top_k(jnp.concatenate([eos_sums, alive_log_probs], axis=1), beams)[0]
    finishes &= eos_sums >= kth_best[:, -1:]
    if scored.first_free is not None:  # A prefix's first free step: only beam 0 is alive.
      eos_ranked = jnp.any(finishes, axis=1) & scored.first_free  # [B]
      second = eos_ranked & (jnp.max(eos_sums, axis=1) < alive_log_probs[:, 0])  # [B]
      finishes, alive_log_probs = demote_second_eos(finishes, alive_log_probs, second)
  finished = finish(state, finishes, eos_sums, context.eos_id, ranking)
  parent = flat // token_log_probs.shape[-1]  # [B, K]
  tokens = jnp.take_along_axis(scored.token_ids.reshape(batch, -1), flat, axis=1)  # [B, K]

  def done_rule(alive_log_probs: Array, finished: Finished) -> Array:
    if ranking.finish_rule == "top_k":
      # Not at the last position: there the alive beams among the step's K best finish too
      # (`ranked_hypotheses`), so a sentence ending there must keep them.
      return (finished.count >= beams) & (state.step + 1 < max_len)
    return _every_beam_done(alive_log_probs, finished.scores, state.step + 1,
                            context.max_lengths, max_len, ranking)

  return advanced(state, valid, finished, alive_log_probs, parent, tokens, new_state,
                  context.reorder, done_rule)


def _every_beam_done(alive_log_probs: Array, finished_scores: Array, num_tokens: Array,
                     max_lengths: Array, max_decode_len: int, ranking: Ranking) -> Array:
  """bool [B]: whether no alive beam can beat its sentence's K-th finished hypothesis any more
  (`beam_state.best_possible`)."""
  bound = best_possible(alive_log_probs, num_tokens, max_lengths, max_decode_len, ranking)
  return bound <= finished_scores[:, -1]


__all__ = ["beam_start", "beam_step", "run", "search"]
