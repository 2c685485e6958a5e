"""The beam state and the step pieces that plain and constrained beam search share: the rows of
K beams, one step's scored candidates (the model's log-probabilities, the length caps, the
prefix and the forbidden phrases applied), the EOS scoring, the advance to the next position,
and the final ranking. Shape letters as in `decoding.search`; R = B*K rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import PAD_ID
from flax_transformer.decoding import constraints as constraints_lib
from flax_transformer.decoding.search import (
  ExpandState,
  PyTree,
  Ranking,
  ReorderState,
  SearchProblem,
  TokensToLogits,
)
from flax_transformer.decoding.topk import top_k

Array = jax.Array
NEG_INF = -jnp.inf


@flax.struct.dataclass
class BeamState:
  """The loop state of beam search. Alive beams and finished hypotheses are kept apart."""

  step: Array  # int32 []: the position decoded next = tokens per alive beam so far.
  last_ids: Array  # int32 [B, K]: every alive beam's last token (`bos_id` before step 0).
  alive_seqs: Array  # int32 [B, K, L]: alive beams' tokens, zeros from `step` on.
  alive_log_probs: Array  # float32 [B, K]: their summed log-probabilities; -inf = none.
  alive_state: PyTree  # the callable's state, leaves [B*K, ...] (0-d leaves as given).
  finished_seqs: Array  # int32 [B, K, L]: hypotheses ended by EOS, zeros after EOS.
  finished_scores: Array  # float32 [B, K]: their length-normalized scores, best first; -inf = none.
  num_finished: Array  # int32 [B]: hypotheses finished so far (may exceed K; K are kept).
  done: Array  # bool [B]: the sentence's K finished hypotheses can no longer change.
  # bool [B, K, C]: the constraints each alive beam has met (None without constraints).
  constraint_met: Array | None = None
  # bool [B, K]: whether each finished hypothesis met every constraint (None without them).
  finished_met: Array | None = None


def repeat_rows(state: PyTree, beams: int) -> PyTree:
  """K copies of every sentence's rows: leaves [B, ...] -> [B*K, ...]; 0-d leaves as given."""
  return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else jnp.repeat(x, beams, axis=0), state)


def gather_beams(state: PyTree, parent: Array) -> PyTree:
  """Rows of every leaf [B*K, ...] reordered by parent beam int [B, K]; 0-d leaves as given."""
  batch, beams = parent.shape
  rows = (jnp.arange(batch, dtype=jnp.int32)[:, None] * beams + parent).reshape(-1)  # [B*K]
  gather = lambda x: x if jnp.ndim(x) == 0 else jnp.take(x, rows, axis=0, mode="clip")
  return jax.tree.map(gather, state)


def beam_rows(problem: SearchProblem) -> tuple[ExpandState, ReorderState]:
  """The problem's own expand and reorder of its state's rows, or the search's repeat and
  gather."""
  if problem.expand_state is None:
    return repeat_rows, gather_beams
  return problem.expand_state, problem.reorder_state


def initial_beam_state(beams_state: PyTree, batch_size: int, beam_size: int,
                       max_decode_len: int, bos_id: int) -> BeamState:
  """The loop's start from the state for K beams; only beam 0 is alive, so step 0 has no
  duplicates."""
  shape = (batch_size, beam_size)
  first_beam_only = jnp.where(jnp.arange(beam_size) == 0, 0.0, NEG_INF).astype(jnp.float32)
  return BeamState(
      step=jnp.zeros((), jnp.int32),
      last_ids=jnp.full(shape, bos_id, jnp.int32),
      alive_seqs=jnp.zeros((*shape, max_decode_len), jnp.int32),
      alive_log_probs=jnp.broadcast_to(first_beam_only, shape),
      alive_state=beams_state,
      finished_seqs=jnp.zeros((*shape, max_decode_len), jnp.int32),
      finished_scores=jnp.full(shape, NEG_INF, jnp.float32),
      num_finished=jnp.zeros((batch_size,), jnp.int32),
      done=jnp.zeros((batch_size,), bool))


@dataclasses.dataclass(frozen=True)
class StepContext:
  """What every beam step reads besides the loop state (built once per search)."""

  step_fn: TokensToLogits
  reorder: ReorderState
  eos_id: int
  ranking: Ranking
  max_lengths: Array  # int32 [B]: most tokens before EOS (L: no cap)
  min_length: int
  prefix_at: Callable[[Array], tuple[Array, Array, Array] | None]
  after_prefix: Callable[[Array], Array | None]
  forbid: Array | None  # int32 [B, F, P]
  word_continues: Array | None  # bool [V]

  @classmethod
  def of(cls, problem: SearchProblem, reorder: ReorderState, ranking: Ranking) -> StepContext:
    return cls(problem.step_fn(), reorder, problem.eos_id, ranking, problem.length_caps(),
               problem.min_length, problem.prefix_at, problem.after_prefix,
               problem.phrases("forbid"),
               None if problem.word_continues is None
               else jnp.asarray(problem.word_continues, bool))


@flax.struct.dataclass
class Scored:
  """One step's candidates before a rule picks among them (`scored_step`)."""

  logits: Array  # float32 [R, V]: the model's, forbidden phrases at -inf.
  log_normalizer: Array  # float32 [R]: log-sum-exp of the model's logits (before any ban).
  eos_log_probs: Array  # float32 [R]
  token_log_probs: Array  # float32 [R, C]: the best C = K + 2 non-EOS tokens (-inf: none).
  token_ids: Array  # int32 [R, C]
  forced: Array  # bool [B]: the length cap forces EOS (the only choice).
  eos_allowed: Array  # bool [B]
  forcing: Array | None  # bool [B]: the row takes its target prefix's token (None: no prefix).
  first_free: Array | None  # bool [B]: the row's first step after its prefix (None: no prefix).


def scored_step(context: StepContext, state: BeamState) -> tuple[Scored, PyTree]:
  """Runs the model one step for every beam and scores its candidates: the length caps, the
  minimum length, the target prefix and the forbidden phrases applied. Returns the scores and
  the callable's new state (rows not yet reordered)."""
  batch, beams, max_len = state.alive_seqs.shape
  logits, new_state = context.step_fn(state.last_ids.reshape(batch * beams, 1),
                                      state.alive_state)
  logits = logits.astype(jnp.float32)  # [R, V]
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [R]: of the model, before any ban.
  if context.forbid is not None:  # Scores stay the model's log-probabilities.
    logits = ban_forbidden(logits, state.alive_seqs, state.step, context.forbid,
                           context.word_continues, context.max_lengths, max_len)
  logits = whole_word_prefix(logits, context.after_prefix(state.step), context.word_continues)
  eos_log_probs, token_log_probs, token_ids = _best_tokens(logits, context.eos_id, beams,
                                                           log_normalizer)
  forced = state.step >= context.max_lengths  # [B]: EOS is the only choice from here on.
  eos_allowed = (state.step >= context.min_length) | forced  # [B]
  forcing, first_free = None, None
  if (prefix := context.prefix_at(state.step)) is not None:
    forcing, token, first_free = prefix
    token_log_probs, token_ids = _force_prefix(token_log_probs, token_ids, forcing, token)
    forced, eos_allowed = forced & ~forcing, eos_allowed & ~forcing
  return Scored(logits, log_normalizer, eos_log_probs, token_log_probs, token_ids, forced,
                eos_allowed, forcing, first_free), new_state


def ban_forbidden(logits: Array, sequences: Array, step: Array, forbid: Array,
                  word_continues: Array | None, max_lengths: Array, max_len: int) -> Array:
  """logits [R, V] of the rows of sequences [B, (K,) L] at `step`, -inf where a forbidden
  phrase (forbid int32 [B, F, P]) would be completed as a whole word
  (`decoding.constraints.ban_forbidden`). A row's last free position is the one before its
  length cap forces EOS, or position L - 1."""
  rows = logits.shape[0]
  per_sentence = rows // forbid.shape[0]
  history = constraints_lib.tail(sequences, step, forbid.shape[-1]).reshape(rows, -1)
  last_free = step + 1 >= jnp.minimum(max_lengths, max_len)  # [B]: then EOS or the end
  forced = step >= max_lengths  # [B]
  return constraints_lib.ban_forbidden(
      logits, history, jnp.repeat(forbid, per_sentence, axis=0), word_continues,
      jnp.repeat(last_free, per_sentence), jnp.repeat(forced, per_sentence))


def whole_word_prefix(logits: Array, after_prefix: Array | None,
                      word_continues: Array | None) -> Array:
  """logits [R, V] with -inf at the pieces that would continue the last word of a target
  prefix, on the rows right after theirs (after_prefix bool [B]): a prefix stands as whole
  words. Unchanged without a prefix or without `word_continues`."""
  if after_prefix is None or word_continues is None:
    return logits
  rows = jnp.repeat(after_prefix, logits.shape[0] // after_prefix.shape[0])  # [R]
  return jnp.where(rows[:, None] & word_continues[None, :], -jnp.inf, logits)


def _best_tokens(logits: Array, eos_id: int, beams: int, log_normalizer: Array
                 ) -> tuple[Array, Array, Array]:
  """Log-probabilities of EOS and of the best C = min(V, K + 2) tokens of every row.

  A row's K best non-EOS, non-padding tokens are among its K + 2 best, so one top-k over the raw
  logits (same order as log-probabilities) finds them without a full-vocabulary log-softmax;
  EOS and padding among them get -inf.

  Args:
    logits: float32 [R, V]. log_normalizer: float32 [R], log-sum-exp of the model's logits.
  Returns:
    (eos log-prob [R], token log-probs [R, C], token ids int32 [R, C]).
  """
  eos_log_probs = logits[:, eos_id] - log_normalizer
  top_logits, top_ids = top_k(logits, min(logits.shape[-1], beams + 2))  # [R, C]
  emittable = (top_ids != eos_id) & (top_ids != PAD_ID)
  token_log_probs = jnp.where(emittable, top_logits - log_normalizer[:, None], NEG_INF)
  return eos_log_probs, token_log_probs, top_ids


def _force_prefix(token_log_probs: Array, token_ids: Array, forcing: Array, token: Array
                  ) -> tuple[Array, Array]:
  """The candidates of rows that take their prefix token: that token alone, adding 0 to the
  score. token_log_probs/ids [R, C], forcing bool [B], token int32 [B] -> (log probs, ids)."""
  beams = token_ids.shape[0] // forcing.shape[0]
  row_forcing = jnp.repeat(forcing, beams)[:, None]  # [R, 1]
  first = jnp.arange(token_ids.shape[1]) == 0  # [C]: the prefix token takes the first column.
  token_log_probs = jnp.where(row_forcing, jnp.where(first, 0.0, NEG_INF), token_log_probs)
  token_ids = jnp.where(row_forcing & first, jnp.repeat(token, beams)[:, None], token_ids)
  return token_log_probs, token_ids


def demote_second_eos(finishes: Array, alive_log_probs: Array, second: Array
                      ) -> tuple[Array, Array]:
  """A prefix's first free step (CTranslate2's guard against short outputs, its issue #277):
  where EOS ranked among the K best but not first (second bool [B]), it finishes nothing and
  takes the place of the last alive beam. finishes bool [B, K], alive_log_probs [B, K]."""
  finishes &= ~second[:, None]
  alive_log_probs = alive_log_probs.at[:, -1].set(
      jnp.where(second, NEG_INF, alive_log_probs[:, -1]))
  return finishes, alive_log_probs


@flax.struct.dataclass
class Finished:
  """A step's K finished hypotheses per sentence (`finish`) and the position it wrote."""

  seqs: Array  # int32 [B, K, L]
  scores: Array  # float32 [B, K]
  count: Array  # int32 [B]
  at_step: Array  # bool [L]: the position this step writes.
  met: Array | None = None  # bool [B, K]: each holds every constraint (None without them).


def finish(state: BeamState, finishes: Array, eos_sums: Array, eos_id: int, ranking: Ranking,
           eos_met: Array | None = None) -> Finished:
  """The K best finished hypotheses after the EOS extensions `finishes` (bool [B, K], their
  summed log-probabilities eos_sums [B, K]) join the earlier ones, scored
  sum / divisor(tokens). With constraints (eos_met bool [B, K]: the finishing ones hold every
  phrase), those that hold every phrase come first, then by score, so one the length cap
  forced never takes the place of one that holds them."""
  beams, max_len = state.alive_seqs.shape[1:]
  eos_scores = jnp.where(finishes, ranking.normalized(eos_sums, state.step + 1), NEG_INF)
  at_step = jnp.arange(max_len) == state.step  # [L]
  eos_seqs = jnp.where(at_step, eos_id, state.alive_seqs)  # [B, K, L]
  scores = jnp.concatenate([state.finished_scores, eos_scores], axis=1)  # [B, 2K]
  met = None
  if eos_met is None:
    finished_scores, pick = lax.top_k(scores, beams)  # [B, K]
  else:
    met = jnp.concatenate([state.finished_met, eos_met], axis=1)  # [B, 2K]
    pick = met_first(met, scores, beams)
    finished_scores = jnp.take_along_axis(scores, pick, axis=1)
    met = jnp.take_along_axis(met, pick, axis=1)
  finished_seqs = jnp.take_along_axis(
      jnp.concatenate([state.finished_seqs, eos_seqs], axis=1), pick[..., None], axis=1)
  num_finished = state.num_finished + jnp.sum(finishes, axis=1, dtype=jnp.int32)  # [B]
  return Finished(finished_seqs, finished_scores, num_finished, at_step, met)


def met_first(met: Array, scores: Array, count: int) -> Array:
  """int32 [B, count]: positions of the `count` best of met bool [B, N] and scores [B, N]:
  hypotheses that hold every constraint first, then by score, then by position; -inf last."""
  group = jnp.where(scores == NEG_INF, 2, jnp.where(met, 0, 1))
  position = jnp.broadcast_to(jnp.arange(scores.shape[1], dtype=jnp.int32), scores.shape)
  return lax.sort((group, -scores, position), dimension=1, num_keys=2)[2][:, :count]


def advanced(state: BeamState, valid: Array, finished: Finished, alive_log_probs: Array,
             parent: Array, tokens: Array, new_state: PyTree, reorder: ReorderState,
             done_rule: Callable[[Array, Finished], Array],
             constraint_met: Array | None = None) -> BeamState:
  """The loop state after a step: beam k of sentence b continues beam parent[b, k] with
  tokens[b, k] (parent, tokens int32 [B, K]; alive_log_probs [B, K] their sums), and the
  callable's `new_state` is reordered alike. `done_rule(alive_log_probs, finished)` -> bool [B]
  says which sentences can no longer change (a sentence without alive beams is done too). A
  step past L (`valid` false) keeps the beams (a loop iteration may run a few of them)."""
  alive_seqs = jnp.where(finished.at_step, tokens[..., None],
                         jnp.take_along_axis(state.alive_seqs, parent[..., None], axis=1))
  keep = lambda new, old: jnp.where(valid, new, old)
  alive_log_probs = keep(alive_log_probs, state.alive_log_probs)
  done = done_rule(alive_log_probs, finished)
  return BeamState(
      step=state.step + valid.astype(jnp.int32), last_ids=keep(tokens, state.last_ids),
      alive_seqs=keep(alive_seqs, state.alive_seqs), alive_log_probs=alive_log_probs,
      alive_state=reorder(new_state, parent),
      finished_seqs=finished.seqs, finished_scores=finished.scores, num_finished=finished.count,
      done=state.done | done | (jnp.max(alive_log_probs, axis=1) == NEG_INF
                                if constraint_met is not None
                                else alive_log_probs[:, 0] == NEG_INF),  # sorted: best first
      constraint_met=None if constraint_met is None else keep(constraint_met,
                                                              state.constraint_met),
      finished_met=finished.met)


def best_possible(alive_log_probs: Array, num_tokens: Array, max_lengths: Array,
                  max_decode_len: int, ranking: Ranking) -> Array:
  """float32 [B]: the best score any alive beam (alive_log_probs [B, K], each holding
  `num_tokens` tokens) can still finish with.

  A beam that finishes with n in [num_tokens + 1, n_max] tokens (n_max: its length cap plus
  EOS, at most L) has a sum s' <= s, its sum now (log-probabilities are <= 0, so sums only
  fall; a prefix token adds 0), and scores s' / d(n) <= s / d(n) <= s / max(d) for the divisor
  d, which is positive and non-decreasing in n, because s <= 0: so s / max(d(num_tokens + 1),
  d(n_max)) bounds every score it can reach, and the best beam's bound bounds them all.
  """
  n_max = jnp.minimum(max_lengths + 1, max_decode_len)  # [B]
  largest_divisor = jnp.maximum(ranking.divisor(num_tokens + 1), ranking.divisor(n_max))  # [B]
  return jnp.max(alive_log_probs, axis=1) / largest_divisor


def ranked_hypotheses(final: BeamState, ranking: Ranking, alive_met: Array | None = None
                      ) -> tuple[Array, Array]:
  """The K hypotheses to return per sentence, best first: (sequences int32 [B, K, L], scores
  float32 [B, K]), zeros and -inf where there is none.

  "top_k": a sentence the length limit stopped (not done) ranks its alive beams, cut at L
  tokens, together with its finished hypotheses, as CTranslate2 finishes every beam at its last
  step and Hugging Face adds the alive beams at `max_length`. "every_beam": finished
  hypotheses first, then unfinished alive beams fill the free slots (Flax's examples/wmt).
  With constraints (alive_met bool [B, K]: each alive beam holds every phrase), those that hold
  every phrase come first, then by score.
  """
  beams = final.alive_seqs.shape[1]
  unfinished_scores = ranking.normalized(final.alive_log_probs, final.step)  # [B, K]
  if ranking.finish_rule == "top_k":
    unfinished_scores = jnp.where(final.done[:, None], NEG_INF, unfinished_scores)
  all_scores = lambda: jnp.concatenate([final.finished_scores, unfinished_scores], axis=1)
  if alive_met is not None:
    pick = met_first(jnp.concatenate([final.finished_met, alive_met], axis=1), all_scores(),
                     beams)
  elif ranking.finish_rule == "top_k":
    _, pick = lax.top_k(all_scores(), beams)  # [B, K] into 2K; ties keep finished ones first
  else:
    num_finished = jnp.minimum(final.num_finished, beams)[:, None]  # [B, 1]
    slot = jnp.arange(beams)[None, :]  # [1, K]
    pick = jnp.where(slot < num_finished, slot, beams + slot - num_finished)  # [B, K] into 2K
  scores = jnp.take_along_axis(all_scores(), pick, axis=1)
  sequences = jnp.take_along_axis(
      jnp.concatenate([final.finished_seqs, final.alive_seqs], axis=1), pick[..., None], axis=1)
  return jnp.where(scores[..., None] > NEG_INF, sequences, PAD_ID), scores

__all__ = ["BeamState", "Finished", "Scored", "StepContext", "advanced", "ban_forbidden",
           "beam_rows", "best_possible", "demote_second_eos", "finish", "gather_beams",
           "initial_beam_state", "met_first", "ranked_hypotheses", "repeat_rows", "scored_step",
           "whole_word_prefix"]
