"""Lexical constraints and forbidden phrases for the searches, as data of static shape.

Phrases are int32 arrays [B, C, P]: sentence b's phrase c is the nonzero prefix of row [b, c]
(its target pieces, zeros after them); a row of zeros is no phrase. A sentence with fewer
phrases than C, or none, pads with zero rows, so sentences with any mix of phrase counts and
lengths share one program. `beam_search` reads two kinds:

Constraints: phrases every hypothesis must contain (vectorized dynamic beam allocation)
  A hypothesis h (its tokens so far, a target prefix's included) meets phrase c once its last
  n_c tokens equal the phrase; met phrases stay met. Unordered (the default), any phrase may be
  met at any time; ordered, phrase c may be met only after phrases 0 .. c-1 are (at an earlier
  step: the ends of their occurrences strictly increase; occurrences may overlap). Its
  progress on an unmet phrase that may be met (every unmet one; ordered: the first unmet one)
  is the longest m < n_c such that h ends with the phrase's first m pieces. Its bank is the
  number of constraint pieces it has: the lengths of its met phrases plus its largest
  progress.

  Every step, each sentence's candidates are the extensions (beam, token) of its alive beams:
    (a) the K best over all its beams and tokens except EOS (Post & Vilar's k-best);
    (b) for each beam and each phrase it may still meet, the phrase's next piece after its
        progress and the phrase's first piece;
    (c) each beam's best token except EOS;
    (d) each beam's EOS, only where every phrase is met (or the length cap forces EOS).
  Each candidate is counted once. Candidates fall into banks by the bank of the hypothesis
  they make; within a bank they rank by score. The step then takes them in rounds (Hu et al.'s
  vectorized DBA, fairseq's `LexicallyConstrainedBeamSearch`): the best of the highest bank,
  the best of the next bank, ..., the best of bank 0, then the second best of each bank from
  the highest, and so on (`bank_order`), so hypotheses that make progress are not crowded
  out, and a bank without enough candidates leaves its places to the others. EOS candidates
  among the first K so taken finish their hypotheses; the first K others stay alive. Without
  phrases there is one bank and this is the plain "top_k" rule, so a sentence without
  constraints searches as it would alone.

Forbidden phrases: phrases no hypothesis may contain (CTranslate2's `suppress_sequences`)
  Where a hypothesis ends with the first n - 1 pieces of a forbidden phrase of n pieces, its
  last piece gets log-probability -inf at that step (every search: beam, greedy, sampling).
  A target prefix is taken as given.

Phrases match pieces, not words: a phrase is tokenized as it would appear inside a sentence,
and another form of it (inflected, capitalized at the sentence start, tokenized otherwise)
does not match.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import PAD_ID

Array = jax.Array
NEVER = int(jnp.iinfo(jnp.int32).max)  # The order key of a candidate that does not exist.


def tail(sequences: Array, step: Array, width: int) -> Array:
  """int32 [..., width]: the tokens at positions step - width .. step - 1 of sequences [..., L]
  (0 before position 0)."""
  if width == 0:
    return jnp.zeros((*sequences.shape[:-1], 0), sequences.dtype)
  padded = jnp.concatenate(
      [jnp.zeros((*sequences.shape[:-1], width), sequences.dtype), sequences], axis=-1)
  return lax.dynamic_slice_in_dim(padded, step, width, axis=-1)


def phrase_lengths(phrases: Array) -> Array:
  """int32 [..., C]: the pieces of each phrase [..., C, P] (0: no phrase)."""
  return jnp.sum(phrases != PAD_ID, axis=-1, dtype=jnp.int32)


def match_lengths(window: Array, phrases: Array) -> Array:
  """bool [..., C, P]: entry [..., c, m - 1] says whether the window [..., W] (the most recent
  token last) ends with the first m pieces of phrase c of phrases [..., C, P] (m = 1 .. P; False
  where m exceeds W or the phrase's length). The leading dims broadcast."""
  width, pieces = window.shape[-1], phrases.shape[-1]
  lengths = phrase_lengths(phrases)  # [..., C]
  if width == 0:
    leading = jnp.broadcast_shapes(window.shape[:-1], phrases.shape[:-2])
    return jnp.zeros((*leading, phrases.shape[-2], pieces), bool)
  m = jnp.arange(1, pieces + 1)[:, None]  # [P, 1]
  j = jnp.arange(pieces)[None, :]  # [1, P]
  # [P(m), P(j)]: the window index of piece j when the last m tokens match (clipped for m > W).
  position = jnp.clip(width - m + j, 0, width - 1)
  tokens = jnp.take(window, position, axis=-1)  # [..., P(m), P(j)]
  equal = tokens[..., None, :, :] == phrases[..., :, None, :]  # [..., C, P(m), P(j)]
  matched = jnp.all(jnp.where(j < m, equal, True), axis=-1)  # [..., C, P]
  return matched & (m[:, 0] <= jnp.minimum(lengths[..., None], width))


def ban_forbidden(logits: Array, history: Array, forbid: Array) -> Array:
  """logits float32 [R, V] with -inf at the last piece of every forbidden phrase whose other
  pieces end the row's history. history int32 [R, P - 1] (`tail`), forbid int32 [R, F, P]."""
  lengths = phrase_lengths(forbid)  # [R, F]
  matched = match_lengths(history, forbid)  # [R, F, P]
  before_last = jnp.take_along_axis(matched, jnp.clip(lengths - 2, 0)[..., None], axis=-1)[..., 0]
  banned = (lengths == 1) | ((lengths >= 2) & before_last)  # [R, F]
  last = jnp.take_along_axis(forbid, jnp.clip(lengths - 1, 0)[..., None], axis=-1)[..., 0]
  rows = jnp.broadcast_to(jnp.arange(logits.shape[0])[:, None], last.shape)
  return logits.at[rows, last].add(jnp.where(banned, -jnp.inf, 0.0))


def first_unmet(met: Array, lengths: Array) -> Array:
  """bool [..., C]: the first phrase (in the given order) that exists and is not met."""
  unmet = ~met & (lengths > 0)
  return unmet & (jnp.cumsum(unmet, axis=-1) == 1)


def may_meet(met: Array, lengths: Array, ordered: bool) -> Array:
  """bool [..., C]: the phrases a hypothesis may meet next: every unmet one, or ordered, the
  first unmet one."""
  return first_unmet(met, lengths) if ordered else ~met & (lengths > 0)


def progress(matched: Array, lengths: Array) -> Array:
  """int32 [..., C]: the longest m < n_c whose first m pieces end the window (`match_lengths`
  [..., C, P]), 0 if none."""
  m = jnp.arange(1, matched.shape[-1] + 1)
  return jnp.max(jnp.where(matched & (m < lengths[..., None]), m, 0), axis=-1)


def advancing_tokens(window: Array, phrases: Array, met: Array, ordered: bool
                     ) -> tuple[Array, Array]:
  """Candidate source (b): for every hypothesis and every phrase it may still meet, the piece
  after its progress and the phrase's first piece.

  Args:
    window: int32 [B, K, P], each hypothesis's last P tokens. phrases: int32 [B, C, P].
    met: bool [B, K, C].
  Returns:
    (tokens int32 [B, K, 2C], which exist bool [B, K, 2C]); a token repeated within a
    hypothesis's list exists once (its first time).
  """
  lengths = phrase_lengths(phrases)[:, None]  # [B, 1, C]
  now = progress(match_lengths(window, phrases[:, None]), lengths)  # [B, K, C]
  following = jnp.take_along_axis(
      jnp.broadcast_to(phrases[:, None], (*met.shape, phrases.shape[-1])), now[..., None],
      axis=-1)[..., 0]  # [B, K, C]
  first = jnp.broadcast_to(phrases[:, None, :, 0], met.shape)  # [B, K, C]
  tokens = jnp.concatenate([following, first], axis=-1)  # [B, K, 2C]
  exists = jnp.tile(may_meet(met, lengths, ordered), 2)
  return tokens, exists & ~_repeated(tokens, exists)


def _repeated(tokens: Array, exists: Array) -> Array:
  """bool [..., N]: entries whose token an earlier existing entry of the same row holds."""
  n = tokens.shape[-1]
  same = (tokens[..., :, None] == tokens[..., None, :]) & exists[..., None, :]  # [..., N, N]
  return jnp.any(same & (jnp.arange(n)[None, :] < jnp.arange(n)[:, None]), axis=-1)


def advance(window: Array, phrases: Array, met: Array, ordered: bool) -> tuple[Array, Array]:
  """The constraint state of the hypotheses that candidates make.

  Args:
    window: int32 [B, N, P], each candidate hypothesis's last P tokens (its new token last).
    phrases: int32 [B, C, P]. met: bool [B, N, C], the parent hypothesis's met phrases.
  Returns:
    (met bool [B, N, C], bank int32 [B, N]) of the new hypotheses (module docstring).
  """
  lengths = phrase_lengths(phrases)[:, None]  # [B, 1, C]
  matched = match_lengths(window, phrases[:, None])  # [B, N, C, P]
  complete = jnp.take_along_axis(matched, jnp.clip(lengths - 1, 0)[..., None],
                                 axis=-1)[..., 0] & (lengths > 0)  # [B, N, C]
  met = met | (complete & may_meet(met, lengths, ordered))
  pieces_met = jnp.sum(jnp.where(met, lengths, 0), axis=-1)
  partial = jnp.where(may_meet(met, lengths, ordered), progress(matched, lengths), 0)
  return met, pieces_met + jnp.max(partial, axis=-1, initial=0)


def all_met(met: Array, phrases: Array) -> Array:
  """bool [B, K]: every phrase [B, C, P] of the hypothesis's sentence is met (met [B, K, C])."""
  return jnp.all(met | (phrase_lengths(phrases)[:, None] == 0), axis=-1)


def num_banks(phrases: Array) -> int:
  """How many banks there can be: C * P + 1 (static)."""
  return phrases.shape[-2] * phrases.shape[-1] + 1


def bank_order(scores: Array, banks: Array, banks_count: int) -> Array:
  """int32 [B, N]: each candidate's place in DBA's rounds (smaller first; `NEVER` for a
  candidate scored -inf): rank r within its bank (by score, ties by position) and bank b give
  r * banks_count + (banks_count - 1 - b), so round r takes the r-th best of every bank, the
  highest bank first.

  Args:
    scores: float32 [B, N]. banks: int32 [B, N], each in [0, banks_count).
  """
  n = scores.shape[-1]
  exists = scores > -jnp.inf
  ahead = ((scores[:, None, :] > scores[:, :, None])
           | ((scores[:, None, :] == scores[:, :, None])
              & (jnp.arange(n)[None, :] < jnp.arange(n)[:, None])))  # [B, N(i), N(j)]: j before i
  same_bank = banks[:, None, :] == banks[:, :, None]
  rank = jnp.sum(ahead & same_bank & exists[:, None, :], axis=-1, dtype=jnp.int32)
  return jnp.where(exists, rank * banks_count + (banks_count - 1 - banks), NEVER)


def satisfied(tokens: Sequence[int], phrases: Sequence[Sequence[int]], ordered: bool) -> bool:
  """Whether an output's tokens (EOS and padding may follow) meet every phrase, as the module
  docstring defines it. On the host, for marking the outputs the length cap cut short."""
  tokens = list(tokens)
  end = 0  # Ordered: the next phrase's occurrence must end after this position.
  for phrase in (list(p) for p in phrases if len(p)):
    ends = [i + len(phrase) for i in range(len(tokens) - len(phrase) + 1)
            if tokens[i:i + len(phrase)] == phrase and (not ordered or i + len(phrase) > end)]
    if not ends:
      return False
    end = ends[0]
  return True


__all__ = ["NEVER", "advance", "advancing_tokens", "all_met", "ban_forbidden", "bank_order",
           "first_unmet", "match_lengths", "may_meet", "num_banks", "phrase_lengths",
           "progress", "satisfied", "tail"]
