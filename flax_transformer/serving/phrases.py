"""Terminology constraints and forbidden phrases as users give them: lines of a file, lists of
strings, and their target pieces, checked once (here) for the `Translator` and, before anything
is restored, for the `translate` and `evaluate` commands.

A phrases file has one line per input line: the phrases of that line separated by tabs, as
fairseq's `--constraints` reads them, or a JSON list of strings (a line that starts with `[`);
an empty line means none. Each phrase is tokenized as the target side would be inside a
sentence (`TextTokenizer.tokenize_target`): SentencePiece cuts a word after a space, and at
the sentence start, the same way, so "Schutzhelm" matches there too. A phrase is met, or
forbidden, only as whole words (`data.words`, `decoding.constraints`): its first piece starts
a word, and the piece after its last one does not continue that word, so "Schutzhelm" is not
met by "Schutzhelme" nor inside the compound "Fahrradschutzhelm", and forbidding "Helm" does
not forbid "Helme". Another form of it (inflected, capitalized at the sentence start) is
another word and does not match; "Haus." and "Haus-Tür" hold the word "Haus". What a
translation reports as met is read from its text (`data.words.holds_words`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import numpy as np

from flax_transformer.config import SearchConfig
from flax_transformer.data import UNK_ID, words
from flax_transformer.errors import InputError
from flax_transformer.serving import texts

KINDS = ("constraints", "forbid")
# Padded sizes of a call's arrays: powers of two from these, at most the configured maxima.
MIN_PHRASES, MIN_PIECES = 2, 4


@dataclasses.dataclass(frozen=True)
class PhraseIds:
  """One kind of phrases of a call: ids[i] holds sentence i's phrases, each a list of target
  piece ids; `count` and `pieces` are the padded sizes [C, P] of the call's arrays."""

  ids: list[list[list[int]]]
  count: int
  pieces: int


def parse_line(line: str, where: str) -> list[str]:
  """The phrases of one file line: tab-separated, or a JSON list of strings ('[' first)."""
  line = line.rstrip("\r\n")
  if line.lstrip().startswith("["):
    try:
      phrases = json.loads(line)
    except json.JSONDecodeError as error:
      raise InputError(f"{where}: not a JSON list of strings ({error.msg}).") from None
    if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
      raise InputError(f"{where}: a JSON line must be a list of strings, got {line[:60]!r}.")
    return phrases
  return [phrase for phrase in line.split("\t") if phrase.strip()]


def padded_size(needed: int, smallest: int, largest: int) -> int:
  """The smallest power-of-two multiple of `smallest` >= `needed`, at most `largest`."""
  size = smallest
  while size < needed:
    size *= 2
  return min(size, largest)


def check_search(search: SearchConfig) -> None:
  """One `InputError` line unless `search` can meet constraints: beam search with K >= 2 and
  the "top_k" finish rule (`decoding.constrained_beam`)."""
  if search.method != "beam" or search.beam_size < 2:
    raise InputError(
        "constraints need beam search with config.search.beam_size >= 2 (dynamic beam "
        f"allocation shares the beams among them), got method {search.method!r}"
        + (f" with beam_size {search.beam_size}" if search.method == "beam" else "") + ".")
  if search.finish_rule != "top_k":
    raise InputError("constraints need config.search.finish_rule 'top_k', got "
                     f"{search.finish_rule!r}.")


def phrase_ids(kind: str, phrases: Sequence[Sequence[str]], *, tokenize: Callable[[str], list[int]],
               search: SearchConfig, output_room: Callable[[int], int | None],
               first_line: int = 1, where: str | None = None,
               word_continues: np.ndarray | None = None) -> PhraseIds | None:
  """The target pieces of `phrases` (one list of strings per sentence), checked: one
  `InputError` line naming the line, the phrase and the config key for a phrase without
  pieces, without a word (only punctuation), whose first piece does not start a word
  (`word_continues` bool [V]: it would only ever match inside another word), with characters
  the vocabulary cannot spell, too many phrases
  (config.search.max_constraints), a phrase too long (config.search.max_constraint_pieces)
  or, for constraints, longer than its sentence's output may be (`output_room(i)`: the most
  tokens before EOS of sentence i, None for a blank one).
  Messages name "{where} {first_line + i}" (default where: "{kind}, line"). None when no
  sentence has any phrase: the call searches as it would without them.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
  if kind == "constraints" and any(phrases):
    check_search(search)
  ids, where = [], where or f"{kind}, line"
  for i, row in enumerate(phrases):
    line = f"{where} {first_line + i}"
    if isinstance(row, str):
      raise InputError(f"{line}: give a list of phrases, got the string {row!r}.")
    if not isinstance(row, Sequence):
      raise InputError(f"{line}: give a list of phrases, got {type(row).__name__}.")
    if len(row) > search.max_constraints:
      raise InputError(f"{line}: {len(row)} {kind} phrases, more than "
                       f"config.search.max_constraints = {search.max_constraints}.")
    row_ids = []
    for phrase in row:
      texts.check_text(phrase, f"{line}: a phrase")
      pieces = tokenize(phrase) if phrase.strip() else []
      if not pieces:
        raise InputError(f"{line}: the phrase {phrase!r} has no target pieces.")
      if not words.split_words(phrase):
        raise InputError(f"{line}: the phrase {phrase!r} has no word (letters or digits) to "
                         "match as a whole word.")
      if word_continues is not None and word_continues[pieces[0]]:
        raise InputError(f"{line}: the phrase {phrase!r} does not start a word in the target "
                         "vocabulary (its first piece continues a word), so it could never "
                         "be met as a whole word.")
      if UNK_ID in pieces:
        raise InputError(f"{line}: the phrase {phrase!r} has characters the target vocabulary "
                         "cannot spell (they would be its unknown piece).")
      if len(pieces) > search.max_constraint_pieces:
        raise InputError(f"{line}: the phrase {phrase!r} has {len(pieces)} target pieces, "
                         f"more than config.search.max_constraint_pieces = "
                         f"{search.max_constraint_pieces}.")
      room = output_room(i) if kind == "constraints" else None
      if room is not None and len(pieces) > room:
        raise InputError(f"{line}: the constraint {phrase!r} has {len(pieces)} target pieces, "
                         f"but the line's output holds at most {room} before EOS.")
      row_ids.append(pieces)
    ids.append(row_ids)
  if not any(ids):
    return None
  return PhraseIds(ids, padded_size(max(map(len, ids)), MIN_PHRASES, search.max_constraints),
                   padded_size(max(len(p) for row in ids for p in row), MIN_PIECES,
                               search.max_constraint_pieces))


def check_conflicts(constraints: PhraseIds | None, forbid: PhraseIds | None,
                    texts: tuple[Sequence[Sequence[str]], Sequence[Sequence[str]]],
                    first_line: int = 1, where: str = "line",
                    word_continues: np.ndarray | None = None) -> None:
  """One `InputError` line where a constraint holds a forbidden phrase as whole words (no
  output could have both; `word_continues` bool [V], None: as pieces). `texts`: the
  (constraints, forbid) strings, for the message."""
  if constraints is None or forbid is None:
    return
  starts = lambda pieces, j: word_continues is None or not word_continues[pieces[j]]
  for i, (wanted, banned) in enumerate(zip(constraints.ids, forbid.ids, strict=True)):
    for c, pieces in enumerate(wanted):
      for f, phrase in enumerate(banned):
        end = lambda j: j + len(phrase)  # noqa: B023 (used at once)
        if any(pieces[j:end(j)] == phrase and starts(pieces, j)
               and (end(j) == len(pieces) or starts(pieces, end(j)))
               for j in range(len(pieces) - len(phrase) + 1)):
          raise InputError(f"{where} {first_line + i}: the constraint {texts[0][i][c]!r} holds "
                           f"the forbidden phrase {texts[1][i][f]!r}.")


__all__ = ["KINDS", "PhraseIds", "check_conflicts", "check_search", "padded_size", "parse_line",
           "phrase_ids"]
