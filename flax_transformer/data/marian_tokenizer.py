"""The vocabulary of a Hugging Face Marian (OPUS-MT) model, in this package's ids.

A Marian model folder holds two SentencePiece models and one joint vocabulary:

  source.spm   segments source text into pieces
  target.spm   segments target text into pieces, and joins target pieces back into text
  vocab.json   {piece: Marian id}, one id space for the pieces of both sides; Marian's ids put
               EOS "</s>" at 0, "<unk>" at 1 and padding "<pad>" (the decoder's start) last

The SentencePiece models' own ids are never used: text becomes pieces through the side's
SentencePiece model, and pieces become ids through vocab.json (a piece that vocab.json lacks is
"<unk>"), exactly as Hugging Face's `MarianTokenizer` does. Marian ids then become ours by one
fixed permutation, so that the package's special ids hold (padding and decoder start 0, EOS 1,
unk 2, see `tokenizer.py`):

  our id 0, 1, 2         = Marian's "<pad>", "</s>", "<unk>"
  our ids 3, 4, ...      = the other Marian ids in increasing order

`marian_ids[i]` is the Marian id of our id i, and `our_ids` its inverse. The importer permutes the
rows of the embedding tables (and the entries of the logits bias) the same way, so the model
computes the same function over the same pieces; the exporter inverts it.

Text handling follows `MarianTokenizer` (transformers 5): a leading language code such as
">>deu<<" (a piece of multilingual models' vocab.json) is split off before SentencePiece and kept
as its own token; `detokenize` stops at EOS, drops padding and "<unk>" (its
`skip_special_tokens=True`), joins the pieces with target.spm, turns any "▁" left (pieces that
target.spm does not know) into spaces and strips the ends. One difference: the literal strings
"<pad>", "</s>" and "<unk>" in the input are text here, while Hugging Face maps them to the
special ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import sentencepiece as spm

from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from flax_transformer.errors import InputError, MissingFileError
from flax_transformer.files import atomic_write, to_path

SOURCE_MODEL_FILE = "source.spm"
TARGET_MODEL_FILE = "target.spm"
VOCAB_JSON_FILE = "vocab.json"
FILES = (SOURCE_MODEL_FILE, TARGET_MODEL_FILE, VOCAB_JSON_FILE)
PAD_PIECE, EOS_PIECE, UNK_PIECE = "<pad>", "</s>", "<unk>"
_WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁".


def marian_order(vocab: Mapping[str, int]) -> np.ndarray:
  """int64 [V]: the Marian id of each of our ids (pad, eos, unk, then the rest in order).

  Raises:
    ValueError: when vocab.json's ids are not exactly 0..V-1 or a special piece is missing.
  """
  ids = sorted(vocab.values())
  if ids != list(range(len(ids))):
    raise InputError(f"{VOCAB_JSON_FILE}: the ids must be 0..{len(vocab) - 1}, each once.")
  missing = [p for p in (PAD_PIECE, EOS_PIECE, UNK_PIECE) if p not in vocab]
  if missing:
    raise InputError(f"{VOCAB_JSON_FILE} has no {', '.join(missing)} piece.")
  special = [vocab[PAD_PIECE], vocab[EOS_PIECE], vocab[UNK_PIECE]]
  rest = [i for i in range(len(vocab)) if i not in special]
  return np.asarray([*special, *rest], np.int64)  # Our PAD_ID, EOS_ID, UNK_ID come first.


class MarianTokenizer:
  """source.spm + target.spm + vocab.json with this package's ids (module docstring).

  Args:
    source_model, target_model: the serialized SentencePiece models.
    vocab: vocab.json, {piece: Marian id}.
    path: the folder they came from (for messages).
  """

  def __init__(self, source_model: bytes, target_model: bytes, vocab: Mapping[str, int],
               path: str = ""):
    self.path = path
    self._protos = (source_model, target_model)
    self._source = spm.SentencePieceProcessor(model_proto=source_model)
    self._target = spm.SentencePieceProcessor(model_proto=target_model)
    self.vocab = dict(vocab)
    self.marian_ids = marian_order(self.vocab)  # [V]: Marian id of our id i.
    self.our_ids = np.argsort(self.marian_ids)  # [V]: our id of Marian id j.
    pieces = {marian_id: piece for piece, marian_id in self.vocab.items()}
    self._pieces = [pieces[int(j)] for j in self.marian_ids]  # Our id -> piece.
    self._ids = {piece: i for i, piece in enumerate(self._pieces)}  # Piece -> our id.
    self._skipped = {PAD_ID, UNK_ID}

  @classmethod
  def load(cls, directory: str | os.PathLike) -> MarianTokenizer:
    """Reads source.spm, target.spm and vocab.json from `directory`."""
    directory = to_path(directory)
    missing = [name for name in FILES if not (directory / name).is_file()]
    if missing:
      raise MissingFileError(f"{directory} lacks the Marian vocabulary file(s) "
                              f"{', '.join(missing)}.")
    return cls.from_files({name: (directory / name).read_bytes() for name in FILES}, directory)

  @classmethod
  def from_files(cls, contents: Mapping[str, bytes],
                 directory: str | os.PathLike) -> MarianTokenizer:
    """The tokenizer of the bytes of source.spm, target.spm and vocab.json (`FILES`), read from
    `directory` (named in errors)."""
    directory = to_path(directory)
    try:
      vocab = json.loads(contents[VOCAB_JSON_FILE].decode("utf-8"))
    except ValueError as error:
      raise InputError(f"{directory / VOCAB_JSON_FILE}: not valid JSON ({error}).") from None
    return cls(contents[SOURCE_MODEL_FILE], contents[TARGET_MODEL_FILE], vocab, str(directory))

  def write(self, directory: str | os.PathLike) -> None:
    """Writes source.spm, target.spm and vocab.json (Marian's ids) into `directory`."""

    directory = to_path(directory)
    atomic_write(directory / SOURCE_MODEL_FILE, self._protos[0])
    atomic_write(directory / TARGET_MODEL_FILE, self._protos[1])
    atomic_write(directory / VOCAB_JSON_FILE,
                 json.dumps(self.vocab, ensure_ascii=False, indent=2) + "\n")

  @property
  def vocab_size(self) -> int:
    """V, the number of ids (vocab.json's entries)."""
    return len(self._pieces)

  @property
  def source_model(self) -> bytes:
    """The serialized source.spm."""
    return self._protos[0]

  @property
  def target_model(self) -> bytes:
    """The serialized target.spm."""
    return self._protos[1]

  def tokenize(self, text: str) -> list[int]:
    """Our ids of a source sentence, without EOS."""
    return self._encode(self._source, [text])[0]

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Our ids of each source sentence, without EOS."""
    return self._encode(self._source, texts)

  def tokenize_target(self, text: str) -> list[int]:
    """Our ids of a target sentence (segmented by target.spm), without EOS."""
    return self._encode(self._target, [text])[0]

  def tokenize_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Our ids of each target sentence, without EOS."""
    return self._encode(self._target, texts)

  def _encode(self, processor: spm.SentencePieceProcessor,
              texts: Sequence[str]) -> list[list[int]]:
    split = [_split_language_code(text) for text in texts]
    pieces = processor.encode([rest for _, rest in split], out_type=str) if split else []
    return [[self._ids.get(piece, UNK_ID) for piece in [*code, *row]]
            for (code, _), row in zip(split, pieces, strict=True)]

  def detokenize(self, ids: Iterable[int]) -> str:
    """Target text of `ids` up to the first EOS, without padding and "<unk>" (as Hugging Face's
    `decode(..., skip_special_tokens=True)`)."""
    pieces = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i not in self._skipped:
        pieces.append(self._pieces[i])
    return self._target.decode_pieces(pieces).replace(_WORD_BOUNDARY, " ").strip()

  def id_to_piece(self, i: int) -> str:
    """The vocab.json piece of our id `i`."""
    return self._pieces[int(i)]

  def __getstate__(self):  # Picklable for grain worker processes.
    return {"protos": self._protos, "vocab": self.vocab, "path": self.path}

  def __setstate__(self, state):
    self.__init__(*state["protos"], state["vocab"], state["path"])


def _split_language_code(text: str) -> tuple[list[str], str]:
  """'>>deu<< Hallo' -> (['>>deu<<'], ' Hallo'), as MarianTokenizer.remove_language_code."""
  if text.startswith(">>"):
    end = text.find("<<")
    if end != -1:
      return [text[:end + 2]], text[end + 2:]
  return [], text
