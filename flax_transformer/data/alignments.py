"""Word alignments: Moses `i-j` lines, words made of SentencePiece pieces, and the bridge between
word pairs and piece-level attention, both ways.

A word alignment is a set of pairs (i, j): source word i (0-based) is aligned to target word j,
written `i-j` separated by spaces, one sentence pair a line, as fast_align and eflomal write it
and Moses, fairseq and Marian read it. Words are the whitespace-separated words of a line.

The model works on pieces. A SentencePiece piece that starts with "▁" (U+2581) starts a word;
the others continue the word before (a lone "▁" piece starts the word of the pieces after it).
`word_of_pieces` maps pieces to words. Then:
  * decoding (`word_alignment`): each target word aligns to the source word it attends to
    most: the attention [T, S] over pieces summed over each source word's pieces and averaged
    over each target word's pieces, then the argmax per target word (EOS rows and columns out);
  * guided alignment training (`piece_alignment`): the word pairs become a piece matrix in
    which every piece of target word j is aligned to every piece of source word i, each row
    normalised to sum to 1 (Marian's and Garg et al.'s target distribution); the target EOS
    aligns to the source EOS.
`alignment_error_rate` is Och and Ney's AER.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from flax_transformer.errors import Error

WORD_START = "\u2581"  # SentencePiece's word-boundary mark.
Pairs = list[tuple[int, int]]


class AlignmentError(Error, ValueError):
  """A malformed alignment line, or one that names a word outside its sentence."""


def parse_alignment(line: str, num_source_words: int | None = None,
                    num_target_words: int | None = None, *, where: str = "") -> Pairs:
  """The pairs of a Moses line 'i-j i-j ...' (an empty line: none), sorted.

  Raises:
    AlignmentError: one line naming `where` (e.g. 'data/train.align line 7'), the bad pair,
      and the sentence's word counts when a pair falls outside them.
  """
  pairs = set()
  prefix = f"{where}: " if where else ""
  for item in line.split():
    source, dash, target = item.partition("-")
    if not dash or not source.isdigit() or not target.isdigit():
      raise AlignmentError(f"{prefix}{item!r} is not an alignment pair 'i-j' (0-based source "
                           "word i, target word j).")
    i, j = int(source), int(target)
    if num_source_words is not None and i >= num_source_words:
      raise AlignmentError(f"{prefix}pair {item} names source word {i}, but the source has "
                           f"{num_source_words} words (0 .. {num_source_words - 1}).")
    if num_target_words is not None and j >= num_target_words:
      raise AlignmentError(f"{prefix}pair {item} names target word {j}, but the target has "
                           f"{num_target_words} words (0 .. {num_target_words - 1}).")
    pairs.add((i, j))
  return sorted(pairs)


def format_alignment(pairs: Iterable[tuple[int, int]]) -> str:
  """Pairs as a Moses line 'i-j i-j ...' (no newline), in the order given."""
  return " ".join(f"{i}-{j}" for i, j in pairs)


def word_of_pieces(pieces: Sequence[str]) -> np.ndarray:
  """int [P]: the 0-based word of each piece (pieces starting with "▁" start a word)."""
  words = np.zeros(len(pieces), np.int64)
  word = -1
  for p, piece in enumerate(pieces):
    if word < 0 or piece.startswith(WORD_START):
      word += 1
    words[p] = word
  return words


def word_alignment(attention: np.ndarray, source_words: np.ndarray, target_words: np.ndarray,
                   num_source_words: int | None = None,
                   num_target_words: int | None = None) -> Pairs:
  """Each target word's most attended source word, as pairs sorted by target word.

  Args:
    attention: float [T', S'] over pieces (row t: the attention of the step that emitted target
      piece t); rows and columns beyond the pieces given (EOS, padding) are ignored.
    source_words, target_words: int [S], [T]: the word of each source and target piece
      (`word_of_pieces`), S <= S', T <= T'.
    num_source_words, num_target_words: the lines' whitespace word counts; word indices from the
      pieces are clipped to them (a normalisation that merged or split words never gives an
      index outside the line).
  """
  if not len(source_words) or not len(target_words):
    return []
  ns = int(source_words.max()) + 1 if num_source_words is None else num_source_words
  nt = int(target_words.max()) + 1 if num_target_words is None else num_target_words
  if ns < 1 or nt < 1:
    return []
  source_words = np.minimum(source_words, ns - 1)
  target_words = np.minimum(target_words, nt - 1)
  pieces = np.asarray(attention, np.float64)[:len(target_words), :len(source_words)]
  by_source = np.zeros((len(target_words), ns))  # [T, source words]: mass per source word
  np.add.at(by_source.T, source_words, pieces.T)
  by_word = np.zeros((nt, ns))  # [target words, source words]: summed over target pieces
  np.add.at(by_word, target_words, by_source)
  present = np.zeros(nt, bool)
  present[target_words] = True
  return [(int(np.argmax(by_word[j])), j) for j in range(nt) if present[j]]


def piece_alignment(pairs: Iterable[tuple[int, int]], source_words: np.ndarray,
                    target_words: np.ndarray, source_length: int, target_length: int
                    ) -> np.ndarray:
  """float32 [T, S]: the piece-level target distribution of guided alignment training.

  Pieces of target word j are aligned to every piece of each source word i with (i, j) in
  `pairs`; the target EOS (piece len(target_words)) to the source EOS (piece
  len(source_words)); each aligned row sums to 1, unaligned rows are 0 (no loss).

  Args:
    source_words, target_words: int [S'], [T']: the word of each piece, without EOS.
    source_length, target_length: S, T >= S' + 1, T' + 1: the matrix size (padded positions 0).
  """
  matrix = np.zeros((target_length, source_length), np.float32)
  source_pieces: dict[int, np.ndarray] = {}
  for word in np.unique(source_words):
    source_pieces[int(word)] = np.flatnonzero(source_words == word)
  for i, j in pairs:
    rows = np.flatnonzero(target_words == j)
    columns = source_pieces.get(i)
    if columns is not None and len(rows):
      matrix[np.ix_(rows, columns)] = 1.0
  if len(source_words) < source_length and len(target_words) < target_length:
    matrix[len(target_words), len(source_words)] = 1.0  # EOS -> EOS
  sums = matrix.sum(axis=1, keepdims=True)
  return np.divide(matrix, sums, out=np.zeros_like(matrix), where=sums > 0)


def alignment_error_rate(predicted: Iterable[Iterable[tuple[int, int]]],
                         sure: Iterable[Iterable[tuple[int, int]]],
                         possible: Iterable[Iterable[tuple[int, int]]] | None = None) -> float:
  """Och and Ney's AER over a corpus: 1 - (|A & S| + |A & P|) / (|A| + |S|), with P the possible
  pairs (a superset of the sure ones S; default P = S)."""
  sure = [set(s) for s in sure]
  possible = sure if possible is None else [set(p) | s for p, s in zip(possible, sure,
                                                                        strict=True)]
  predicted = [set(a) for a in predicted]
  if not len(predicted) == len(sure):
    raise ValueError(f"{len(predicted)} predicted alignments but {len(sure)} references.")
  a_and_s = sum(len(a & s) for a, s in zip(predicted, sure, strict=True))
  a_and_p = sum(len(a & p) for a, p in zip(predicted, possible, strict=True))
  total = sum(len(a) for a in predicted) + sum(len(s) for s in sure)
  return 1.0 - (a_and_s + a_and_p) / total if total else 0.0
