"""Beam search under terminology constraints: every hypothesis must hold every phrase as whole
words (`decoding.constraints` defines the phrases, the candidates, the banks and DBA's rounds).

Two rules make its answer one a translator can trust:
  - The plain answer first. The plain beam search (same K, same ranking) runs first; a sentence
    whose plain best hypothesis already holds every phrase keeps the plain answer: its
    hypotheses that hold every phrase, in their order (fewer than K where the others do not).
    The constrained search then starts with that sentence done, and the answer is exactly the
    plain one's, whatever dynamic beam allocation would have pruned.
  - No early stop before the best. Where it searches, the search stops for a sentence only
    when its K finished hypotheses all hold every phrase and no alive beam can still outrank
    the K-th of them: every score an alive beam can reach is bounded by its summed
    log-probability divided by the largest length divisor it could still reach
    (`beam_state.best_possible`, which proves the bound), or at the length cap. fairseq's
    `--constraints` stops at K finished hypotheses, so beams that jump to a term early, meet
    it and end at once can fill the K places while the natural translation has not reached
    the term yet (a sentence-final term then costs the whole translation).

`search` is the batched search; its pieces (`settle`: the first rule on a plain answer, `start`,
`step`, `answer`) are also the engine's slot machine (`decoding.slots.ConstrainedBeamSlots`),
which takes the plain answer as data.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import PAD_ID
from flax_transformer.decoding import constraints as constraints_lib
from flax_transformer.decoding import plain_beam
from flax_transformer.decoding.beam_state import (
  NEG_INF,
  BeamState,
  Finished,
  StepContext,
  advanced,
  best_possible,
  demote_second_eos,
  finish,
  ranked_hypotheses,
  scored_step,
)
from flax_transformer.decoding.loop import LoopOptions
from flax_transformer.decoding.search import Ranking, SearchProblem

Array = jax.Array


class Plain(NamedTuple):
  """The plain answer as the constrained search reads it (`settle`)."""

  settled: Array  # bool [B]: the plain best hypothesis holds every phrase
  sequences: Array  # int32 [B, K, L]: the plain hypotheses that hold every phrase, then zeros
  scores: Array  # float32 [B, K]: theirs, then -inf


def search(problem: SearchProblem, *, beam_size: int, ranking: Ranking,
           loop_options: LoopOptions) -> tuple[Array, Array]:
  """Beam search whose hypotheses hold every phrase of `problem.constraints` (module
  docstring): (sequences int32 [B, K, L], scores float32 [B, K]), those that hold every phrase
  first (finished, or cut at L), then by score; the length cap's, which may miss some, after.
  Needs the "top_k" finish rule and K >= 2 (a single beam has no banks to allocate)."""
  check_settings(ranking, beam_size)
  plain = settle(problem, *plain_beam.search(  # [B, K, L], [B, K]
      problem.replace(constraints=None), beam_size, ranking, loop_options))
  final = plain_beam.run(problem, beam_size, ranking, loop_options,
                         lambda context, state: step(problem, context, state),
                         lambda state: start(problem, state, plain.settled))
  return answer(problem, final, ranking, plain)


def check_settings(ranking: Ranking, beam_size: int) -> None:
  """Refuses a finish rule or beam size that dynamic beam allocation cannot run."""
  if ranking.finish_rule != "top_k" or beam_size < 2:
    raise ValueError(
        "beam_search: constraints need finish_rule 'top_k' and beam_size >= 2 (dynamic beam "
        f"allocation shares the K beams among banks), got {ranking.finish_rule!r} and "
        f"{beam_size}.")


def settle(problem: SearchProblem, sequences: Array, scores: Array) -> Plain:
  """The first rule (module docstring) on the plain answer (sequences int32 [B, K, L], scores
  float32 [B, K]): which sentences it settles, and its hypotheses that hold every phrase."""
  phrases = problem.phrases("constraints")
  holds = (constraints_lib.holds_every_phrase(sequences, phrases, problem.ordered_constraints,
                                              problem.word_continues)
           & (scores > NEG_INF))  # [B, K]
  return Plain(holds[:, 0], *_holding_first(sequences, scores, holds))


def start(problem: SearchProblem, state: BeamState, settled: Array) -> BeamState:
  """The constrained search's state before step 0 from beam search's (`plain_beam.beam_start`):
  the sentences the plain answer settles (bool [B]) done, no phrase met."""
  batch, beams = state.alive_log_probs.shape
  return state.replace(
      done=settled,
      constraint_met=jnp.zeros((batch, beams, problem.phrases("constraints").shape[1]), bool),
      finished_met=jnp.zeros((batch, beams), bool))


def step(problem: SearchProblem, context: StepContext, state: BeamState) -> BeamState:
  """One position under the problem's constraints (`_constrained_step`)."""
  return _constrained_step(context, problem.phrases("constraints"), problem.ordered_constraints,
                           state)


def answer(problem: SearchProblem, final: BeamState, ranking: Ranking, plain: Plain
           ) -> tuple[Array, Array]:
  """The search's result (`search`) from its final state and the plain answer (`settle`)."""
  holds = _alive_holds(final, problem.phrases("constraints"), problem.ordered_constraints,
                       problem.word_continues)
  sequences, scores = ranked_hypotheses(final, ranking, holds)
  return (jnp.where(plain.settled[:, None, None], plain.sequences, sequences),
          jnp.where(plain.settled[:, None], plain.scores, scores))


def _holding_first(sequences: Array, scores: Array, holds: Array) -> tuple[Array, Array]:
  """The hypotheses [B, K, L], [B, K] that hold every phrase (holds bool [B, K]), in their
  order, then empty slots (zeros, -inf)."""
  position = jnp.broadcast_to(jnp.arange(scores.shape[1], dtype=jnp.int32), scores.shape)
  pick = lax.sort((~holds, position), dimension=1, num_keys=2)[1]  # [B, K]
  kept = jnp.take_along_axis(holds, pick, axis=1)
  scores = jnp.where(kept, jnp.take_along_axis(scores, pick, axis=1), NEG_INF)
  sequences = jnp.take_along_axis(sequences, pick[..., None], axis=1)
  return jnp.where(kept[..., None], sequences, PAD_ID), scores


def _alive_holds(final: BeamState, phrases: Array, ordered: bool,
                 continues: Array | None) -> Array:
  """bool [B, K]: the alive beams, cut at L, hold every phrase (the end of the output ends the
  word of a pending one)."""
  window = constraints_lib.tail(final.alive_seqs, final.step, phrases.shape[-1])  # [B, K, P]
  ended = jnp.concatenate([window, jnp.zeros_like(window[..., :1])], axis=-1)  # [B, K, P + 1]
  met, _ = constraints_lib.advance(ended, phrases, final.constraint_met, ordered, continues)
  return constraints_lib.all_met(met, phrases)


def _constrained_step(context: StepContext, phrases: Array, ordered: bool, state: BeamState
                      ) -> BeamState:
  """One position under constraints (phrases int32 [B, C, P]): the candidates of
  `decoding.constraints` (sources a-d, none starting a phrase inside a word), allocated to
  banks, taken in DBA's rounds. N = K * (K + 2) + K * 2C + K candidates per sentence: every
  beam's K + 2 best tokens (those in source a or c kept), its 2C constraint tokens (b), its EOS
  (d). Steps past L and after `done` change no output, as in plain beam search."""
  batch, beams, max_len = state.alive_seqs.shape
  valid = state.step < max_len
  scored, new_state = scored_step(context, state)
  alive, met = state.alive_log_probs, state.constraint_met  # [B, K], [B, K, C]
  window = constraints_lib.tail(state.alive_seqs, state.step, phrases.shape[-1])  # [B, K, P]
  # [B]: rows whose token this step is not chosen (the cap's EOS, or a prefix token).
  stopped = scored.forced if scored.forcing is None else scored.forced | scored.forcing

  # (b): the pieces that advance a constraint -> [B, K, 2C].
  logits = scored.logits.reshape(batch, beams, -1)  # [B, K, V]
  advancing, exists = constraints_lib.advancing_tokens(
      window, phrases, met, ordered, _best_word_start(logits, context.word_continues,
                                                      context.eos_id))
  exists &= ~stopped[:, None, None] & (advancing != context.eos_id)
  advancing_log_probs = (jnp.take_along_axis(logits, advancing, axis=-1)
                         - scored.log_normalizer.reshape(batch, beams, 1))
  advancing_sums = jnp.where(exists, alive[..., None] + advancing_log_probs, NEG_INF)
  natural, natural_ids = _natural_candidates(alive, scored.token_log_probs, scored.token_ids,
                                             scored.forced, advancing, exists)  # (a), (c)
  eos_sums = alive + scored.eos_log_probs.reshape(batch, beams)  # (d) -> [B, K]
  ids, parents = _candidate_ids(natural_ids, advancing, context.eos_id)  # [B, N], [N]
  windows = jnp.concatenate([window[:, parents], ids[..., None]], axis=-1)  # [B, N, P + 1]
  new_met, banks = constraints_lib.advance(windows, phrases, met[:, parents], ordered,
                                           context.word_continues)
  eos_met = constraints_lib.all_met(new_met[:, -beams:], phrases)  # [B, K]: EOS ends the word.
  eos_ok = (scored.eos_allowed[:, None] & (eos_met | scored.forced[:, None]) & valid
            & ~state.done[:, None] & (eos_sums > NEG_INF))
  goes_on = constraints_lib.word_goes_on(logits, context.word_continues)  # [B, K]
  inside = constraints_lib.starts_inside_word(  # [B, N]: dropped.
      windows, phrases, met[:, parents], ordered, goes_on[:, parents],
      jnp.minimum(context.max_lengths, max_len) - state.step)
  sums = jnp.concatenate([natural.reshape(batch, -1), advancing_sums.reshape(batch, -1),
                          jnp.where(eos_ok, eos_sums, NEG_INF)], axis=1)  # [B, N]
  order = constraints_lib.bank_order(jnp.where(inside, NEG_INF, sums), banks)  # [B, N]

  first, eos_order, finishes, alive_log_probs, pick = _take_rounds(order, sums, eos_ok)
  if scored.first_free is not None:  # A prefix's first free step: EOS only as the best.
    eos_ranked = jnp.any(finishes, axis=1) & scored.first_free  # [B]
    second = eos_ranked & (jnp.min(eos_order, axis=1) > first[:, 0])  # [B]
    finishes, alive_log_probs = demote_second_eos(finishes, alive_log_probs, second)
  finished = finish(state, finishes, eos_sums, context.eos_id, context.ranking, eos_met)

  def done_rule(alive_log_probs: Array, finished: Finished) -> Array:
    # K finished that hold every phrase, and no alive beam can outrank the K-th of them.
    bound = best_possible(alive_log_probs, state.step + 1, context.max_lengths, max_len,
                          context.ranking)
    kth = finished.scores[:, -1]
    return finished.met[:, -1] & (kth > NEG_INF) & (bound <= kth)

  return advanced(state, valid, finished, alive_log_probs, parents[pick],
                  jnp.take_along_axis(ids, pick, axis=1), new_state, context.reorder, done_rule,
                  jnp.take_along_axis(new_met, pick[..., None], axis=1))


def _best_word_start(logits: Array, word_continues: Array | None, eos_id: int) -> Array:
  """int32 [B, K]: each beam's best token (logits [B, K, V]) that starts a word, neither EOS
  nor padding: what completes a pending phrase (source b)."""
  vocab = logits.shape[-1]
  allowed = (jnp.arange(vocab) != eos_id) & (jnp.arange(vocab) != PAD_ID)
  if word_continues is not None:
    allowed &= ~word_continues
  return jnp.argmax(jnp.where(allowed, logits, NEG_INF), axis=-1).astype(jnp.int32)


def _candidate_ids(natural_ids: Array, advancing: Array, eos_id: int) -> tuple[Array, Array]:
  """The N candidates' tokens int32 [B, N] and parent beams int32 [N], in the order (a, c)
  natural_ids [B, K, K + 2], (b) advancing [B, K, 2C], (d) each beam's EOS."""
  batch, beams = natural_ids.shape[:2]
  ids = jnp.concatenate([natural_ids.reshape(batch, -1), advancing.reshape(batch, -1),
                         jnp.full((batch, beams), eos_id, jnp.int32)], axis=1)
  parents = jnp.concatenate([jnp.repeat(jnp.arange(beams), natural_ids.shape[-1]),
                             jnp.repeat(jnp.arange(beams), advancing.shape[-1]),
                             jnp.arange(beams)])
  return ids, parents


def _natural_candidates(alive: Array, token_log_probs: Array, token_ids: Array, forced: Array,
                        advancing: Array, exists: Array) -> tuple[Array, Array]:
  """Candidates (a), the sentence's K best, and (c), each beam's best, of the beams' K + 2 best
  tokens (token_log_probs, token_ids [B*K, K + 2]; alive [B, K]; forced [B]): their sums
  (-inf where neither, where the length cap forces EOS, or where the token is already a (b)
  candidate: advancing int32 [B, K, 2C] where exists) and ids, each [B, K, K + 2]."""
  batch, beams = alive.shape
  natural_ids = token_ids.reshape(batch, beams, -1)
  natural = alive[..., None] + token_log_probs.reshape(batch, beams, -1)
  natural = jnp.where(forced[:, None, None], NEG_INF, natural)
  columns = natural.shape[-1]
  k_best = lax.top_k(natural.reshape(batch, -1), beams)[1]  # [B, K] into K * (K + 2)
  in_k_best = jnp.any(jnp.arange(beams * columns)[None, :, None] == k_best[:, None, :], axis=-1)
  beam_best = jnp.arange(columns) == jnp.argmax(natural, axis=-1)[..., None]  # [B, K, K + 2]
  counted = jnp.any((natural_ids[..., :, None] == advancing[..., None, :])
                    & exists[..., None, :], axis=-1)  # Already a (b) candidate.
  natural = jnp.where((in_k_best.reshape(natural.shape) | beam_best) & ~counted, natural,
                      NEG_INF)
  return natural, natural_ids


def _take_rounds(order: Array, sums: Array, eos_ok: Array
                 ) -> tuple[Array, Array, Array, Array, Array]:
  """DBA's rounds over the N candidates (order, sums [B, N], the last K of them the beams' EOS;
  eos_ok [B, K]): an EOS among the first K of the rounds finishes, the first K others stay
  alive. Returns the first K round positions (ascending) and the EOS's [B, K], which EOS finish
  [B, K], and the survivors' sums and candidate indices [B, K] (-inf where fewer survive)."""
  beams = eos_ok.shape[1]
  first = -lax.top_k(-order, beams)[0]  # [B, K], ascending
  eos_order = order[:, -beams:]  # [B, K]
  finishes = eos_ok & (eos_order <= first[:, -1:])
  is_eos = jnp.arange(order.shape[1]) >= order.shape[1] - beams
  alive_order, pick = lax.top_k(-jnp.where(is_eos, constraints_lib.NEVER, order), beams)
  alive_log_probs = jnp.where(-alive_order < constraints_lib.NEVER,
                              jnp.take_along_axis(sums, pick, axis=1), NEG_INF)  # [B, K]
  return first, eos_order, finishes, alive_log_probs, pick


__all__ = ["Plain", "answer", "check_settings", "search", "settle", "start", "step"]
