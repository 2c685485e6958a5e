"""SentencePiece tokenizer: one vocabulary shared by source and target, with the special ids
of `flax_transformer.conventions` (re-exported here):

  PAD_ID = 0  padding, and the decoder's start (BOS) token: the model shifts targets right by one
              position and fills the first with 0, so no separate BOS piece exists.
  EOS_ID = 1  ends every source and target sequence.
  UNK_ID = 2  characters the vocabulary cannot spell (never produced with byte fallback).

`Tokenizer.tokenize` returns the ids of a sentence without EOS; the pipeline appends it.
`Tokenizer.detokenize` stops at the first EOS and ignores padding, so a row of search output
(`[7, 12, 1, 0, 0]`) gives its sentence.

Sources and targets are tokenized by separate methods (`tokenize` / `tokenize_target`, and their
`_batch` forms) although this vocabulary treats them alike: a workdir imported from Marian
(`flax_transformer.data.marian_tokenizer`) tokenizes each side with its own SentencePiece model,
and every caller goes through the `TextTokenizer` protocol that both kinds implement.

`Tokenizer.tokenize_batch_dropout` is BPE-dropout (Provilkov et al., 2020) for training
(`flax_transformer.data.bpe_dropout`): each merge is skipped with a probability, so a word comes
out in varying segmentations; the ids depend on the texts, the probability and a seed alone.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import sentencepiece as spm

from flax_transformer.conventions import EOS_ID, PAD_ID, UNK_ID
from flax_transformer.errors import InputError, MissingFileError
from flax_transformer.files import to_path

if TYPE_CHECKING:
  from flax_transformer.data.bpe_dropout import BpeDropout, Rule

# Vocabularies at least this big reserve 256 byte pieces, so any character round-trips; smaller
# (toy) vocabularies keep every id for real pieces.
BYTE_FALLBACK_MIN_VOCAB = 2048


class TextTokenizer(Protocol):
  """What the pipeline, the translator and the exporters need of a vocabulary (ids as above)."""

  path: str

  @property
  def vocab_size(self) -> int:
    """V, the number of ids (including pad, eos and unk)."""
    ...

  def tokenize(self, text: str) -> list[int]:
    """Ids of a source sentence, without EOS."""
    ...

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each source sentence, without EOS."""
    ...

  def tokenize_target(self, text: str) -> list[int]:
    """Ids of a target sentence, without EOS."""
    ...

  def tokenize_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each target sentence, without EOS."""
    ...

  def detokenize(self, ids: Iterable[int]) -> str:
    """The target text of `ids` up to the first EOS, skipping padding."""
    ...

  def id_to_piece(self, i: int) -> str:
    """The piece (token string) of id `i`, the same on both sides."""
    ...


class Tokenizer:
  """A SentencePiece model with the package's special ids (pad 0, eos 1, unk 2, no BOS), shared
  by source and target."""

  def __init__(self, model_proto: bytes, path: str = ""):
    self._proto = model_proto
    self.path = path
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self._bpe_dropout: BpeDropout | None = None  # Built on the first `tokenize_batch_dropout`.
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise InputError(
          f"SentencePiece model {path or '<bytes>'} has (pad, eos, unk, bos) ids {ids}; this "
          f"package needs ({PAD_ID}, {EOS_ID}, {UNK_ID}, -1). Train it with "
          "training.vocabulary.prepare_vocabulary or pass pad_id=0 eos_id=1 unk_id=2 bos_id=-1.")

  @classmethod
  def load(cls, path: str | os.PathLike) -> Tokenizer:
    """Loads a SentencePiece model file written by `train_tokenizer` (or compatible)."""
    path = to_path(path)
    if not path.is_file():
      raise MissingFileError(f"SentencePiece model not found: {path}")
    return cls(path.read_bytes(), str(path))

  @property
  def vocab_size(self) -> int:
    """V, the number of ids (including pad, eos and unk)."""
    return self._sp.get_piece_size()

  @property
  def proto(self) -> bytes:
    """The serialized SentencePiece model (what a vocab.model file holds)."""
    return self._proto

  @property
  def model_type(self) -> str:
    """The SentencePiece algorithm the model was trained with: 'unigram', 'bpe', 'word', 'char'."""
    from sentencepiece import sentencepiece_model_pb2  # protobuf: imported by training only.
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(self._proto)
    return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(model.trainer_spec.model_type).lower()

  def tokenize(self, text: str) -> list[int]:
    """Token ids of `text`, without EOS."""
    return self._sp.encode(text, out_type=int)

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without EOS (one call into SentencePiece)."""
    return self._sp.encode(list(texts), out_type=int)

  def tokenize_batch_dropout(self, texts: Sequence[str], *, dropout: float, seed: int,
                             rule: Rule = "paper") -> list[list[int]]:
    """Token ids of each text, without EOS, under BPE-dropout: each merge skipped with
    probability `dropout` (0 gives `tokenize_batch`'s ids), a skipped merge retried after the
    next one (`rule='paper'`) or never (`'sentencepiece'`). The same (texts, dropout, seed, rule)
    give the same ids in any process. BPE models only (`model_type`); `data.bpe_dropout`."""
    if self._bpe_dropout is None:
      from flax_transformer.data.bpe_dropout import BpeDropout  # Training only (protobuf).
      self._bpe_dropout = BpeDropout(self._proto)
    return self._bpe_dropout.tokenize_batch(texts, dropout=dropout, seed=seed, rule=rule)

  def tokenize_target(self, text: str) -> list[int]:
    """Token ids of a target sentence, without EOS: the same as `tokenize` (shared vocabulary)."""
    return self.tokenize(text)

  def tokenize_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each target sentence, without EOS: the same as `tokenize_batch`."""
    return self.tokenize_batch(texts)

  def detokenize(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS, skipping padding."""
    pieces = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i != PAD_ID:
        pieces.append(i)
    return self._sp.decode(pieces)

  def id_to_piece(self, i: int) -> str:
    """The SentencePiece piece of id `i`."""
    return self._sp.id_to_piece(int(i))

  def __getstate__(self):  # Picklable for grain worker processes.
    return {"proto": self._proto, "path": self.path}

  def __setstate__(self, state):
    self.__init__(state["proto"], state["path"])


def train_tokenizer(sentences: Iterable[str], *, vocab_size: int, model_type: str) -> Tokenizer:
  """Trains SentencePiece on `sentences` (write `Tokenizer.proto` to keep it).

  `vocab_size` is a soft limit (`hard_vocab_limit=False`): a small corpus that cannot fill it gets
  a smaller vocabulary instead of an error; `Tokenizer.vocab_size` reports the real size.
  """
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=model,
      vocab_size=vocab_size,
      model_type=model_type,
      pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
      character_coverage=1.0,
      byte_fallback=vocab_size >= BYTE_FALLBACK_MIN_VOCAB,
      hard_vocab_limit=False,
      normalization_rule_name="nmt_nfkc",
      num_threads=1,  # Deterministic, so every process trains the same vocabulary.
      minloglevel=2,
  )
  return Tokenizer(model.getvalue())
