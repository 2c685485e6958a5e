"""BPE-dropout (Provilkov et al., 2020) over a SentencePiece BPE model, seeded.

`BpeDropout(model_proto).tokenize_batch(texts, dropout=p, seed=s, rule=...)` segments each text
as SentencePiece's BPE does (`bpe_model.cc`: the adjacent pair whose merged piece scores highest
is merged first, the leftmost on a tie), except that each merge about to be applied is skipped
with probability p; p = 0 gives SentencePiece's own ids. Two rules for a skipped merge:

  'paper'          Provilkov et al.'s Algorithm 1: at every step each possible merge is dropped
                   anew, the best survivor is applied, and the word is done when all possible
                   merges are dropped at once. A skipped pair is retried after the next merge
                   (as subword-nmt, YouTokenToMe and Hugging Face tokenizers do).
  'sentencepiece'  SentencePiece's `enable_sampling` (Marian's `--sentencepiece-alphas`): a
                   skipped pair is never merged again, so the same p splits far more.

SentencePiece samples from an absl::BitGen that absl salts per process: one seed gives other
segmentations in another process, so a resumed run or a grain worker would not see the
segmentations the uninterrupted run saw. Here the draws come from NumPy's PCG64 seeded with
(seed, text index), the same in any process, thread and platform.

The text is SentencePiece's normalized form (`normalize`: NFKC, whitespace as U+2581 '▁'), cut
before each '▁': no piece of a BPE model trained with `split_by_whitespace` holds '▁' past its
first character, so no merge crosses that cut. A character outside the vocabulary becomes its
UTF-8 byte pieces (byte fallback) or the unknown id, as in SentencePiece.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Literal

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from flax_transformer.errors import InputError

_SPACE = "\u2581"
_Type = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
Rule = Literal["paper", "sentencepiece"]
RULES: tuple[Rule, ...] = ("paper", "sentencepiece")


class _Draws:
  """Uniform draws in [0, 1) from PCG64 seeded with (seed, k), taken in blocks as needed (a
  block's values are the stream's next ones, so the block size changes no draw)."""

  __slots__ = ("_block", "_rng", "_used", "_values")

  def __init__(self, seed: int, k: int, block: int):
    self._rng = np.random.default_rng([seed, k])
    self._block = max(block, 16)
    self._values: list[float] = []
    self._used = 0

  def next(self) -> float:
    if self._used == len(self._values):
      self._values = self._rng.random(self._block).tolist()
      self._used = 0
    self._used += 1
    return self._values[self._used - 1]


class BpeDropout:
  """Seeded BPE-dropout segmentation with a SentencePiece BPE model (see the module docstring)."""

  def __init__(self, model_proto: bytes):
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(model.trainer_spec.model_type)
    if kind != "BPE":
      raise InputError(f"BPE-dropout needs a SentencePiece BPE model; this one is {kind.lower()}.")
    if not model.trainer_spec.split_by_whitespace or model.trainer_spec.treat_whitespace_as_suffix:
      raise InputError("BPE-dropout needs a SentencePiece model trained with split_by_whitespace "
                       "and '▁' as a prefix (SentencePiece's defaults).")
    self._normalizer = spm.SentencePieceProcessor(model_proto=model_proto)
    # Mergeable pieces (NORMAL, as SentencePiece's PieceToIdNoReserved): piece -> (id, score).
    # Characters are looked up here too; one missing is spelled by `_fallback`.
    self._pieces: dict[str, tuple[int, float]] = {}
    self._bytes: dict[int, int] = {}  # byte value -> id of its <0xNN> piece
    self._unk_id = 0
    for i, piece in enumerate(model.pieces):
      if piece.type == _Type.NORMAL:
        self._pieces[piece.piece] = (i, piece.score)
      elif piece.type == _Type.BYTE:
        self._bytes[int(piece.piece[3:5], 16)] = i
      elif piece.type == _Type.UNKNOWN:
        self._unk_id = i
      elif piece.type in (_Type.UNUSED, _Type.USER_DEFINED):
        raise InputError("BPE-dropout does not support SentencePiece models with unused or "
                         "user-defined pieces.")
    self._byte_fallback = model.trainer_spec.byte_fallback and len(self._bytes) == 256

  def tokenize_batch(self, texts: Sequence[str], *, dropout: float, seed: int,
                     rule: Rule = "paper") -> list[list[int]]:
    """Ids of each text (no EOS); text k draws from PCG64 seeded with (seed, k). `rule`: what
    becomes of a skipped merge (the module docstring)."""
    if rule not in RULES:
      raise InputError(f"BPE-dropout rule {rule!r} is not one of {', '.join(map(repr, RULES))}.")
    if not 0.0 <= dropout < 1.0:
      raise InputError(f"BPE-dropout probability {dropout} is not in [0, 1).")
    if not 0 <= seed < 2**32:
      raise InputError(f"BPE-dropout seed {seed} is not in [0, 2**32).")
    out = []
    for k, text in enumerate(texts):
      normalized = self._normalizer.normalize(text)
      # The 'sentencepiece' rule draws at most once per pair pushed (len - 1 at the start, 2 per
      # merge after): one block. The 'paper' rule redraws skipped pairs: more blocks as needed.
      draws = _Draws(seed, k, 3 * len(normalized)) if dropout else None
      ids: list[int] = []
      start = 0
      while start < len(normalized):
        end = normalized.find(_SPACE, start + 1)
        end = len(normalized) if end < 0 else end
        self._word(normalized[start:end], dropout, draws, rule == "paper", ids)
        start = end
      out.append(ids)
    return out

  def _word(self, word: str, dropout: float, draws: _Draws | None, retry: bool,
            ids: list[int]) -> None:
    """Appends the ids of `word` (no '▁' past its first character) to `ids`. `retry`: a skipped
    pair goes back on the agenda after the next merge (the 'paper' rule)."""
    pieces = self._pieces
    symbols = list(word)  # '' once merged into its left neighbour
    after = list(range(1, len(word))) + [-1]  # the next live symbol
    before = list(range(-1, len(word) - 1))  # the previous live symbol
    agenda: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

    def push(left: int, right: int) -> None:
      if left < 0 or right < 0:
        return
      merged = symbols[left] + symbols[right]
      entry = pieces.get(merged)
      if entry is not None:
        heapq.heappush(agenda, (-entry[1], left, right, len(merged)))

    for left in range(len(word) - 1):
      push(left, left + 1)
    skipped: list[tuple[float, int, int, int]] = []
    while agenda:
      top = heapq.heappop(agenda)
      _, left, right, length = top
      if (not symbols[left] or not symbols[right]
          or len(symbols[left]) + len(symbols[right]) != length):
        continue  # Stale: one side was merged into another piece since it was pushed.
      if draws is not None and draws.next() < dropout:
        if retry:
          skipped.append(top)  # Dropped for this step: back on the agenda after the next merge.
        continue  # Under the 'sentencepiece' rule, dropped for good.
      for entry in skipped:
        heapq.heappush(agenda, entry)
      skipped.clear()
      symbols[left] += symbols[right]
      symbols[right] = ""
      after[left] = after[right]
      if after[right] >= 0:
        before[after[right]] = left
      push(before[left], left)
      push(left, after[left])
    index = 0
    while index >= 0:
      entry = pieces.get(symbols[index])
      if entry is not None:
        ids.append(entry[0])
      else:
        ids.extend(self._fallback(symbols[index]))
      index = after[index]

  def _fallback(self, character: str) -> list[int]:
    """The ids of a character outside the vocabulary: its UTF-8 bytes, or the unknown id."""
    if self._byte_fallback:
      return [self._bytes[b] for b in character.encode("utf-8")]
    return [self._unk_id]
