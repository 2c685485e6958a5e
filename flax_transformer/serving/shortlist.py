"""Vocabulary shortlists: the target ids a search may write, read from a text file in the target
language (`TranslateConfig.vocab_shortlist`, the CLI's --vocab_shortlist).

A many-language model's vocabulary is large (NLLB-200: 256,206 pieces) and one language writes
a small part of it; the output projection [B*K, D] x [D, V] and the log-softmax over V are a
third of a CPU beam step there (docs/performance.md). A shortlist S restricts the search to
the ids of S: the decode step computes logits for S alone (`decoding.bridge`, "Vocabulary
shortlists"), and the search is exactly the full one with every logit outside S set to -inf
(its log-softmax then normalizes over S), as CTranslate2's `use_vmap` is. S is:

  the pieces the tokenizer makes of the file's lines (the target side's tokenization)
  + every id up to EOS and the decoder's start id (padding 0, EOS 1) and <unk> 2
  + a many-language vocabulary's special tokens, every language token included (so any
    --target_lang's forced token is in S, and S does not depend on the call)

sorted ascending (`kept_ids`), then padded to a multiple of `MULTIPLE` by repeating its last
id (`padded`; a repeat is padding, -inf in the search), so that shortlists of similar sizes
share one compiled program.

A target prefix or a constraint with a piece outside S is refused in one line (`check_kept`)
rather than added to S: S is one array for the whole batch, so adding one sentence's pieces
would change the other sentences' translations (and the HTTP server's answer to one request
would depend on what it was batched with). A forbidden phrase with a piece outside S can never
be written, so it is dropped (`drop_unreachable`): the search is the same with or without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from flax_transformer import files
from flax_transformer.data.tokenizer import EOS_ID, UNK_ID, TextTokenizer
from flax_transformer.errors import InputError, MissingFileError
from flax_transformer.serving.phrases import PhraseIds

MULTIPLE = 128  # Padded sizes: few distinct programs, and whole SIMD/matmul tiles.
_LINES_PER_BATCH = 1024  # Lines tokenized per call.


def special_ids(tokenizer: TextTokenizer, decoder_start_id: int) -> list[int]:
  """The ids every shortlist keeps: 0 .. max(EOS, <unk>, the decoder's start id), and a
  many-language vocabulary's special and language tokens."""
  ids = list(range(max(EOS_ID, UNK_ID, decoder_start_id) + 1))
  for piece in getattr(tokenizer, "special", ()):  # data.multilingual_tokenizer
    ids.append(int(tokenizer.our_ids[tokenizer.vocab[piece]]))
  return ids


def kept_ids(path: str, tokenizer: TextTokenizer, decoder_start_id: int) -> np.ndarray:
  """int32 [n]: the ids of the shortlist file `path` (module docstring), ascending, each once.

  Raises:
    MissingFileError: no such file. InputError: an empty file, or one without a piece of the
      vocabulary beyond the special ids (each one line naming the file).
  """
  where = f"vocab_shortlist {path}"
  if not files.to_path(path).is_file():
    raise MissingFileError(f"{where}: no such file (give a text file in the target language: "
                           "its pieces are the search's output vocabulary).")
  found: set[int] = set()
  lines = 0
  for batch in _batches(files.iter_lines(path)):
    lines += len(batch)
    for ids in tokenizer.tokenize_target_batch(batch):
      found.update(ids)
  specials = special_ids(tokenizer, decoder_start_id)
  if not lines:
    raise InputError(f"{where}: the file has no text (give text in the target language: its "
                     "pieces are the search's output vocabulary).")
  if not found - set(specials):
    raise InputError(f"{where}: its text makes no piece of this vocabulary (only characters "
                     "it cannot spell); give text in the target language.")
  return np.unique(np.asarray([*found, *specials], np.int32))


def _batches(lines: Iterator[str]) -> Iterator[list[str]]:
  """The non-blank lines, `_LINES_PER_BATCH` at a time."""
  batch: list[str] = []
  for line in lines:
    if line.strip():
      batch.append(line)
    if len(batch) == _LINES_PER_BATCH:
      yield batch
      batch = []
  if batch:
    yield batch


def padded(kept: np.ndarray, multiple: int = MULTIPLE) -> np.ndarray:
  """int32 [V']: `kept` (ascending) with its last id repeated up to a multiple of `multiple`
  (a repeat is padding: `model.transformer.OutputShortlist`)."""
  size = -(-len(kept) // multiple) * multiple
  return np.concatenate([kept, np.full(size - len(kept), kept[-1], np.int32)]).astype(np.int32)


def check_kept(kind: str, ids: Sequence[Sequence[int]], kept: np.ndarray,
               tokenizer: TextTokenizer, path: str, first_line: int = 1) -> None:
  """One `InputError` line naming the line, the piece and the file where a sentence's `ids`
  (its target prefix, or its constraints' pieces, flattened) have a piece outside `kept`."""
  for i, row in enumerate(ids):
    missing = np.setdiff1d(np.asarray(row, np.int32), kept)
    if missing.size:
      raise InputError(
          f"line {first_line + i}: the piece {tokenizer.id_to_piece(int(missing[0]))!r} of its "
          f"{kind} is not in the vocabulary shortlist {path}, so no translation could write "
          "it: add text that holds it to that file.")


def drop_unreachable(forbid: PhraseIds | None, kept: np.ndarray) -> PhraseIds | None:
  """`forbid` without the phrases that have a piece outside `kept` (no search over the
  shortlist can write them), its padded sizes kept."""
  if forbid is None:
    return None
  reachable = [[phrase for phrase in row if np.isin(phrase, kept).all()] for row in forbid.ids]
  return PhraseIds(reachable, forbid.count, forbid.pieces)


__all__ = ["MULTIPLE", "check_kept", "drop_unreachable", "kept_ids", "padded", "special_ids"]
