"""Terminology constraints and forbidden phrases for the searches, as data of static shape.

Phrases are int32 arrays [B, C, P]: sentence b's phrase c is the nonzero prefix of row [b, c]
(its target pieces, zeros after them); a row of zeros is no phrase. A sentence with fewer
phrases than C, or none, pads with zero rows, so sentences with any mix of phrase counts and
lengths share one program.

Whole words
  `word_continues` (bool [V]) marks the pieces that continue the word before them (a
  SentencePiece piece without the leading "▁" that starts with a letter, digit or mark). A
  hypothesis holds phrase c where its pieces occur and the token after the last piece does not
  continue the word (any other piece, EOS, or the end of the output): "nunas" is not held by
  "nunasek". The first piece of a phrase starts a word (the serving layer refuses a phrase
  that does not), so an occurrence never starts inside a word. Without `word_continues` every
  piece starts a word and phrases match as pieces.

Constraints: phrases every hypothesis must contain (vectorized dynamic beam allocation)
  A hypothesis meets phrase c at the token after an occurrence of the phrase when that token
  does not continue the word (the occurrence is then "pending" for one step; EOS, or the end
  of the output, completes it); met phrases stay met. Unordered (the default), any phrase may
  be met at any time; ordered, phrase c may be met only after phrases 0 .. c-1 are (at an
  earlier step). Its progress on an unmet phrase that may be met (every unmet one; ordered:
  the first unmet one) is the longest m <= n_c such that the hypothesis ends with the phrase's
  first m pieces (m = n_c: pending). Its bank is the number of constraint pieces it has: the
  lengths of its met phrases plus its largest progress.

  Every step, each sentence's candidates are the extensions (beam, token) of its alive beams:
    (a) the K best over all its beams and tokens except EOS (Post & Vilar's k-best);
    (b) for each beam and each phrase it may still meet, the phrase's next piece after its
        progress (with the phrase pending: the beam's best token that starts a word) and the
        phrase's first piece;
    (c) each beam's best token except EOS;
    (d) each beam's EOS, only where it meets every phrase (or the length cap forces EOS).
  Each candidate is counted once, and none starts a phrase inside a word (below). Candidates
  fall into banks by the bank of the hypothesis they make; within a bank they rank by score.
  The step then takes them in rounds (Hu et al.'s vectorized DBA, fairseq's
  `LexicallyConstrainedBeamSearch`): the best of the highest bank, then the best of every
  other bank by score, then the second best of each bank in the same way, and so on
  (`bank_order`): the hypothesis that made the most progress is not crowded out, and with more
  banks than beams the natural translation keeps its beam. EOS candidates among the first K so
  taken finish their hypotheses; the first K others stay alive. `decoding.constrained_beam` says
  when the search stops and how its answer relates to plain beam search's.

A phrase starts where a word may end
  SentencePiece marks where a word starts, never where it ends: "▁misere" is a word's start,
  and whether it is the whole word depends on the next piece ("t" makes "miseret"). A phrase's
  first piece always starts a word, so without a rule DBA would place it after any piece, and
  the bank it gains would keep the hypothesis: "misere le lamuk miseret" for the term "le",
  "miseret" cut to make space. So a candidate that starts a phrase (the new token is a phrase's
  first piece and advances no phrase further) is dropped where its beam's word goes on: where
  the model's best next token, EOS included, continues the word (`word_goes_on`). Exempt are a
  beam with a phrase pending (its word ends there anyway) and a beam that cannot wait: the
  pieces of its unmet phrases fill every position left before the length cap (a model that
  never ends a word still meets its phrases where they fit, at the end). The beam's best token
  is never dropped (it does not continue the word, or the beam's word goes on and it is no
  phrase start), nor a phrase's later pieces (they advance it).

Forbidden phrases: phrases no hypothesis may contain as whole words
  Where a hypothesis ends with every piece of a forbidden phrase, every token that would end
  the word there (EOS included) gets log-probability -inf, so the word must go on ("regeno" is
  forbidden, "regenos" is not). Where the next position is the last free one (the length cap
  or L comes next), the phrase's last piece is banned instead, so no hypothesis is left without
  a legal token. Without `word_continues`, the last piece is always banned (CTranslate2's
  `suppress_sequences`). A target prefix is taken as given.
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


def ban_forbidden(logits: Array, history: Array, forbid: Array, word_continues: Array | None,
                  last_free: Array, forced: Array) -> Array:
  """logits float32 [R, V] with -inf where a token would complete a forbidden phrase as a
  whole word (module docstring).

  Args:
    history: int32 [R, P], each row's last P tokens (`tail`). forbid: int32 [R, F, P].
    word_continues: bool [V] or None. last_free: bool [R], the row's next token is its last
      free one. forced: bool [R], the length cap forces EOS now (nothing is banned).
  """
  lengths = phrase_lengths(forbid)  # [R, F]
  matched = match_lengths(history, forbid)  # [R, F, P]
  at = lambda m: jnp.take_along_axis(matched, jnp.clip(m, 0)[..., None], axis=-1)[..., 0]
  before_last = (lengths == 1) | ((lengths >= 2) & at(lengths - 2))  # [R, F]
  if word_continues is not None:
    before_last &= last_free[:, None]
  last = jnp.take_along_axis(forbid, jnp.clip(lengths - 1, 0)[..., None], axis=-1)[..., 0]
  rows = jnp.broadcast_to(jnp.arange(logits.shape[0])[:, None], last.shape)
  banned = jnp.where(before_last & (lengths > 0) & ~forced[:, None], -jnp.inf, 0.0)
  logits = logits.at[rows, last].add(banned)
  if word_continues is None:
    return logits
  pending = jnp.any(at(lengths - 1) & (lengths > 0), axis=-1) & ~forced  # [R]
  return jnp.where(pending[:, None] & ~word_continues[None, :], -jnp.inf, logits)


def word_boundary(tokens: Array, word_continues: Array | None) -> Array:
  """bool [...]: whether each token ends the word before it (it does not continue it); the
  output padding ends one too."""
  if word_continues is None:
    return jnp.ones(tokens.shape, bool)
  return ~word_continues[tokens] | (tokens == PAD_ID)


def word_goes_on(logits: Array, word_continues: Array | None) -> Array:
  """bool [...]: whether the model's best next token (logits [..., V], EOS included) continues
  the hypothesis's last word: the model would not end the word there. Always False without
  `word_continues`."""
  if word_continues is None:
    return jnp.zeros(logits.shape[:-1], bool)
  return word_continues[jnp.argmax(logits, axis=-1)]


def starts_inside_word(window: Array, phrases: Array, met: Array, ordered: bool,
                       goes_on: Array, positions_left: Array) -> Array:
  """bool [B, N]: candidates that would start a phrase inside a word (module docstring, "A
  phrase starts where a word may end"): the new token starts a phrase the parent may meet and
  advances none further, after a parent whose word goes on (goes_on bool [B, N],
  `word_goes_on`), that has no phrase pending (a pending phrase ends its word anyway) and that
  can wait: more positions left (positions_left int32 [B], this one included, before the length
  cap or L) than the pieces of its unmet phrases.

  Args:
    window: int32 [B, N, P + 1], each candidate's last P + 1 tokens (its new token last).
    phrases: int32 [B, C, P]. met: bool [B, N, C], the parent's met phrases.
  """
  lengths = phrase_lengths(phrases)[:, None]  # [B, 1, C]
  may = may_meet(met, lengths, ordered)  # [B, N, C]
  after = progress(match_lengths(window[..., 1:], phrases[:, None]), lengths)  # [B, N, C]
  before = progress(match_lengths(window[..., :-1], phrases[:, None]), lengths)
  pending = jnp.any(may & (before == lengths) & (lengths > 0), axis=-1)  # [B, N]
  starts = jnp.max(jnp.where(may, after, 0), axis=-1, initial=0) == 1  # [B, N]
  needed = jnp.sum(jnp.where(met, 0, lengths), axis=-1)  # [B, N]: pieces still to place
  return starts & goes_on & ~pending & (positions_left[:, None] > needed)


def first_unmet(met: Array, lengths: Array) -> Array:
  """bool [..., C]: the first phrase (in the given order) that exists and is not met."""
  unmet = ~met & (lengths > 0)
  return unmet & (jnp.cumsum(unmet, axis=-1) == 1)


def may_meet(met: Array, lengths: Array, ordered: bool) -> Array:
  """bool [..., C]: the phrases a hypothesis may meet next: every unmet one, or ordered, the
  first unmet one."""
  return first_unmet(met, lengths) if ordered else ~met & (lengths > 0)


def progress(matched: Array, lengths: Array) -> Array:
  """int32 [..., C]: the longest m <= n_c whose first m pieces end the window (`match_lengths`
  [..., C, P]), 0 if none; m = n_c: the phrase is pending (module docstring)."""
  m = jnp.arange(1, matched.shape[-1] + 1)
  return jnp.max(jnp.where(matched & (m <= lengths[..., None]), m, 0), axis=-1)


def advancing_tokens(window: Array, phrases: Array, met: Array, ordered: bool,
                     word_start: Array) -> tuple[Array, Array]:
  """Candidate source (b): for every hypothesis and every phrase it may still meet, the piece
  after its progress (a pending phrase: `word_start`, the hypothesis's best token that starts
  a word) and the phrase's first piece.

  Args:
    window: int32 [B, K, P], each hypothesis's last P tokens. phrases: int32 [B, C, P].
    met: bool [B, K, C]. word_start: int32 [B, K].
  Returns:
    (tokens int32 [B, K, 2C], which exist bool [B, K, 2C]); a token repeated within a
    hypothesis's list exists once (its first time).
  """
  lengths = phrase_lengths(phrases)[:, None]  # [B, 1, C]
  now = progress(match_lengths(window, phrases[:, None]), lengths)  # [B, K, C]
  following = jnp.take_along_axis(
      jnp.broadcast_to(phrases[:, None], (*met.shape, phrases.shape[-1])),
      jnp.clip(now, 0, phrases.shape[-1] - 1)[..., None], axis=-1)[..., 0]  # [B, K, C]
  following = jnp.where(now == lengths, word_start[..., None], following)
  first = jnp.broadcast_to(phrases[:, None, :, 0], met.shape)  # [B, K, C]
  tokens = jnp.concatenate([following, first], axis=-1)  # [B, K, 2C]
  exists = jnp.tile(may_meet(met, lengths, ordered), 2)
  return tokens, exists & ~_repeated(tokens, exists)


def _repeated(tokens: Array, exists: Array) -> Array:
  """bool [..., N]: entries whose token an earlier existing entry of the same row holds."""
  n = tokens.shape[-1]
  same = (tokens[..., :, None] == tokens[..., None, :]) & exists[..., None, :]  # [..., N, N]
  return jnp.any(same & (jnp.arange(n)[None, :] < jnp.arange(n)[:, None]), axis=-1)


def advance(window: Array, phrases: Array, met: Array, ordered: bool,
            word_continues: Array | None) -> tuple[Array, Array]:
  """The constraint state of the hypotheses that candidates make.

  Args:
    window: int32 [B, N, P + 1], each candidate hypothesis's last P + 1 tokens (its new token
      last). phrases: int32 [B, C, P]. met: bool [B, N, C], the parent hypothesis's met phrases.
    word_continues: bool [V] or None (module docstring, "Whole words").
  Returns:
    (met bool [B, N, C], bank int32 [B, N]) of the new hypotheses (module docstring).
  """
  lengths = phrase_lengths(phrases)[:, None]  # [B, 1, C]
  before = match_lengths(window[..., :-1], phrases[:, None])  # [B, N, C, P]
  complete = jnp.take_along_axis(before, jnp.clip(lengths - 1, 0)[..., None],
                                 axis=-1)[..., 0] & (lengths > 0)  # [B, N, C]
  ends_word = word_boundary(window[..., -1], word_continues)[..., None]  # [B, N, 1]
  met = met | (complete & ends_word & may_meet(met, lengths, ordered))
  pieces_met = jnp.sum(jnp.where(met, lengths, 0), axis=-1)
  matched = match_lengths(window[..., 1:], phrases[:, None])  # [B, N, C, P]
  partial = jnp.where(may_meet(met, lengths, ordered), progress(matched, lengths), 0)
  return met, pieces_met + jnp.max(partial, axis=-1, initial=0)


def holds_every_phrase(sequences: Array, phrases: Array, ordered: bool,
                       word_continues: Array | None) -> Array:
  """bool [B, N]: whether each output sequences int32 [B, N, L] (EOS and padding may follow)
  holds every phrase [B, C, P] as whole words (in the given order when `ordered`), replaying
  `advance` token by token; the end of the output ends a word."""
  batch, count, length = sequences.shape
  width = phrases.shape[-1]
  padded = jnp.concatenate([jnp.zeros((batch, count, width), jnp.int32), sequences,
                            jnp.zeros((batch, count, 1), jnp.int32)], axis=-1)

  def replay(t: Array, met: Array) -> Array:  # Token t of the output has just been emitted.
    window = lax.dynamic_slice_in_dim(padded, t, width + 1, axis=-1)  # [B, N, P + 1]
    return advance(window, phrases, met, ordered, word_continues)[0]

  # None met: [B, N, C] made from the data, so that under shard_map it varies as they do.
  none = (jnp.zeros_like(sequences[..., :1], bool)
          & jnp.zeros_like(phrases[:, None, :, 0], bool))
  met = lax.fori_loop(0, length + 1, replay, none)
  return all_met(met, phrases)


def all_met(met: Array, phrases: Array) -> Array:
  """bool [B, K]: every phrase [B, C, P] of the hypothesis's sentence is met (met [B, K, C])."""
  return jnp.all(met | (phrase_lengths(phrases)[:, None] == 0), axis=-1)


def bank_order(scores: Array, banks: Array) -> Array:
  """int32 [B, N]: each candidate's place in DBA's rounds (smaller first; `NEVER` for a
  candidate scored -inf). Round r takes the r-th best (by score, ties by position) of every
  bank: first that of the highest bank any candidate reaches, then the others by score (ties
  by position). With more banks than beams, the first round thus keeps the hypothesis that
  made the most progress and then the best ones, wherever they stand, so the natural
  translation is not pruned for hypotheses that only started a phrase.

  Args:
    scores: float32 [B, N]. banks: int32 [B, N], each >= 0.
  """
  n = scores.shape[-1]
  exists = scores > -jnp.inf
  position = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), scores.shape)
  ahead = ((scores[:, None, :] > scores[:, :, None])
           | ((scores[:, None, :] == scores[:, :, None])
              & (jnp.arange(n)[None, :] < jnp.arange(n)[:, None])))  # [B, N(i), N(j)]: j before i
  same_bank = banks[:, None, :] == banks[:, :, None]
  rank = jnp.sum(ahead & same_bank & exists[:, None, :], axis=-1, dtype=jnp.int32)
  top = jnp.max(jnp.where(exists, banks, -1), axis=-1, keepdims=True)  # [B, 1]
  rank = jnp.where(exists, rank, n)
  keys = (rank, (banks != top).astype(jnp.int32), -scores, position)
  permutation = lax.sort(keys, dimension=-1, num_keys=4)[-1]  # [B, N]: candidates in order
  order = jnp.zeros_like(position).at[
      jnp.arange(scores.shape[0])[:, None], permutation].set(position)
  return jnp.where(exists, order, NEVER)


def satisfied(tokens: Sequence[int], phrases: Sequence[Sequence[int]], ordered: bool,
              word_continues: Sequence[bool] | None = None) -> bool:
  """Whether an output's tokens (EOS and padding may follow) hold every phrase as whole words
  (module docstring), on the host: an occurrence counts where the token after it does not
  continue the word, or where the output ends; ordered, the occurrences' ends strictly
  increase."""
  tokens = list(tokens)
  ends_word = lambda i: (i == len(tokens) or tokens[i] == PAD_ID or word_continues is None
                         or not word_continues[tokens[i]])
  end = 0  # Ordered: the next phrase's occurrence must end after this position.
  for phrase in (list(p) for p in phrases if len(p)):
    ends = [i + len(phrase) for i in range(len(tokens) - len(phrase) + 1)
            if tokens[i:i + len(phrase)] == phrase and ends_word(i + len(phrase))
            and (not ordered or i + len(phrase) > end)]
    if not ends:
      return False
    if ordered:
      end = ends[0]
  return True


__all__ = ["NEVER", "advance", "advancing_tokens", "all_met", "ban_forbidden", "bank_order",
           "first_unmet", "holds_every_phrase", "match_lengths", "may_meet",
           "phrase_lengths", "progress", "satisfied", "starts_inside_word", "tail",
           "word_boundary", "word_goes_on"]
