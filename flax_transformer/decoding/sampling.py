"""Greedy decoding and sampling: one hypothesis per sentence, the next token chosen from each
step's logits (the most probable, or drawn), over the same `SearchProblem` as beam search
(K = 1: `initial_state` leaves [B, ...] are used as they are). Constraints need beam search;
forbidden phrases, the target prefix and the length limits apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import PAD_ID
from flax_transformer.decoding import loop
from flax_transformer.decoding.beam_state import NEG_INF, ban_forbidden, whole_word_prefix
from flax_transformer.decoding.loop import LoopOptions
from flax_transformer.decoding.search import PyTree, SearchProblem, check_step_fn
from flax_transformer.decoding.topk import top_k as _top_k

Array = jax.Array


@flax.struct.dataclass
class SequentialState:
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
  return _sequential_search("greedy_search", problem, greedy_chooser(problem.eos_id),
                            loop_options)


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
  rng = sample_keys(rng, problem.batch_size)
  choose = sample_chooser(rng, problem.eos_id, temperature=temperature, top_k=top_k,
                          top_p=top_p)
  return _sequential_search("sample", problem, choose, loop_options)


def greedy_chooser(eos_id: int) -> TokenChooser:
  """Greedy decoding's choice: the most probable emittable token of every row."""

  def best(logits: Array, eos_allowed: Array, step: Array) -> Array:
    # Padding and a forbidden EOS can take two of the three best places.
    _, ids = _top_k(logits, min(3, logits.shape[-1]))  # [B, 3]
    allowed = (ids != PAD_ID) & ((ids != eos_id) | eos_allowed[:, None])
    return jnp.take_along_axis(ids, jnp.argmax(allowed, axis=1)[:, None], axis=1)[:, 0]

  return best


def sample_keys(rng: Array, batch_size: int) -> Array:
  """`sample`'s rng as typed keys, checked: one key, or one per row ([B])."""
  if not jax.dtypes.issubdtype(jnp.result_type(rng), jax.dtypes.prng_key):
    rng = jax.random.wrap_key_data(rng)  # Raw uint32 key data: [2] or [B, 2] (threefry).
  if rng.shape not in ((), (batch_size,)):
    raise ValueError(f"sample: rng must be one key or one key per row ({batch_size},), "
                     f"got keys of shape {rng.shape}.")
  return rng


def sample_chooser(rng: Array, eos_id: int, *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> TokenChooser:
  """Sampling's choice (`sample`): a draw from each row's filtered distribution, its noise
  from `rng` (typed keys, one or one per row: `sample_keys`) folded with the step."""
  if not temperature > 0:
    raise ValueError(f"sample: temperature must be > 0, got {temperature!r}.")
  if not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f"sample: top_k must be an int >= 0 (0 = no limit), got {top_k!r}.")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"sample: top_p must lie in (0, 1], got {top_p!r}.")

  def draw(logits: Array, eos_allowed: Array, step: Array) -> Array:
    logits = logits.at[:, PAD_ID].set(NEG_INF)
    logits = logits.at[:, eos_id].set(jnp.where(eos_allowed, logits[:, eos_id], NEG_INF))
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

  return draw


def _top_k_filter(logits: Array, k: int) -> Array:
  """-inf for every token below the k-th largest logit of its row; logits [R, V]."""
  kth = _top_k(logits, min(k, logits.shape[-1]))[0][:, -1:]  # [R, 1]
  return jnp.where(logits < kth, NEG_INF, logits)


def _top_p_filter(logits: Array, top_p: float) -> Array:
  """-inf outside the smallest most-probable set of tokens with probability >= top_p."""
  sorted_logits = lax.top_k(logits, logits.shape[-1])[0]  # [R, V], descending
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # keeps the first token always
  threshold = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1,
                      keepdims=True)  # [R, 1]
  return jnp.where(logits < threshold, NEG_INF, logits)


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
  context = sequential_context(problem)
  capacities, initial_state = loop.capacities(problem.max_decode_len, problem.resize_state,
                                              loop_options.segment_length, steps,
                                              problem.initial_state)
  start = sequential_start(problem, initial_state)
  check_step_fn(context.step_fn, start.last_ids[:, None], initial_state, problem.eos_id)
  grow = lambda s, capacity: s.replace(
      state=loop.resized(problem.resize_state, s.state, capacity))
  final = loop.segmented_loop(capacities, grow, lambda s: ~jnp.all(s.finished),
                              lambda s: sequential_step(context, choose, s), steps, start)
  return final.sequences, final.log_probs


def sequential_start(problem: SearchProblem, initial_state: PyTree | None = None
                     ) -> SequentialState:
  """Greedy decoding's and sampling's loop state before step 0 (`initial_state`: the
  callable's, default the problem's)."""
  batch_size = problem.batch_size
  return SequentialState(
      step=jnp.zeros((), jnp.int32),
      last_ids=jnp.full((batch_size,), problem.bos_id, jnp.int32),
      sequences=jnp.zeros((batch_size, problem.max_decode_len), jnp.int32),
      log_probs=jnp.zeros((batch_size,), jnp.float32),
      finished=jnp.zeros((batch_size,), bool),
      state=problem.initial_state if initial_state is None else initial_state)


@dataclasses.dataclass(frozen=True)
class SequentialContext:
  """What every step of greedy decoding or sampling reads besides the loop state (built once
  per search: `sequential_context`)."""

  problem: SearchProblem
  step_fn: Callable[[Array, PyTree], tuple[Array, PyTree]]
  forbid: Array | None  # int32 [B, F, P]
  word_continues: Array | None  # bool [V]
  max_lengths: Array  # int32 [B]


def sequential_context(problem: SearchProblem) -> SequentialContext:
  """The problem's step function, phrases, word mask and length caps, read once."""
  word_continues = (None if problem.word_continues is None
                    else jnp.asarray(problem.word_continues, bool))
  return SequentialContext(problem, problem.step_fn(), problem.phrases("forbid"),
                           word_continues, problem.length_caps())


def sequential_step(context: SequentialContext, choose: TokenChooser, s: SequentialState
                    ) -> SequentialState:
  """One position of greedy decoding or sampling for every row: the model's step, the length
  limits, the forbidden phrases and the target prefix applied, then `choose`."""
  problem, max_lengths = context.problem, context.max_lengths
  max_decode_len, eos_id = problem.max_decode_len, problem.eos_id
  logits, new_state = context.step_fn(s.last_ids[:, None], s.state)
  logits = model_logits = logits.astype(jnp.float32)  # [B, V]
  if context.forbid is not None:
    logits = ban_forbidden(logits, s.sequences, s.step, context.forbid, context.word_continues,
                           max_lengths, max_decode_len)
  logits = whole_word_prefix(logits, problem.after_prefix(s.step), context.word_continues)
  forced = s.step >= max_lengths  # [B]
  tokens = jnp.where(forced, eos_id,
                     choose(logits, (s.step >= problem.min_length) | forced, s.step))
  forcing = None
  if (prefix := problem.prefix_at(s.step)) is not None:
    forcing, token, _ = prefix
    tokens = jnp.where(forcing, token, tokens)
  silent = s.finished | (s.step >= max_decode_len)  # [B]: emits padding, scores nothing.
  tokens = jnp.where(silent, PAD_ID, tokens)  # [B]
  log_probs = (jnp.take_along_axis(model_logits, tokens[:, None], axis=1)[:, 0]
               - jax.nn.logsumexp(model_logits, axis=-1))
  return SequentialState(
      step=s.step + 1, last_ids=tokens,
      sequences=jnp.where(jnp.arange(max_decode_len) == s.step, tokens[:, None], s.sequences),
      log_probs=s.log_probs + jnp.where(silent if forcing is None else silent | forcing,
                                        0.0, log_probs),  # A prefix token adds 0.
      finished=s.finished | (tokens == eos_id), state=new_state)


__all__ = ["SequentialContext", "SequentialState", "TokenChooser", "greedy_chooser",
           "greedy_search", "sample", "sample_chooser", "sample_keys", "sequential_context",
           "sequential_start", "sequential_step"]
