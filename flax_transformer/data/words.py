"""Words, as terminology constraints and forbidden phrases match them: in text, and in the
pieces of a vocabulary.

A word is a maximal run of word characters: letters, digits and combining marks (Unicode
categories L, N and M). Everything else (spaces, punctuation, a hyphen, an apostrophe) ends one,
so "Haus." and "Haus-Tür" hold the word "Haus", and "Hausboot" does not. Case matters
("Haus" is not "haus").

In SentencePiece pieces, a piece continues the word before it when it has no leading "▁" (no
space before it) and its first character is a word character: "▁nun" + "as" is one word,
"▁nun" + "." is a word and a full stop. A byte piece ("<0xC3>", SentencePiece's byte fallback
for a character the vocabulary lacks) continues the word too: after a space, a "▁" piece
starts it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from flax_transformer.conventions import EOS_ID, PAD_ID, UNK_ID

SPACE = "▁"  # SentencePiece's mark of a space before a piece.


class PieceVocabulary(Protocol):
  """What `continuation_mask` reads of a vocabulary."""

  @property
  def vocab_size(self) -> int: ...

  def id_to_piece(self, i: int) -> str: ...


def is_word_char(char: str) -> bool:
  """Whether `char` (one character) is a letter, digit or combining mark."""
  return unicodedata.category(char)[0] in "LNM"


def split_words(text: str) -> list[str]:
  """The words of `text`, in order: maximal runs of word characters."""
  words, current = [], []
  for char in text:
    if is_word_char(char):
      current.append(char)
    elif current:
      words.append("".join(current))
      current = []
  if current:
    words.append("".join(current))
  return words


def holds_words(text: str, phrases: Sequence[str], ordered: bool = False) -> bool:
  """Whether `text` holds every phrase as whole words: each phrase's words occur as
  consecutive words of the text (ordered: the occurrences end in the given order, strictly)."""
  words = split_words(text)
  end = 0
  for phrase in phrases:
    wanted = split_words(phrase)
    if not wanted:
      continue
    ends = [i + len(wanted) for i in range(len(words) - len(wanted) + 1)
            if words[i:i + len(wanted)] == wanted and (not ordered or i + len(wanted) > end)]
    if not ends:
      return False
    if ordered:
      end = ends[0]
  return True


def continues_word(piece: str) -> bool:
  """Whether a SentencePiece piece continues the word before it (module docstring)."""
  if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # A byte piece.
    return True
  return bool(piece) and not piece.startswith(SPACE) and is_word_char(piece[0])


def continuation_mask(vocabulary: PieceVocabulary) -> np.ndarray:
  """bool [V]: the pieces that continue the word before them; the special ids never do."""
  mask = np.array([continues_word(vocabulary.id_to_piece(i))
                   for i in range(vocabulary.vocab_size)], bool)
  mask[[PAD_ID, EOS_ID, UNK_ID]] = False
  return mask


__all__ = ["SPACE", "PieceVocabulary", "continuation_mask", "continues_word", "holds_words",
           "is_word_char", "split_words"]
