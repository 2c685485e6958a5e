"""The search contract: what every search decodes (`SearchProblem`) and how beam search ranks
(`Ranking`). The searches are `decoding.beam` (plain beam search), `decoding.constrained_beam`
(terminology constraints) and `decoding.sampling` (greedy decoding and sampling); they know the
model only through one callable (`TokensToLogits`) and the state that callable carries, and
import no model code. The docs' design page ("Decoding") explains the state protocol, the
growing state, the finishing rules, length normalization, the target prefix and the phrases.
Shape letters: B batch, K beams, L max decode length, V vocabulary, C phrases, P pieces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import MAX_LENGTH_PENALTY, PAD_ID
from flax_transformer.decoding.loop import ResizeState

Array = jax.Array
PyTree = Any

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
  """What every search decodes: the step function and its state, and the limits on the outputs
  (docs, "Decoding"). Checked when built (ValueError naming the field).

  Attributes:
    tokens_to_logits: the step function; called with `shared_state` when that is given.
    initial_state: pytree, leaves [B, ...] (repeated for the K beams) or 0-d (carried as is).
    batch_size: B. max_decode_len: L, output tokens including EOS.
    eos_id: ends a hypothesis (must not be 0, the output padding). bos_id: the first input id.
    shared_state: optional pytree (per sentence), passed to every call, never reordered.
    max_lengths: optional int [B], most tokens before EOS per sentence (EOS forced after).
    min_length: fewest tokens before EOS (EOS forbidden earlier).
    resize_state: optional; grows the state in segments (docs, "Growing state").
    expand_state, reorder_state: optional, together; replace beam search's repeat and reorder
      of the state's rows (docs, "State protocol").
    target_prefix: optional int32 [B, P], P <= max_decode_len: tokens every hypothesis of the
      sentence starts with, zeros after; with `word_continues`, the prefix stands as whole
      words (the token after it starts a word).
    constraints: optional int32 [B, C, P]: phrases every hypothesis must contain as whole
      words, each row's pieces then zeros, a zero row for none (`decoding.constraints`).
      ordered_constraints: met in the given order.
    forbid: optional int32 [B, F, P]: phrases no hypothesis may contain as whole words.
    word_continues: optional bool [V]: the pieces that continue the word before them (no
      word boundary before them); None: every piece starts a word, so phrases match as pieces.
    forced_tokens: the prefix's first tokens that are no text (a target language token): a
      prefix of only these is not held to whole words (the token after it is free).
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
  word_continues: Array | None = None
  forced_tokens: int = 0

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
      check_leading_dim("initial_state", self.initial_state, self.batch_size)
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
    if self.word_continues is not None and jnp.ndim(self.word_continues) != 1:
      raise ValueError("SearchProblem: word_continues must be bool [V], got shape "
                       f"{jnp.shape(self.word_continues)}.")
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

  def after_prefix(self, step: Array) -> Array | None:
    """bool [B]: the rows whose (nonempty) prefix ended just before `step`, where the next
    token must start a word (with `word_continues`); None without a prefix."""
    if self.target_prefix is None:
      return None
    lengths = jnp.sum(jnp.asarray(self.target_prefix) != PAD_ID, axis=1)  # [B]
    return (step == lengths) & (lengths > self.forced_tokens)

  def phrases(self, name: str) -> Array | None:
    """`constraints` or `forbid` as int32 [B, C, P], None when absent."""
    phrases = getattr(self, name)
    return None if phrases is None else jnp.asarray(phrases, jnp.int32)

  def replace(self, **changes: Any) -> SearchProblem:
    """A copy with `changes` applied (checked again)."""
    return dataclasses.replace(self, **changes)


@flax.struct.dataclass
class Ranking:
  """How beam search finishes and ranks hypotheses (docs, "Decoding").

  `length_penalty` (alpha) is data: a float, or a float32 scalar traced by jit, so one compiled
  search serves every alpha. `length_normalization` and `finish_rule` are static: they change
  the program.
  """

  length_penalty: float | Array = 0.6  # alpha, in [0, MAX_LENGTH_PENALTY]
  length_normalization: str = flax.struct.field(pytree_node=False, default="gnmt")
  finish_rule: str = flax.struct.field(pytree_node=False, default="top_k")

  def __post_init__(self):
    alpha = self.length_penalty
    if isinstance(alpha, int | float) and not 0 <= alpha <= MAX_LENGTH_PENALTY:
      raise ValueError(f"Ranking: length_penalty must be in [0, {MAX_LENGTH_PENALTY:g}], got "
                       f"{alpha!r}.")
    if self.length_normalization not in LENGTH_NORMALIZATIONS:
      raise ValueError(f"Ranking: length_normalization must be one of {LENGTH_NORMALIZATIONS}, "
                       f"got {self.length_normalization!r}.")
    if self.finish_rule not in FINISH_RULES:
      raise ValueError(f"Ranking: finish_rule must be one of {FINISH_RULES}, got "
                       f"{self.finish_rule!r}.")

  def divisor(self, num_tokens: Array | int) -> Array:
    """float32: the length divisor of a hypothesis of `num_tokens` tokens (EOS included):
    ((5 + n) / 6) ** alpha ("gnmt") or n ** alpha ("fairseq"); non-decreasing in n."""
    base = self._base(num_tokens)
    alpha = self.length_penalty
    if isinstance(alpha, int | float):
      return base ** alpha
    # XLA rewrites x ** c for a constant c of 1, 2 or 3 as products; a traced alpha does the
    # same, so that its bits are those of the program with alpha as a constant.
    alpha = jnp.asarray(alpha, jnp.float32)
    return jnp.where(alpha == 1.0, base, jnp.where(alpha == 2.0, base * base, jnp.where(
        alpha == 3.0, base * base * base, base ** alpha)))

  def normalized(self, sums: Array, num_tokens: Array | int) -> Array:
    """sums [...] / divisor(num_tokens) (num_tokens a scalar), the score of hypotheses.

    With alpha a constant, XLA turns this division into sums * divisor ** -alpha (1 / base,
    1 / base ** 2 or 1 / base ** 3 for alpha 1, 2 or 3); a traced alpha computes exactly that,
    so one program serves every alpha with the bits of a program compiled for each (tested
    in tests/test_serving_programs.py).
    """
    alpha = self.length_penalty
    if isinstance(alpha, int | float):
      return sums / self.divisor(num_tokens)
    base, alpha = self._base(num_tokens), jnp.asarray(alpha, jnp.float32)
    reciprocal = jnp.where(alpha == 1.0, 1.0 / base, jnp.where(alpha == 2.0, 1.0 / (base * base),
                           jnp.where(alpha == 3.0, 1.0 / (base * base * base), base ** -alpha)))
    return sums * reciprocal

  def _base(self, num_tokens: Array | int) -> Array:
    n = jnp.asarray(num_tokens, jnp.float32)
    return (5.0 + n) / 6.0 if self.length_normalization == "gnmt" else n


def length_penalty_divisor(num_tokens: Array | int, alpha: float,
                           normalization: str = "gnmt") -> Array:
  """The length divisor of n tokens under `normalization` (`Ranking.divisor`), float32."""
  return Ranking(alpha, normalization).divisor(num_tokens)


def check_leading_dim(what: str, tree: PyTree, batch_size: int) -> None:
  """Every leaf of `tree` must be 0-d or lead with `batch_size`."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    shape = jnp.shape(leaf)
    if shape and shape[0] != batch_size:
      raise ValueError(
          f"{what}{jax.tree_util.keystr(path)} has shape {shape}; leaves must lead with "
          f"batch_size={batch_size} (or be 0-d).")


def check_step_fn(step_fn: TokensToLogits, ids: Array, state: PyTree, eos_id: int) -> None:
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


__all__ = ["FINISH_RULES", "LENGTH_NORMALIZATIONS", "ExpandState", "Ranking", "ReorderState",
           "SearchProblem", "TokensToLogits", "TokensToLogitsWithShared", "check_leading_dim",
           "check_step_fn", "length_penalty_divisor"]
