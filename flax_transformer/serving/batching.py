"""Planning search batches: length buckets, row counts, steps over the devices, and the results
put back in input order (NumPy only).

A *device batch* is what one device searches at a time: `rows` sentences (some rows may be
padding) padded to one bucket length. `plan_batches` makes them from the sentences' lengths and
the token budget alone. `group_steps` then deals device batches of one shape to the devices, D at
a time, padding a step with empty device batches when fewer than D of that shape are left.

Row counts are powers of two of at least `MIN_ROWS` (8), up to what the bucket's budget holds:
any number of sentences up to 8 in a bucket shares one compiled program. A notebook or a short
CLI call thus compiles once per bucket for a handful of sentences instead of once per number of
them (each compile costs about 3 s on a CPU, even for the tiny model); the price is padding
rows when fewer than 8 sentences are searched. Above 8, a batch's rows are the next power of two
as before: a coarser ladder (8, 64, 512, ...) was measured and dropped, because a file's last,
partial batch of each bucket then padded up to 8x and a 1,000-line file translated at 0.76x
(docs/performance.md, "Measured design choices").

So the shape a sentence is searched in never depends on the number of devices. This matters for
byte-identical output: XLA's CPU matmuls may round differently for another number of rows, and a
beam search turns a last-bit difference into another hypothesis at a near-tie. With this plan, one
device, 8 devices and 2 processes x 2 devices search every sentence in the same [rows, length]
batch and give the same bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
MIN_BUCKET = 8  # Shortest padded length; buckets double from here up to max_len.
MIN_ROWS = 8  # Fewest rows of a batch: 1 to 8 sentences of a bucket share one program.


@dataclasses.dataclass(frozen=True)
class Batch:
  """One device batch: which sentences, padded to which shape."""

  indices: np.ndarray  # int [rows used], positions in the input list
  rows: int  # padded row count (`rows_for`: a power of two, at least 8 unless capped)
  length: int  # padded source length (a bucket)
  target_length: int = 0  # padded target length when targets are given (scoring), else 0

  @property
  def shape(self) -> tuple[int, int, int]:
    return self.rows, self.length, self.target_length


@dataclasses.dataclass(frozen=True)
class Step:
  """Device batches of one shape searched together, one per device; None = an empty one."""

  batches: tuple[Batch | None, ...]  # [D]
  rows: int  # rows per device
  length: int
  target_length: int = 0

  @property
  def indices(self) -> np.ndarray:
    """int [sentences]: the positions of the step's sentences, device by device."""
    parts = [b.indices for b in self.batches if b is not None]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)

  def row_positions(self) -> np.ndarray:
    """int [sentences]: the row of the step's [D * rows, ...] arrays holding each sentence."""
    parts = [d * self.rows + np.arange(len(b.indices))
             for d, b in enumerate(self.batches) if b is not None]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def bucket_length(length: int, max_len: int) -> int:
  """The padded length for `length` tokens: a power of two >= 8, at most max_len."""
  bucket = MIN_BUCKET
  while bucket < length:
    bucket *= 2
  return min(bucket, max_len)


def decode_length(settings: Any, source_length: int, max_len: int) -> int:
  """L for a bucket of `source_length`: room for its longest cap (max_len_a * source_length +
  max_len_b tokens) plus EOS, at most the model's `max_len`."""
  cap = math.floor(settings.max_len_a * source_length) + settings.max_len_b + 1
  return int(min(cap, max_len))


def plan_batches(lengths: Sequence[int], batch_tokens: int, max_len: int,
                 target_lengths: Sequence[int] | None = None) -> list[Batch]:
  """Groups sentences of similar length into device batches of at most `batch_tokens` padded
  tokens (at least one row).

  Example: lengths [3, 30, 5] with batch_tokens 64 give Batch([0, 2], rows=8, length=8) and
  Batch([1], rows=2, length=32). Row counts come from `rows_for`, so with B buckets there are at
  most B * log2(rows / 4) shapes to compile. With `target_lengths` (scoring),
  sentences are bucketed by both lengths and the budget counts the longer of the two.
  """
  order = np.argsort(np.asarray(lengths), kind="stable")
  by_bucket: dict[tuple[int, int], list[int]] = {}
  for index in order:
    target = 0 if target_lengths is None else bucket_length(int(target_lengths[index]), max_len)
    key = (bucket_length(int(lengths[index]), max_len), target)
    by_bucket.setdefault(key, []).append(int(index))
  batches: list[Batch] = []
  for (length, target), indices in sorted(by_bucket.items()):
    capacity = _floor_power_of_two(max(1, batch_tokens // max(length, target)))
    for start in range(0, len(indices), capacity):
      chunk = np.asarray(indices[start:start + capacity])
      batches.append(Batch(chunk, rows=rows_for(len(chunk), capacity), length=length,
                           target_length=target))
  return batches


def rows_for(count: int, capacity: int) -> int:
  """The padded rows of a device batch of `count` sentences in a bucket that holds `capacity`
  (a power of two): the next power of two, at least `MIN_ROWS`, at most `capacity`."""
  return min(max(MIN_ROWS, 1 << (count - 1).bit_length()), capacity)


def row_counts(capacity: int) -> list[int]:
  """Every row count `rows_for` gives in a bucket of `capacity`, smallest first."""
  return sorted({rows_for(count, capacity) for count in range(1, capacity + 1)})


def search_shapes(batch_tokens: int, max_len: int) -> list[tuple[int, int]]:
  """(rows, length) of every device batch `plan_batches` can make: each bucket's row counts,
  shortest bucket first (what `Translator.compile` compiles ahead of time)."""
  return [(rows, length) for capacity, length in largest_shapes(batch_tokens, max_len)
          for rows in row_counts(capacity)]


def largest_shapes(batch_tokens: int, max_len: int) -> list[tuple[int, int]]:
  """(rows, length) of the largest device batch `plan_batches` can make in each bucket, shortest
  bucket first: every other batch of that bucket has fewer rows."""
  lengths = sorted({bucket_length(MIN_BUCKET << i, max_len)
                    for i in range(max(1, max_len).bit_length())})
  return [(_floor_power_of_two(max(1, batch_tokens // length)), length) for length in lengths]


def group_steps(batches: Sequence[Batch], num_devices: int) -> list[Step]:
  """Deals device batches of one shape to `num_devices` devices per step, in plan order; the
  last step of each shape is padded with empty device batches (None)."""
  pending: dict[tuple[int, int, int], list[Batch]] = {}
  steps: list[Step] = []

  def emit(shape: tuple[int, int, int]) -> None:
    group = pending.pop(shape)
    steps.append(Step(tuple(group) + (None,) * (num_devices - len(group)), *shape))

  for batch in batches:
    pending.setdefault(batch.shape, []).append(batch)
    if len(pending[batch.shape]) == num_devices:
      emit(batch.shape)
  for shape in list(pending):
    emit(shape)
  return steps


def fill_rows(step: Step, token_ids: Sequence[Sequence[int]], length: int) -> np.ndarray:
  """int32 [D * rows, length]: each sentence's ids at its row (`Step.row_positions`), zeros
  elsewhere (padding, and the empty rows that end at once)."""
  array = np.zeros((len(step.batches) * step.rows, length), np.int32)
  for row, index in zip(step.row_positions(), step.indices, strict=True):
    ids = token_ids[index]
    array[row, : len(ids)] = ids
  return array


def fill_phrases(step: Step, phrase_ids: Sequence[Sequence[Sequence[int]]], count: int,
                 pieces: int) -> np.ndarray:
  """int32 [D * rows, count, pieces]: each sentence's phrases (its list of id lists) at its row,
  each phrase's ids then zeros; zeros for no phrase."""
  array = np.zeros((len(step.batches) * step.rows, count, pieces), np.int32)
  for row, index in zip(step.row_positions(), step.indices, strict=True):
    for c, ids in enumerate(phrase_ids[index]):
      array[row, c, : len(ids)] = ids
  return array


def in_input_order(count: int, batches: Iterable[tuple[Sequence[int], Sequence[T]]],
                   fill: T) -> list[T]:
  """The values of `batches` ((input indices, values) in plan order) put back in input order,
  `count` of them; `fill` where no batch gave a value (blank lines, which are never searched)."""
  results = [fill] * count
  for indices, values in batches:
    for index, value in zip(indices, values, strict=True):
      results[index] = value
  return results


def _floor_power_of_two(n: int) -> int:
  return 1 << (n.bit_length() - 1)


