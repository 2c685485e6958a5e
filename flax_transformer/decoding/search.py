"""Beam search, greedy decoding and sampling over an explicit decoding state.

Each search takes a `SearchProblem` (the step function, its state and the output limits) and
its own few settings. This module knows the model only through one callable (`TokensToLogits`)
and the state that callable carries; it imports no model code. The loop machinery (segments of
a growing state, steps per iteration) is `decoding.loop`, the top-k `decoding.topk`. Shape
letters: B batch, K beams, L max decode length, V vocabulary.

State protocol
  `initial_state` is a pytree whose leaves lead with B. `beam_search` repeats every leaf for the
  K beams (rows b*K .. b*K+K-1 belong to sentence b, so the leaves then lead with B*K) and after
  each step reorders those rows once, so that every beam carries the state of the beam it
  extends. 0-d leaves (such as the Transformer cache's `index`, the next position, the same for
  all rows) are carried unchanged: never repeated, never reordered. `shared_state` (optional,
  per sentence: the Transformer's leads with B) is passed as it is, never repeated or
  reordered; when it is given the callable is
  called as `tokens_to_logits(ids, state, shared_state)`, otherwise `tokens_to_logits(ids,
  state)`. `ids` is int32 [B*K, 1]: the last token of every beam, `bos_id` at the first step.
  Greedy decoding and sampling use the same protocol with K = 1.

  A state that knows its beams replaces the repeat and the reorder (both optional, given
  together): `expand_state(state, K)` returns the state for K beams per sentence, and
  `reorder_state(state, parent)` the state after beam k of sentence b took over the prefix of
  beam parent[b, k] (int32 [B, K]). The callable's rows stay b*K + k. The Transformer's cache
  does this to avoid moving its keys/values (`model.transformer`, "Beam search and the
  self-attention cache"). Such a state may lay out its leaves as it likes (an ensemble's cache
  leads with its models, `decoding.bridge`): the search never touches its rows.

Growing state (optional)
  A state that holds one entry per decoded position (the Transformer's self-attention cache)
  costs every step in proportion to the positions it has room for: attention reads all of them,
  and a reorder of its rows moves all of them. Given `resize_state(state, capacity)` (returns the
  state with room for `capacity` positions, keeping the ones written), the search starts with a
  small capacity and grows it between segments of the loop (`growth_schedule`): each segment
  is its own while loop with static shapes. On average a step then handles a bit over half of
  the L positions, at the price of compiling one loop body per segment.

Steps per loop iteration
  Each iteration of the while loop runs k = `steps_per_iteration` steps, unrolled, and tests
  for early exit once. On a GPU, XLA evaluates a while loop's condition on the device and copies
  it to the host before every iteration, so the host waits and the kernels of the next
  iteration queue only after it: a round trip per iteration. A larger k pays it once per k
  steps; the price is up to k - 1 steps after the search could have stopped, and a body k times
  larger to compile. (On an H100 at the benchmark sizes, k = 8 showed no gain over k = 2 for
  beam search, docs/performance.md: there the round trip is small against the steps.) The
  outputs are the same for every k: a step after the last position L changes nothing but the
  callable's state, and a step after early exit changes no output (see `_beam_step` and
  `_sequential_search`). Growing-state capacities before L are multiples of k, so no segment's
  last iteration runs past its capacity. None picks `default_steps_per_iteration` for the
  backend at trace time.

How the Transformer plugs in (`flax_transformer.decoding.bridge` does exactly this):
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  cache = model.apply(variables, B, L, method=Transformer.init_cache)
  step = lambda ids, cache, cross: model.apply(variables, ids, cache, cross,
                                               method=Transformer.decode_step)
  problem = SearchProblem(step, cache, batch_size=B, max_decode_len=L, eos_id=EOS,
                          shared_state=cross, resize_state=resize_cache,
                          expand_state=expand_cache, reorder_state=reorder_cache)
  sequences, scores = beam_search(problem, beam_size=4, ranking=Ranking(0.6))
  The self-attention cache is per-beam state, reordered through its slot table; the
  cross-attention keys/values, computed once per sentence, are shared state that the K beams of
  a sentence read without copies. `transformer.resize_cache` grows the cache along its position
  axis.

Finishing rules (`finish_rule`)
  "top_k", the rule of CTranslate2, fairseq, Hugging Face and Flax's examples/wmt: every step
  ranks all extensions of the alive beams (EOS included) by their summed log-probability, and a
  beam's EOS extension finishes a hypothesis only when it ranks among the K best; the K best
  non-EOS extensions stay alive. A sentence is done when K hypotheses have finished (fairseq;
  CTranslate2 with patience 1). With K = 1 this is greedy decoding. "every_beam" scores every
  alive beam's EOS extension at every step and keeps the K best finished ones, stopping when no
  alive beam can still beat the K-th: a wider search that, where EOS has weight, prefers short
  outputs (with K = 1 it is not greedy).

Length normalization (`length_normalization`, with alpha = `length_penalty`)
  A finished hypothesis of n tokens, EOS included, ranks by (sum of log-probabilities) /
    "gnmt"     ((5 + n) / 6) ** alpha: GNMT's, as in Flax's examples/wmt and T5X;
    "fairseq"  n ** alpha: fairseq's lenpen, and the same formula as CTranslate2's
               length_penalty, Hugging Face's length_penalty and Marian's --normalize (each
               counts EOS in n; CTranslate2 and Hugging Face are checked in the tests).
  A hypothesis cut at L tokens without EOS divides by the same formula with n = L.

Outputs
  Token id 0 pads the output ("zeros after EOS"), so it is never emitted; its probability is not
  renormalized away, so scores stay the model's own log-probabilities. Lengths count output
  tokens, BOS excluded and EOS included. `max_lengths[b]` allows at most that many tokens before
  EOS (EOS is forced next, as fairseq's max_len_a * src_len + max_len_b); `min_length` forbids
  EOS before that many tokens; `max_decode_len` bounds every output, EOS included.

Target prefix (`target_prefix`, int32 [B, P], P <= L, each row's tokens then zeros)
  Every hypothesis of sentence b starts with its row's tokens: while step < that row's length
  the search takes the prefix token, EOS is not allowed and the length caps wait; then the
  search goes on from there. The rules are CTranslate2's `target_prefix` (hard prefix): the
  prefix is given, not chosen, so its tokens add 0 to the score (a score is the log-probability
  of the continuation given the prefix, divided by the length divisor of the whole output,
  prefix included); in beam search one beam carries the prefix (the others stay empty) and the
  beams spread out at the first free step; at that step (step 0 for a row whose prefix is
  empty) with finish rule "top_k", EOS finishes a hypothesis only as the step's best
  candidate, and where it ranks 2nd to K-th it takes the place of an alive beam without
  finishing (CTranslate2's guard against short outputs, its issue #277). Rows of different
  prefix lengths (0: none) share one program: the lengths are data.

Constraints and forbidden phrases (`constraints`, `forbid`: int32 [B, C, P], `decoding.constraints`)
  `constraints`: phrases every hypothesis of beam search must contain, met in any order or, with
  `ordered_constraints`, in the given one. The step allocates its candidates to banks by the
  constraint pieces they have (vectorized dynamic beam allocation, Hu et al. 2019, as fairseq's
  `--constraints`; `decoding.constraints` defines it); EOS is allowed only to a hypothesis that
  has met every phrase, unless the length cap forces it. It needs the "top_k" finish rule and
  K >= 2 (a single beam has no banks to allocate); greedy decoding and sampling refuse it. A
  problem without constraints runs `_beam_step`, the plain step, unchanged. `forbid`: phrases
  no hypothesis may contain (every search). Rows with any mix of phrase counts share one
  program: zero rows are no phrase.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import PAD_ID
from flax_transformer.decoding import constraints as constraints_lib
from flax_transformer.decoding import loop
from flax_transformer.decoding.loop import LoopOptions, ResizeState
from flax_transformer.decoding.topk import top_k as _top_k

Array = jax.Array
PyTree = Any

_NEG_INF = -jnp.inf
FINISH_RULES = ("top_k", "every_beam")
LENGTH_NORMALIZATIONS = ("gnmt", "fairseq")


class TokensToLogits(Protocol):
  """One decoding step: the last token of every row -> next-token logits and the new state."""

  def __call__(self, ids: Array, state: PyTree, /) -> tuple[Array, PyTree]:
    """ids int32 [B*K, 1], state leaves [B*K, ...] -> (logits [B*K, V], new state)."""
    ...


class TokensToLogitsWithShared(Protocol):
  """`TokensToLogits` that also reads a per-sentence `shared_state` (leaves [B, ...])."""

  def __call__(self, ids: Array, state: PyTree, shared_state: PyTree, /
               ) -> tuple[Array, PyTree]:
    """ids int32 [B*K, 1], state [B*K, ...], shared_state [B, ...] -> (logits [B*K, V], state)."""
    ...


# (state for one beam per sentence, K) -> the state for K beams per sentence.
ExpandState = Callable[[PyTree, int], PyTree]
# (state, parent int32 [B, K]) -> the state in which beam k continues beam parent[b, k].
ReorderState = Callable[[PyTree, Array], PyTree]


@dataclasses.dataclass(frozen=True)
class SearchProblem:
  """What every search decodes: the step function and its state (module docstring, "State
  protocol"), and the limits on the outputs. Checked when built (ValueError naming the field).

  Attributes:
    tokens_to_logits: the step function; called with `shared_state` when that is given.
    initial_state: pytree, leaves [B, ...] (repeated for the K beams) or 0-d (carried as is).
    batch_size: B. max_decode_len: L, output tokens including EOS.
    eos_id: ends a hypothesis (must not be 0, the output padding). bos_id: the first input id.
    shared_state: optional pytree (per sentence), passed to every call, never reordered.
    max_lengths: optional int [B], most tokens before EOS per sentence (EOS forced after).
    min_length: fewest tokens before EOS (EOS forbidden earlier).
    resize_state: optional; grows the state in segments (module docstring, "Growing state").
    expand_state, reorder_state: optional, together; replace beam search's repeat and reorder
      of the state's rows (module docstring, "State protocol").
    target_prefix: optional int32 [B, P], P <= max_decode_len: tokens every hypothesis of the
      sentence starts with, zeros after (module docstring, "Target prefix").
    constraints: optional int32 [B, C, P]: phrases every hypothesis must contain, each row's
      pieces then zeros, a zero row for none (module docstring, "Constraints and forbidden
      phrases"). ordered_constraints: met in the given order.
    forbid: optional int32 [B, F, P]: phrases no hypothesis may contain, laid out the same way.
  """

  tokens_to_logits: TokensToLogits | TokensToLogitsWithShared
  initial_state: PyTree
  batch_size: int
  max_decode_len: int
  eos_id: int
  bos_id: int = 0
  shared_state: PyTree | None = None
  max_lengths: Array | None = None
  min_length: int = 0
  resize_state: ResizeState | None = None
  expand_state: ExpandState | None = None
  reorder_state: ReorderState | None = None
  target_prefix: Array | None = None
  constraints: Array | None = None
  ordered_constraints: bool = False
  forbid: Array | None = None

  def __post_init__(self):
    if (self.expand_state is None) != (self.reorder_state is None):
      raise ValueError("SearchProblem: expand_state and reorder_state go together; got only "
                       f"{'expand_state' if self.reorder_state is None else 'reorder_state'}.")
    for name in ("batch_size", "max_decode_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"SearchProblem: {name} must be a positive int, got {value!r}.")
    if not isinstance(self.eos_id, int) or self.eos_id <= PAD_ID:
      raise ValueError(
          f"SearchProblem: eos_id must be a positive int (id {PAD_ID} pads the "
          f"output), got {self.eos_id!r}.")
    if not isinstance(self.min_length, int) or self.min_length < 0:
      raise ValueError(f"SearchProblem: min_length must be an int >= 0, got "
                       f"{self.min_length!r}.")
    if self.expand_state is None:  # The search repeats and reorders its rows itself.
      _check_leading_dim("initial_state", self.initial_state, self.batch_size)
    if self.target_prefix is not None and (
        jnp.ndim(self.target_prefix) != 2 or jnp.shape(self.target_prefix)[0] != self.batch_size
        or jnp.shape(self.target_prefix)[1] > self.max_decode_len):
      raise ValueError(
          f"SearchProblem: target_prefix must be int [batch_size, P] with P <= max_decode_len = "
          f"{self.max_decode_len}, got shape {jnp.shape(self.target_prefix)}.")
    for name in ("constraints", "forbid"):
      phrases = getattr(self, name)
      if phrases is not None and (jnp.ndim(phrases) != 3
                                  or jnp.shape(phrases)[0] != self.batch_size):
        raise ValueError(f"SearchProblem: {name} must be int [batch_size, C, P] with "
                         f"batch_size = {self.batch_size}, got shape {jnp.shape(phrases)}.")
    if self.max_lengths is not None and jnp.shape(self.max_lengths) != (self.batch_size,):
      raise ValueError(
          f"SearchProblem: max_lengths must have shape (batch_size,) = ({self.batch_size},), "
          f"got {jnp.shape(self.max_lengths)}.")

  def step_fn(self) -> TokensToLogits:
    """The (ids, state) step function, `shared_state` bound."""
    if self.shared_state is None:
      return self.tokens_to_logits
    return lambda ids, state: self.tokens_to_logits(ids, state, self.shared_state)

  def length_caps(self) -> Array:
    """int32 [B]: the per-sentence cap, or L (never reached) when there is none."""
    if self.max_lengths is None:
      return jnp.full((self.batch_size,), self.max_decode_len, jnp.int32)
    return jnp.asarray(self.max_lengths, jnp.int32)

  def prefix_at(self, step: Array) -> tuple[Array, Array, Array] | None:
    """(forcing bool [B], token int32 [B], first_free bool [B]) at `step`: which rows still
    take their prefix, its token there, and which rows take their first free step; None
    without a prefix."""
    if self.target_prefix is None:
      return None
    prefix = jnp.asarray(self.target_prefix, jnp.int32)
    column = jnp.minimum(step, prefix.shape[1] - 1)
    token = lax.dynamic_index_in_dim(prefix, column, axis=1, keepdims=False)  # [B]
    lengths = jnp.sum(prefix != PAD_ID, axis=1)  # [B]
    return (step < prefix.shape[1]) & (token != PAD_ID), token, step == lengths

  def replace(self, **changes: Any) -> SearchProblem:
    """A copy with `changes` applied (checked again)."""
    return dataclasses.replace(self, **changes)


@flax.struct.dataclass
class BeamState:
  """The loop state of `beam_search`. Alive beams and finished hypotheses are kept apart."""

  step: Array  # int32 []: the position decoded next = tokens per alive beam so far.
  last_ids: Array  # int32 [B, K]: every alive beam's last token (`bos_id` before step 0).
  alive_seqs: Array  # int32 [B, K, L]: alive beams' tokens, zeros from `step` on.
  alive_log_probs: Array  # float32 [B, K]: their summed log-probabilities, best first; -inf = none.
  alive_state: PyTree  # the callable's state, leaves [B*K, ...] (0-d leaves as given).
  finished_seqs: Array  # int32 [B, K, L]: hypotheses ended by EOS, zeros after EOS.
  finished_scores: Array  # float32 [B, K]: their length-normalized scores, best first; -inf = none.
  num_finished: Array  # int32 [B]: hypotheses finished so far (may exceed K; K are kept).
  done: Array  # bool [B]: the sentence's K finished hypotheses can no longer change.
  # bool [B, K, C]: the constraints each alive beam has met (None without constraints).
  constraint_met: Array | None = None
  # bool [B, K]: whether each finished hypothesis met every constraint (None without them).
  finished_met: Array | None = None


@dataclasses.dataclass(frozen=True)
class Ranking:
  """How beam search finishes and ranks hypotheses (module docstring): static, hashable."""

  length_penalty: float = 0.6  # alpha
  length_normalization: str = "gnmt"
  finish_rule: str = "top_k"

  def __post_init__(self):
    if not self.length_penalty >= 0:
      raise ValueError(f"Ranking: length_penalty must be >= 0, got {self.length_penalty!r}.")
    if self.length_normalization not in LENGTH_NORMALIZATIONS:
      raise ValueError(f"Ranking: length_normalization must be one of {LENGTH_NORMALIZATIONS}, "
                       f"got {self.length_normalization!r}.")
    if self.finish_rule not in FINISH_RULES:
      raise ValueError(f"Ranking: finish_rule must be one of {FINISH_RULES}, got "
                       f"{self.finish_rule!r}.")

  def divisor(self, num_tokens: Array | int) -> Array:
    """float32: the length divisor of a hypothesis of `num_tokens` tokens (EOS included)."""
    n = jnp.asarray(num_tokens, jnp.float32)
    if self.length_normalization == "gnmt":
      return ((5.0 + n) / 6.0) ** self.length_penalty
    return n ** self.length_penalty


def length_penalty_divisor(num_tokens: Array | int, alpha: float,
                           normalization: str = "gnmt") -> Array:
  """The length divisor of n tokens under `normalization` (module docstring), float32."""
  return Ranking(alpha, normalization).divisor(num_tokens)


def beam_search(problem: SearchProblem, *, beam_size: int, ranking: Ranking = Ranking(),
                return_all: bool = True, loop_options: LoopOptions = loop.DEFAULT_OPTIONS,
                ) -> tuple[Array, Array]:
  """Beam search with finished hypotheses kept apart from the K alive beams.

  Every step extends each alive beam by its best tokens (one log-sum-exp and one small top-k
  over each beam's logits; no full-vocabulary log-softmax or sort): the K best non-EOS
  extensions of the sentence stay alive, and a beam's EOS extension finishes a hypothesis as
  `finish_rule` says, scored (sum of log-probs) / divisor(n) by `length_normalization` (module
  docstring). The loop stops once every sentence is done: K finished ("top_k"), or no alive
  beam can beat the worst of K finished hypotheses ("every_beam": alive sums only fall, and the
  bound divides them by the largest length divisor they could still reach).

  Args:
    problem: the step function, its state and the output limits (`SearchProblem`).
    beam_size: K.
    ranking: alpha (`length_penalty`; 0 ranks by summed log-probability), the length
      normalization ("gnmt" or "fairseq") and the finish rule ("top_k", the field's, where
      K = 1 is greedy; or "every_beam"), as the module docstring says.
    return_all: True gives all K hypotheses; False only the best one.
    loop_options: the growing state's segment length and the steps per loop iteration
      (`decoding.loop`); the outputs do not depend on them.

  Returns:
    (sequences int32 [B, K, L], scores float32 [B, K]), best first; with return_all=False
    ([B, L], [B]). Sequences exclude BOS, include EOS, and hold zeros after it. A hypothesis
    that never emits EOS within L tokens ranks below every finished one, with score
    (sum of log-probs) / ((5 + L) / 6) ** alpha; slots with no hypothesis at all (tiny
    vocabularies or limits) hold zeros and score -inf.
  """
  if not isinstance(beam_size, int) or beam_size < 1:
    raise ValueError(f"beam_search: beam_size must be a positive int, got {beam_size!r}.")
  steps = loop.resolved_steps("beam_search", loop_options.steps_per_iteration, beam=True)
  step_fn = problem.step_fn()
  capacities, initial_state = loop.capacities(problem.max_decode_len, problem.resize_state,
                                              loop_options.segment_length, steps,
                                              problem.initial_state)
  expand, reorder = problem.expand_state, problem.reorder_state
  if expand is None:
    expand, reorder = _repeat_rows, _gather_beams
  state = _initial_beam_state(expand(initial_state, beam_size), problem.batch_size, beam_size,
                              problem.max_decode_len, problem.bos_id)
  _check_step_fn(step_fn, state.last_ids.reshape(-1, 1), state.alive_state, problem.eos_id)
  forbid = None if problem.forbid is None else jnp.asarray(problem.forbid, jnp.int32)
  step = functools.partial(_beam_step, step_fn, reorder, problem.eos_id, ranking,
                           problem.length_caps(), problem.min_length, problem.prefix_at,
                           forbid=forbid)
  if problem.constraints is not None:
    if ranking.finish_rule != "top_k" or beam_size < 2:
      raise ValueError(
          "beam_search: constraints need finish_rule 'top_k' and beam_size >= 2 (dynamic beam "
          f"allocation shares the K beams among banks), got {ranking.finish_rule!r} and "
          f"{beam_size}.")
    phrases = jnp.asarray(problem.constraints, jnp.int32)
    state = state.replace(
        constraint_met=jnp.zeros((problem.batch_size, beam_size, phrases.shape[1]), bool),
        finished_met=jnp.zeros((problem.batch_size, beam_size), bool))
    step = functools.partial(_constrained_beam_step, step_fn, reorder, problem.eos_id, ranking,
                             problem.length_caps(), problem.min_length, problem.prefix_at,
                             phrases, problem.ordered_constraints, forbid)
  grow = lambda s, capacity: s.replace(
      alive_state=loop.resized(problem.resize_state, s.alive_state, capacity))
  final = loop.segmented_loop(capacities, grow, lambda s: ~jnp.all(s.done), step, steps, state)
  if problem.constraints is None:
    sequences, scores = _ranked_hypotheses(final, ranking)
  else:
    sequences, scores = _ranked_constrained_hypotheses(final, ranking, phrases)
  if return_all:
    return sequences, scores
  return sequences[:, 0], scores[:, 0]


def _repeat_rows(state: PyTree, beams: int) -> PyTree:
  """K copies of every sentence's rows: leaves [B, ...] -> [B*K, ...]; 0-d leaves as given."""
  return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else jnp.repeat(x, beams, axis=0), state)


def _initial_beam_state(beams_state: PyTree, batch_size: int, beam_size: int,
                        max_decode_len: int, bos_id: int) -> BeamState:
  """The loop's start from the state for K beams; only beam 0 is alive, so step 0 has no
  duplicates."""
  shape = (batch_size, beam_size)
  first_beam_only = jnp.where(jnp.arange(beam_size) == 0, 0.0, _NEG_INF).astype(jnp.float32)
  return BeamState(
      step=jnp.zeros((), jnp.int32),
      last_ids=jnp.full(shape, bos_id, jnp.int32),
      alive_seqs=jnp.zeros((*shape, max_decode_len), jnp.int32),
      alive_log_probs=jnp.broadcast_to(first_beam_only, shape),
      alive_state=beams_state,
      finished_seqs=jnp.zeros((*shape, max_decode_len), jnp.int32),
      finished_scores=jnp.full(shape, _NEG_INF, jnp.float32),
      num_finished=jnp.zeros((batch_size,), jnp.int32),
      done=jnp.zeros((batch_size,), bool))


def _beam_step(step_fn: TokensToLogits, reorder: ReorderState, eos_id: int, ranking: Ranking,
               max_lengths: Array, min_length: int,
               prefix_at: Callable[[Array], tuple[Array, Array] | None],
               state: BeamState, *, forbid: Array | None = None) -> BeamState:
  """One position for every beam: score the candidates, keep K finished and K alive.

  A loop iteration runs k steps (`loop.segmented_loop`), so steps can follow the last position or
  the early exit. A step past L (`valid` false) changes nothing but the state. A step after a
  sentence is `done` changes none of its outputs: its EOS candidates are dropped, and
  `_ranked_hypotheses` reads its alive beams only when it is not done ("top_k") or has fewer
  than K finished ("every_beam"), which `done` allows only when no alive beam (all -inf) is
  left. ("every_beam": a done sentence's EOS candidates could not have entered its K finished
  anyway, see `_every_beam_done`.)
  """
  batch, beams, max_len = state.alive_seqs.shape
  valid = state.step < max_len
  logits, new_state = step_fn(state.last_ids.reshape(batch * beams, 1), state.alive_state)
  logits = logits.astype(jnp.float32)
  log_normalizer = None
  if forbid is not None:  # Scores stay the model's log-probabilities.
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    logits = _ban_forbidden(logits, state.alive_seqs, state.step, forbid)
  eos_log_probs, token_log_probs, token_ids = _expand(logits, eos_id, beams, log_normalizer)
  forced = state.step >= max_lengths  # [B]: EOS is the only choice from here on.
  eos_allowed = (state.step >= min_length) | forced  # [B]
  first_free = None
  if (prefix := prefix_at(state.step)) is not None:
    forcing, token, first_free = prefix
    token_log_probs, token_ids = _force_prefix(token_log_probs, token_ids, forcing, token)
    forced, eos_allowed = forced & ~forcing, eos_allowed & ~forcing

  # Alive candidates: the C best non-EOS tokens of every beam -> [B, K*C], keep the K best.
  candidates = state.alive_log_probs[..., None] + token_log_probs.reshape(batch, beams, -1)
  candidates = jnp.where(forced[:, None], _NEG_INF, candidates.reshape(batch, -1))
  alive_log_probs, flat = lax.top_k(candidates, beams)  # [B, K]

  # Finished candidates: alive beams followed by EOS -> [B, K], summed log-probabilities.
  eos_sums = state.alive_log_probs + eos_log_probs.reshape(batch, beams)
  finishes = eos_allowed[:, None] & valid & ~state.done[:, None] & (eos_sums > _NEG_INF)
  if ranking.finish_rule == "top_k":
    # The K best extensions of the step lie among the K EOS ones and the K best others.
    kth_best = lax.top_k(jnp.concatenate([eos_sums, alive_log_probs], axis=1), beams)[0]
    finishes &= eos_sums >= kth_best[:, -1:]
    if first_free is not None:  # A prefix's first free step (module docstring).
      eos_ranked = jnp.any(finishes, axis=1) & first_free  # [B]; only beam 0 is alive here
      second = eos_ranked & (jnp.max(eos_sums, axis=1) < alive_log_probs[:, 0])  # [B]
      finishes &= ~second[:, None]
      alive_log_probs = alive_log_probs.at[:, -1].set(
          jnp.where(second, _NEG_INF, alive_log_probs[:, -1]))
  finished = _finish(state, finishes, eos_sums, eos_id, ranking)
  parent = flat // token_log_probs.shape[-1]  # [B, K]
  tokens = jnp.take_along_axis(token_ids.reshape(batch, -1), flat, axis=1)  # [B, K]
  return _advanced(state, valid, finished, alive_log_probs, parent, tokens, new_state, reorder,
                   ranking, max_lengths)


@flax.struct.dataclass
class _Finished:
  """A step's finished hypotheses (`_finish`) and its position mask."""

  seqs: Array  # int32 [B, K, L]
  scores: Array  # float32 [B, K]
  count: Array  # int32 [B]
  at_step: Array  # bool [L]: the position this step writes.


def _finish(state: BeamState, finishes: Array, eos_sums: Array, eos_id: int, ranking: Ranking
            ) -> _Finished:
  """The K best finished hypotheses after the EOS extensions `finishes` (bool [B, K], their
  summed log-probabilities eos_sums [B, K]) join the earlier ones."""
  beams, max_len = state.alive_seqs.shape[1:]
  eos_scores = jnp.where(finishes, eos_sums / ranking.divisor(state.step + 1), _NEG_INF)
  at_step = jnp.arange(max_len) == state.step  # [L]
  eos_seqs = jnp.where(at_step, eos_id, state.alive_seqs)  # [B, K, L]
  finished_scores, pick = lax.top_k(
      jnp.concatenate([state.finished_scores, eos_scores], axis=1), beams)  # [B, K]
  finished_seqs = jnp.take_along_axis(
      jnp.concatenate([state.finished_seqs, eos_seqs], axis=1), pick[..., None], axis=1)
  num_finished = state.num_finished + jnp.sum(finishes, axis=1, dtype=jnp.int32)  # [B]
  return _Finished(finished_seqs, finished_scores, num_finished, at_step)


def _advanced(state: BeamState, valid: Array, finished: _Finished, alive_log_probs: Array,
              parent: Array, tokens: Array, new_state: PyTree, reorder: ReorderState,
              ranking: Ranking, max_lengths: Array, constraint_met: Array | None = None
              ) -> BeamState:
  """The loop state after a step: beam k of sentence b continues beam parent[b, k] with
  tokens[b, k] (parent, tokens int32 [B, K]; alive_log_probs [B, K] their sums), and the
  callable's `new_state` is reordered alike. A step past L (`valid` false) keeps the beams."""
  beams, max_len = state.alive_seqs.shape[1:]
  alive_seqs = jnp.where(finished.at_step, tokens[..., None],
                         jnp.take_along_axis(state.alive_seqs, parent[..., None], axis=1))
  keep = lambda new, old: jnp.where(valid, new, old)
  alive_log_probs = keep(alive_log_probs, state.alive_log_probs)
  if ranking.finish_rule == "top_k":
    # Not at the last position: there the alive beams among the step's K best finish too
    # (`_ranked_hypotheses`), so a sentence ending there must keep them.
    done = (finished.count >= beams) & (state.step + 1 < max_len)
  else:
    done = _every_beam_done(alive_log_probs, finished.scores, state.step + 1, max_lengths,
                            max_len, ranking)
  return BeamState(
      step=state.step + valid.astype(jnp.int32), last_ids=keep(tokens, state.last_ids),
      alive_seqs=keep(alive_seqs, state.alive_seqs), alive_log_probs=alive_log_probs,
      alive_state=reorder(new_state, parent),
      finished_seqs=finished.seqs, finished_scores=finished.scores, num_finished=finished.count,
      done=state.done | done | (alive_log_probs[:, 0] == _NEG_INF),
      constraint_met=None if constraint_met is None else keep(constraint_met,
                                                              state.constraint_met))


def _natural_candidates(alive: Array, token_log_probs: Array, token_ids: Array, forced: Array,
                        advancing: Array, exists: Array) -> tuple[Array, Array]:
  """Candidates (a), the sentence's K best, and (c), each beam's best, of the beams' K + 2 best
  tokens (token_log_probs, token_ids [B*K, K + 2]; alive [B, K]; forced [B]): their sums
  (-inf where neither, where the length cap forces EOS, or where the token is already a (b)
  candidate: advancing int32 [B, K, 2C] where exists) and ids, each [B, K, K + 2]."""
  batch, beams = alive.shape
  natural_ids = token_ids.reshape(batch, beams, -1)
  natural = alive[..., None] + token_log_probs.reshape(batch, beams, -1)
  natural = jnp.where(forced[:, None, None], _NEG_INF, natural)
  columns = natural.shape[-1]
  k_best = lax.top_k(natural.reshape(batch, -1), beams)[1]  # [B, K] into K * (K + 2)
  in_k_best = jnp.any(jnp.arange(beams * columns)[None, :, None] == k_best[:, None, :], axis=-1)
  beam_best = jnp.arange(columns) == jnp.argmax(natural, axis=-1)[..., None]  # [B, K, K + 2]
  counted = jnp.any((natural_ids[..., :, None] == advancing[..., None, :])
                    & exists[..., None, :], axis=-1)  # Already a (b) candidate.
  natural = jnp.where((in_k_best.reshape(natural.shape) | beam_best) & ~counted, natural,
                      _NEG_INF)
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
                              jnp.take_along_axis(sums, pick, axis=1), _NEG_INF)  # [B, K]
  return first, eos_order, finishes, alive_log_probs, pick


def _constrained_beam_step(step_fn: TokensToLogits, reorder: ReorderState, eos_id: int,
                           ranking: Ranking, max_lengths: Array, min_length: int,
                           prefix_at: Callable[[Array], tuple[Array, Array] | None],
                           phrases: Array, ordered: bool, forbid: Array | None,
                           state: BeamState) -> BeamState:
  """`_beam_step` under constraints (phrases int32 [B, C, P]): the candidates of
  `decoding.constraints` (sources a-d), allocated to banks, taken in DBA's rounds.

  N = K * (K + 2) + K * 2C + K candidates per sentence: every beam's K + 2 best tokens (those
  in source a or c kept), its 2C constraint tokens (b), its EOS (d). Everything else, the
  steps past L and after `done` included, is as in `_beam_step`.
  """
  batch, beams, max_len = state.alive_seqs.shape
  valid = state.step < max_len
  logits, new_state = step_fn(state.last_ids.reshape(batch * beams, 1), state.alive_state)
  logits = logits.astype(jnp.float32)  # [B*K, V]
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [B*K]: of the model, before any ban.
  if forbid is not None:
    logits = _ban_forbidden(logits, state.alive_seqs, state.step, forbid)
  eos_log_probs, token_log_probs, token_ids = _expand(logits, eos_id, beams, log_normalizer)
  forced = state.step >= max_lengths  # [B]: EOS is the only choice from here on.
  eos_allowed = (state.step >= min_length) | forced  # [B]
  forcing, first_free = jnp.zeros_like(forced), None
  if (prefix := prefix_at(state.step)) is not None:
    forcing, token, first_free = prefix
    token_log_probs, token_ids = _force_prefix(token_log_probs, token_ids, forcing, token)
    forced, eos_allowed = forced & ~forcing, eos_allowed & ~forcing
  alive, met = state.alive_log_probs, state.constraint_met  # [B, K], [B, K, C]
  window = constraints_lib.tail(state.alive_seqs, state.step, phrases.shape[-1])  # [B, K, P]

  # (b): the pieces that advance a constraint -> [B, K, 2C].
  advancing, exists = constraints_lib.advancing_tokens(window, phrases, met, ordered)
  exists &= ~(forced | forcing)[:, None, None] & (advancing != eos_id)
  advancing_log_probs = (jnp.take_along_axis(logits.reshape(batch, beams, -1), advancing, axis=-1)
                         - log_normalizer.reshape(batch, beams, 1))
  advancing_sums = jnp.where(exists, alive[..., None] + advancing_log_probs, _NEG_INF)
  natural, natural_ids = _natural_candidates(alive, token_log_probs, token_ids, forced,
                                             advancing, exists)  # (a), (c): [B, K, K + 2]
  columns = natural.shape[-1]
  # (d): EOS of the beams that met every constraint (or that the length cap stops) -> [B, K].
  eos_sums = alive + eos_log_probs.reshape(batch, beams)
  eos_ok = (eos_allowed[:, None] & (constraints_lib.all_met(met, phrases) | forced[:, None])
            & valid & ~state.done[:, None] & (eos_sums > _NEG_INF))

  sums = jnp.concatenate([natural.reshape(batch, -1), advancing_sums.reshape(batch, -1),
                          jnp.where(eos_ok, eos_sums, _NEG_INF)], axis=1)  # [B, N]
  ids = jnp.concatenate([natural_ids.reshape(batch, -1), advancing.reshape(batch, -1),
                         jnp.full((batch, beams), eos_id, jnp.int32)], axis=1)  # [B, N]
  parents = jnp.concatenate([jnp.repeat(jnp.arange(beams), columns),
                             jnp.repeat(jnp.arange(beams), advancing.shape[-1]),
                             jnp.arange(beams)])  # [N]
  windows = jnp.concatenate([window[:, parents, 1:], ids[..., None]], axis=-1)  # [B, N, P]
  new_met, banks = constraints_lib.advance(windows, phrases, met[:, parents], ordered)
  order = constraints_lib.bank_order(sums, banks, constraints_lib.num_banks(phrases))  # [B, N]

  first, eos_order, finishes, alive_log_probs, pick = _take_rounds(order, sums, eos_ok)
  if first_free is not None:  # A prefix's first free step (module docstring).
    eos_ranked = jnp.any(finishes, axis=1) & first_free  # [B]
    second = eos_ranked & (jnp.min(eos_order, axis=1) > first[:, 0])  # [B]: EOS not the best.
    finishes &= ~second[:, None]
    alive_log_probs = alive_log_probs.at[:, -1].set(
        jnp.where(second, _NEG_INF, alive_log_probs[:, -1]))
  finished, finished_met = _finish_constrained(
      state, finishes, eos_sums, constraints_lib.all_met(met, phrases), eos_id, ranking)
  return _advanced(state, valid, finished, alive_log_probs, parents[pick],
                   jnp.take_along_axis(ids, pick, axis=1), new_state, reorder, ranking,
                   max_lengths, jnp.take_along_axis(new_met, pick[..., None], axis=1)
                   ).replace(finished_met=finished_met)


def _met_first(met: Array, scores: Array, count: int) -> Array:
  """int32 [B, count]: positions of the `count` best of met bool [B, N] and scores [B, N]:
  hypotheses that met every constraint first, then by score, then by position; -inf last."""
  group = jnp.where(scores == _NEG_INF, 2, jnp.where(met, 0, 1))
  position = jnp.broadcast_to(jnp.arange(scores.shape[1], dtype=jnp.int32), scores.shape)
  return lax.sort((group, -scores, position), dimension=1, num_keys=2)[2][:, :count]


def _finish_constrained(state: BeamState, finishes: Array, eos_sums: Array, eos_met: Array,
                        eos_id: int, ranking: Ranking) -> tuple[_Finished, Array]:
  """`_finish` under constraints: the K finished hypotheses kept are those that met every
  constraint first (eos_met bool [B, K]: the finishing beams'; the length cap finishes the
  others), then by score, so a forced one never takes a met one's place. Also their met flags
  [B, K]."""
  beams, max_len = state.alive_seqs.shape[1:]
  eos_scores = jnp.where(finishes, eos_sums / ranking.divisor(state.step + 1), _NEG_INF)
  at_step = jnp.arange(max_len) == state.step  # [L]
  eos_seqs = jnp.where(at_step, eos_id, state.alive_seqs)  # [B, K, L]
  scores = jnp.concatenate([state.finished_scores, eos_scores], axis=1)  # [B, 2K]
  met = jnp.concatenate([state.finished_met, eos_met], axis=1)
  pick = _met_first(met, scores, beams)  # [B, K]
  finished_seqs = jnp.take_along_axis(
      jnp.concatenate([state.finished_seqs, eos_seqs], axis=1), pick[..., None], axis=1)
  num_finished = state.num_finished + jnp.sum(finishes, axis=1, dtype=jnp.int32)  # [B]
  return (_Finished(finished_seqs, jnp.take_along_axis(scores, pick, axis=1), num_finished,
                    at_step), jnp.take_along_axis(met, pick, axis=1))


def _ban_forbidden(logits: Array, sequences: Array, step: Array, forbid: Array) -> Array:
  """logits [R, V] of the rows of sequences [B, (K,) L] at `step`, -inf where a forbidden
  phrase (forbid int32 [B, F, P]) would end (`decoding.constraints.ban_forbidden`)."""
  rows = logits.shape[0]
  history = constraints_lib.tail(sequences, step, forbid.shape[-1] - 1).reshape(rows, -1)
  return constraints_lib.ban_forbidden(
      logits, history, jnp.repeat(forbid, rows // forbid.shape[0], axis=0))


def _expand(logits: Array, eos_id: int, beams: int, log_normalizer: Array | None = None
            ) -> tuple[Array, Array, Array]:
  """Log-probabilities of EOS and of the best C = min(V, K + 2) tokens of every row.

  A row's K best non-EOS, non-padding tokens are among its K + 2 best, so one top-k over the raw
  logits (same order as log-probabilities) finds them without a full-vocabulary log-softmax;
  EOS and padding among them get -inf.

  Args:
    logits: float32 [R, V] (R = B*K rows).
    log_normalizer: float32 [R], log-sum-exp of the logits before any were banned (None:
      of `logits`).
  Returns:
    (eos log-prob [R], token log-probs [R, C], token ids int32 [R, C]).
  """
  if log_normalizer is None:
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [R]
  eos_log_probs = logits[:, eos_id] - log_normalizer
  top_logits, top_ids = _top_k(logits, min(logits.shape[-1], beams + 2))  # [R, C]
  emittable = (top_ids != eos_id) & (top_ids != PAD_ID)
  token_log_probs = jnp.where(emittable, top_logits - log_normalizer[:, None], _NEG_INF)
  return eos_log_probs, token_log_probs, top_ids


def _force_prefix(token_log_probs: Array, token_ids: Array, forcing: Array, token: Array
                  ) -> tuple[Array, Array]:
  """The candidates of rows that take their prefix token: that token alone, adding 0 to the
  score (module docstring, "Target prefix"). token_log_probs/ids [R, C], forcing bool [B],
  token int32 [B] (R = B*K) -> (token_log_probs, token_ids)."""
  beams = token_ids.shape[0] // forcing.shape[0]
  row_forcing = jnp.repeat(forcing, beams)[:, None]  # [R, 1]
  first = jnp.arange(token_ids.shape[1]) == 0  # [C]: the prefix token takes the first column.
  token_log_probs = jnp.where(row_forcing, jnp.where(first, 0.0, _NEG_INF), token_log_probs)
  token_ids = jnp.where(row_forcing & first, jnp.repeat(token, beams)[:, None], token_ids)
  return token_log_probs, token_ids


def _gather_beams(state: PyTree, parent: Array) -> PyTree:
  """Rows of every leaf [B*K, ...] reordered by parent beam int [B, K]; 0-d leaves as given."""
  batch, beams = parent.shape
  rows = (jnp.arange(batch, dtype=jnp.int32)[:, None] * beams + parent).reshape(-1)  # [B*K]
  gather = lambda x: x if jnp.ndim(x) == 0 else jnp.take(x, rows, axis=0, mode="clip")
  return jax.tree.map(gather, state)


def _every_beam_done(alive_log_probs: Array, finished_scores: Array, num_tokens: Array,
                     max_lengths: Array, max_decode_len: int, ranking: Ranking) -> Array:
  """bool [B]: whether no alive beam can beat its sentence's K-th finished hypothesis any more.

  An alive beam now holds `num_tokens` tokens and could finish with n in [num_tokens + 1,
  n_max] tokens. Its log-probability sum (<= 0) can only fall, and every divisor is monotonic
  in n, so its best possible score is the sum divided by the larger divisor of the two ends.
  """
  n_max = jnp.minimum(max_lengths + 1, max_decode_len)  # [B]
  largest_divisor = jnp.maximum(ranking.divisor(num_tokens + 1),
                                ranking.divisor(n_max))  # [B]
  best_possible = alive_log_probs[:, 0] / largest_divisor  # [B]; alive is sorted best first
  return best_possible <= finished_scores[:, -1]


def _ranked_hypotheses(final: BeamState, ranking: Ranking) -> tuple[Array, Array]:
  """The K hypotheses to return per sentence, best first.

  "top_k": a sentence the length limit stopped (not done) ranks its alive beams, cut at L
  tokens, together with its finished hypotheses, as CTranslate2 finishes every beam at its last
  step and Hugging Face adds the alive beams at `max_length`. "every_beam": finished
  hypotheses first, then unfinished alive beams fill the free slots (Flax's examples/wmt).
  """
  beams = final.alive_seqs.shape[1]
  unfinished_scores = final.alive_log_probs / ranking.divisor(final.step)  # [B, K]
  if ranking.finish_rule == "top_k":
    unfinished_scores = jnp.where(final.done[:, None], _NEG_INF, unfinished_scores)
    _, pick = lax.top_k(jnp.concatenate([final.finished_scores, unfinished_scores], axis=1),
                        beams)  # [B, K] into 2K; ties keep finished ones first
  else:
    num_finished = jnp.minimum(final.num_finished, beams)[:, None]  # [B, 1]
    slot = jnp.arange(beams)[None, :]  # [1, K]
    pick = jnp.where(slot < num_finished, slot, beams + slot - num_finished)  # [B, K] into 2K
  scores = jnp.take_along_axis(
      jnp.concatenate([final.finished_scores, unfinished_scores], axis=1), pick, axis=1)
  sequences = jnp.take_along_axis(
      jnp.concatenate([final.finished_seqs, final.alive_seqs], axis=1), pick[..., None], axis=1)
  sequences = jnp.where(scores[..., None] > _NEG_INF, sequences, PAD_ID)
  return sequences, scores


def _ranked_constrained_hypotheses(final: BeamState, ranking: Ranking, phrases: Array
                                   ) -> tuple[Array, Array]:
  """`_ranked_hypotheses` ("top_k") under constraints: hypotheses that met every constraint
  first (finished ones, or alive ones cut at L), then by score; the length cap's come after."""
  beams = final.alive_seqs.shape[1]
  unfinished_scores = jnp.where(final.done[:, None], _NEG_INF,
                                final.alive_log_probs / ranking.divisor(final.step))  # [B, K]
  scores = jnp.concatenate([final.finished_scores, unfinished_scores], axis=1)  # [B, 2K]
  met = jnp.concatenate([final.finished_met,
                         constraints_lib.all_met(final.constraint_met, phrases)], axis=1)
  pick = _met_first(met, scores, beams)  # [B, K]; ties keep finished ones first
  scores = jnp.take_along_axis(scores, pick, axis=1)
  sequences = jnp.take_along_axis(
      jnp.concatenate([final.finished_seqs, final.alive_seqs], axis=1), pick[..., None], axis=1)
  return jnp.where(scores[..., None] > _NEG_INF, sequences, PAD_ID), scores


@flax.struct.dataclass
class _SequentialState:
  """The loop state of greedy decoding and sampling (one hypothesis per sentence)."""

  step: Array  # int32 []: the position decoded next.
  last_ids: Array  # int32 [B]: every row's last token (`bos_id` before step 0).
  sequences: Array  # int32 [B, L]: tokens so far, zeros after EOS.
  log_probs: Array  # float32 [B]: summed log-probabilities up to and including EOS.
  finished: Array  # bool [B]: EOS emitted.
  state: PyTree  # the callable's state, leaves [B, ...].


# (logits float32 [B, V], eos_allowed bool [B], step int32 []) -> next tokens int32 [B].
TokenChooser = Callable[[Array, Array, Array], Array]


def greedy_search(problem: SearchProblem, *, loop_options: LoopOptions = loop.DEFAULT_OPTIONS
                  ) -> tuple[Array, Array]:
  """Greedy decoding: the most probable emittable token at every step.

  The same `SearchProblem` and `loop_options` as `beam_search` (K = 1, so `initial_state`
  leaves [B, ...] are used as they are).

  Returns:
    (sequences int32 [B, L], scores float32 [B]): tokens up to and including EOS, zeros after;
    the summed log-probability of those tokens (no length penalty).
  """
  def best(logits: Array, eos_allowed: Array, step: Array) -> Array:
    # Padding and a forbidden EOS can take two of the three best places.
    _, ids = _top_k(logits, min(3, logits.shape[-1]))  # [B, 3]
    allowed = (ids != PAD_ID) & ((ids != problem.eos_id) | eos_allowed[:, None])
    return jnp.take_along_axis(ids, jnp.argmax(allowed, axis=1)[:, None], axis=1)[:, 0]

  return _sequential_search("greedy_search", problem, best, loop_options)


def sample(problem: SearchProblem, rng: Array, *, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, loop_options: LoopOptions = loop.DEFAULT_OPTIONS
           ) -> tuple[Array, Array]:
  """Ancestral sampling from softmax(logits / temperature), optionally top-k and nucleus (top-p).

  Filters apply in the order temperature, top-k (keep the k most probable tokens; 0 = all),
  top-p (keep the smallest most-probable set whose probability reaches `top_p`; 1 = all).
  The same `SearchProblem` and `loop_options` as `beam_search` with K = 1.

  `rng` is one key for the batch, or one key per row ([B] keys, e.g. `jax.random.fold_in(key,
  line_index)` for each row): then every row draws its noise from its own key folded with the
  step, so a row's sample depends on its key and logits alone, not on the other rows, the batch
  size or the row's position. Typed keys (`jax.random.key`) and raw uint32 keys both work.

  Returns:
    (sequences int32 [B, L], scores float32 [B]): sampled tokens up to and including EOS, zeros
    after; the model's summed log-probability of them (log-softmax of the unfiltered logits).
  """
  if not temperature > 0:
    raise ValueError(f"sample: temperature must be > 0, got {temperature!r}.")
  if not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"sample: top_k must be an int >= 0 (0 = no limit), got {top_k!r}.")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"sample: top_p must lie in (0, 1], got {top_p!r}.")
  if not jax.dtypes.issubdtype(jnp.result_type(rng), jax.dtypes.prng_key):
    rng = jax.random.wrap_key_data(rng)  # Raw uint32 key data: [2] or [B, 2] (threefry).
  if rng.shape not in ((), (problem.batch_size,)):
    raise ValueError(f"sample: rng must be one key or one key per row ({problem.batch_size},), "
                     f"got keys of shape {rng.shape}.")
  eos_id = problem.eos_id

  def draw(logits: Array, eos_allowed: Array, step: Array) -> Array:
    logits = logits.at[:, PAD_ID].set(_NEG_INF)
    logits = logits.at[:, eos_id].set(jnp.where(eos_allowed, logits[:, eos_id], _NEG_INF))
    logits = logits / temperature
    if top_k:
      logits = _top_k_filter(logits, top_k)
    if top_p < 1.0:
      logits = _top_p_filter(logits, top_p)
    # Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits).
    if rng.ndim:  # One key per row: [B] keys -> noise [B, V], row by row.
      row_noise = lambda key: jax.random.gumbel(jax.random.fold_in(key, step),
                                                logits.shape[1:], jnp.float32)
      noise = jax.vmap(row_noise)(rng)
    else:
      noise = jax.random.gumbel(jax.random.fold_in(rng, step), logits.shape, jnp.float32)
    return _top_k(logits + noise, 1)[1][:, 0]

  return _sequential_search("sample", problem, draw, loop_options)


def _top_k_filter(logits: Array, k: int) -> Array:
  """-inf for every token below the k-th largest logit of its row; logits [R, V]."""
  kth = _top_k(logits, min(k, logits.shape[-1]))[0][:, -1:]  # [R, 1]
  return jnp.where(logits < kth, _NEG_INF, logits)


def _top_p_filter(logits: Array, top_p: float) -> Array:
  """-inf outside the smallest most-probable set of tokens with probability >= top_p."""
  sorted_logits = lax.top_k(logits, logits.shape[-1])[0]  # [R, V], descending
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # keeps the first token always
  threshold = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1,
                      keepdims=True)  # [R, 1]
  return jnp.where(logits < threshold, _NEG_INF, logits)


def _sequential_search(name: str, problem: SearchProblem, choose: TokenChooser,
                       loop_options: LoopOptions) -> tuple[Array, Array]:
  """The loop shared by greedy decoding and sampling; `choose` picks each next token.

  A row that has finished, or a step past L (the last iteration may run up to k - 1 of them),
  emits padding and adds nothing to the score, so steps after the early exit or after L
  change no output.
  """
  if problem.constraints is not None:
    raise ValueError(f"{name}: constraints need beam search (dynamic beam allocation), not "
                     "one hypothesis per sentence.")
  steps = loop.resolved_steps(name, loop_options.steps_per_iteration, beam=False)
  step_fn = problem.step_fn()
  forbid = None if problem.forbid is None else jnp.asarray(problem.forbid, jnp.int32)
  batch_size, max_decode_len, eos_id = problem.batch_size, problem.max_decode_len, problem.eos_id
  min_length, max_lengths = problem.min_length, problem.length_caps()
  capacities, initial_state = loop.capacities(max_decode_len, problem.resize_state,
                                              loop_options.segment_length, steps,
                                              problem.initial_state)
  start = _SequentialState(
      step=jnp.zeros((), jnp.int32),
      last_ids=jnp.full((batch_size,), problem.bos_id, jnp.int32),
      sequences=jnp.zeros((batch_size, max_decode_len), jnp.int32),
      log_probs=jnp.zeros((batch_size,), jnp.float32),
      finished=jnp.zeros((batch_size,), bool), state=initial_state)
  _check_step_fn(step_fn, start.last_ids[:, None], initial_state, eos_id)

  def step(s: _SequentialState) -> _SequentialState:
    logits, new_state = step_fn(s.last_ids[:, None], s.state)
    logits = model_logits = logits.astype(jnp.float32)  # [B, V]
    if forbid is not None:
      logits = _ban_forbidden(logits, s.sequences, s.step, forbid)
    forced = s.step >= max_lengths  # [B]
    tokens = jnp.where(forced, eos_id, choose(logits, (s.step >= min_length) | forced, s.step))
    forcing = None
    if (prefix := problem.prefix_at(s.step)) is not None:
      forcing, token, _ = prefix
      tokens = jnp.where(forcing, token, tokens)
    silent = s.finished | (s.step >= max_decode_len)  # [B]: emits padding, scores nothing.
    tokens = jnp.where(silent, PAD_ID, tokens)  # [B]
    log_probs = (jnp.take_along_axis(model_logits, tokens[:, None], axis=1)[:, 0]
                 - jax.nn.logsumexp(model_logits, axis=-1))
    return _SequentialState(
        step=s.step + 1, last_ids=tokens,
        sequences=jnp.where(jnp.arange(max_decode_len) == s.step, tokens[:, None], s.sequences),
        log_probs=s.log_probs + jnp.where(silent if forcing is None else silent | forcing,
                                          0.0, log_probs),  # A prefix token adds 0.
        finished=s.finished | (tokens == eos_id), state=new_state)

  grow = lambda s, capacity: s.replace(
      state=loop.resized(problem.resize_state, s.state, capacity))
  final = loop.segmented_loop(capacities, grow, lambda s: ~jnp.all(s.finished), step, steps,
                              start)
  return final.sequences, final.log_probs


def _check_leading_dim(what: str, tree: PyTree, batch_size: int) -> None:
  """Every leaf of `tree` must be 0-d or lead with `batch_size`."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    shape = jnp.shape(leaf)
    if shape and shape[0] != batch_size:
      raise ValueError(
          f"{what}{jax.tree_util.keystr(path)} has shape {shape}; leaves must lead with "
          f"batch_size={batch_size} (or be 0-d).")


def _check_step_fn(step_fn: TokensToLogits, ids: Array, state: PyTree, eos_id: int) -> None:
  """Traces one step (no compute) and checks the logits shape and that the state keeps its form."""
  logits, new_state = jax.eval_shape(step_fn, ids, state)
  rows = ids.shape[0]
  if logits.ndim != 2 or logits.shape[0] != rows:
    raise ValueError(
        f"tokens_to_logits must return logits [{rows}, V] for ids {ids.shape}, got "
        f"{logits.shape}.")
  if not 0 < eos_id < logits.shape[1]:
    raise ValueError(f"eos_id={eos_id} is outside the vocabulary (V={logits.shape[1]}).")
  before = [(jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(state)]
  after = [(x.shape, x.dtype) for x in jax.tree.leaves(new_state)]
  if jax.tree.structure(state) != jax.tree.structure(new_state) or before != after:
    raise ValueError(
        "tokens_to_logits must return a state with the same structure, shapes and dtypes as "
        f"it was given; got {after}, expected {before}.")
