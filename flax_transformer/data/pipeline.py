"""The grain input pipeline: split readers, the vocabulary's text sample, packed train and eval
batches.

Train batches (`train_iterator`), one shape only, [R, L] with R = batch_tokens // max_length //
process_count rows per process and L = max_length:

  inputs, targets                          int32 token ids, each example ends with EOS, 0 = pad
  inputs_segment_ids, targets_segment_ids  1..n for the n examples packed in a row, 0 on padding
  inputs_positions, targets_positions      0.. restarting at each example

  Two examples (a: src [5, 6, 1], tgt [7, 1]; b: src [8, 1], tgt [9, 9, 1]) in one row of L 6:
    inputs              [5, 6, 1, 8, 1, 0]     targets              [7, 1, 9, 9, 1, 0]
    inputs_segment_ids  [1, 1, 1, 2, 2, 0]     targets_segment_ids  [1, 1, 2, 2, 2, 0]
    inputs_positions    [0, 1, 2, 0, 1, 0]     targets_positions    [0, 1, 0, 1, 2, 0]

With `alignments=True` (guided alignment training) batches also hold

  alignment  bool [R, L, L]: alignment[r, t, s] is True when target piece t of row r is aligned
             to source piece s (`data.alignments.piece_alignment`: every piece of target word j
             to every piece of source word i for each word pair (i, j), target EOS to source
             EOS); each example's block sits at its packed positions, so examples of one row
             are never aligned to each other. Above, a's word pair (0, 0) and b's (0, 0):
               t=0 -> s=0, 1 (a: "▁x" "y" = one source word); t=1 -> s=2 (EOS);
               t=2, 3 -> s=3 (b's word); t=4 -> s=4 (EOS); t=5: none (padding).

The order of examples is a deterministic function of `data.seed` and the epoch (a different
permutation each epoch), so the iterator's state (`get_state()`, or grain's orbax
`CheckpointSave`/`CheckpointRestore`) is a small JSON dict and a restored iterator continues with
exactly the batch the uninterrupted run would have seen. Each process reads the disjoint shard
`train[process_index::process_count]`.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np
from absl import flags

from flax_transformer.config import ConfigError, DataConfig
from flax_transformer.conventions import ALIGNMENT_KEY  # bool [R, L, L] in aligned batches.
from flax_transformer.data import alignments as alignments_lib
from flax_transformer.data import builders, synthetic
from flax_transformer.data.tokenizer import EOS_ID, TextTokenizer
from flax_transformer.files import to_path

TRAIN_KEYS = ("inputs", "targets", "inputs_segment_ids", "targets_segment_ids",
              "inputs_positions", "targets_positions")


# ---------------------------------------------------------------------------------------------
# Split readers.
# ---------------------------------------------------------------------------------------------
def _builder(data: DataConfig, split: str, alignments: bool = False):
  """The prepared TFDS builder that holds `split` of `data`'s source (with word alignments)."""
  data_dir = data.tfds_data_dir or None
  langs = (data.source_lang, data.target_lang)
  if alignments and data.source == "tfds":
    raise ConfigError("config.train.guided_alignment_weight > 0 needs word alignments, which "
                      "config.data.source='tfds' does not have: use source='local' with "
                      "{split}.align files beside the text, or 'synthetic'.")
  if data.source == "local":
    directory = to_path(data.local_dir)
    builders.check_local_split(directory, langs, data.local_pattern, split)
    if alignments:
      builders.check_local_alignments(directory, data.local_pattern, split)
    config = builders.local_builder_config(str(directory), langs, data.local_pattern,
                                           alignments=alignments)
    return _prepared(builders.LocalTranslation, config, data_dir)
  if data.source == "synthetic":
    sizes = ((data.test_split, data.synthetic_num_test), (data.eval_split, data.synthetic_num_eval),
             (data.train_split, data.synthetic_num_train))
    config = builders.synthetic_builder_config(data.seed, sizes)
    return _prepared(builders.SyntheticTranslation, config, data_dir)
  builder = builders.prepare(builders.tfds_builder(data.tfds_name, data_dir))
  _check_tfds_builder(data, builder, split)
  return builder


def _prepared(cls, config, data_dir):
  with builders.quiet_tfds():
    builder = cls(config=config, data_dir=data_dir, file_format=builders.ARRAY_RECORD)
    return builders.prepare(builder)


def _check_tfds_builder(data: DataConfig, builder, split: str) -> None:
  languages = getattr(builder.info.features, "languages", None)
  if languages is None:
    raise builders.DataError(f"config.data.tfds_name={data.tfds_name!r} has features "
                     f"{builder.info.features}; expected a tfds.features.Translation.")
  for name in ("source_lang", "target_lang"):
    if getattr(data, name) not in languages:
      raise ConfigError(f"config.data.{name} must be one of {tuple(languages)} (the languages "
                        f"of {data.tfds_name}), got {getattr(data, name)!r}.")
  known = list(builder.info.splits)  # Empty when TFDS does not know them (e.g. when mocked).
  base = split.split("[")[0]
  if known and base not in known:
    raise builders.DataError(
        f"Split {split!r} not in {data.tfds_name}; its splits are {known}.")


def open_split(data: DataConfig, split: str, *,
               alignments: bool = False) -> Sequence[dict[str, Any]]:
  """Random-access reader (tfds.data_source) of `split`: examples {lang: text bytes}, and with
  `alignments` also {'alignment': Moses 'i-j' line} (local: `{split}.align` checked, missing
  one: MissingDataError; tfds: ConfigError)."""
  return _Reader(_builder(data, split, alignments).as_data_source(split=split))


class _Reader:
  """A TFDS data source whose batched read (`__getitems__`, ~4x faster) falls back to reading
  one by one where a source lacks it (tfds.testing.mock_data's)."""

  def __init__(self, source: Sequence[Any]):
    self.source = source

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> Any:
    return self.source[index]

  def __getitems__(self, indices: Sequence[int]) -> list[Any]:
    try:
      return list(self.source.__getitems__(indices))
    except TypeError:
      return [self.source[i] for i in indices]


class _Pair:
  """Picklable example -> (source text, target text) for `grain.MapDataset.map`."""

  def __init__(self, source_lang: str, target_lang: str):
    self.langs = (source_lang, target_lang)

  def __call__(self, example: Mapping[str, Any]) -> tuple[str, str]:
    return tuple(_text(example[lang]) for lang in self.langs)


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class _WordPairs:
  """Picklable example -> its word pairs (i, j) as (source word, target word) of `data`'s
  direction (the synthetic pair stores English -> target; the other way round they swap)."""

  def __init__(self, data: DataConfig):
    self.swap = data.source == "synthetic" and data.source_lang != synthetic.SOURCE_LANG

  def __call__(self, example: Mapping[str, Any]) -> list[tuple[int, int]]:
    pairs = alignments_lib.parse_alignment(_text(example[ALIGNMENT_KEY]))
    return sorted((j, i) for i, j in pairs) if self.swap else pairs


def split_texts(data: DataConfig, split: str) -> list[tuple[str, str]]:
  """The (source, target) text pairs of `split`, in the dataset's order (for BLEU)."""
  return [_Pair(data.source_lang, data.target_lang)(example)
          for example in _read_all(open_split(data, split))]


def prepare_data(data: DataConfig) -> list[tuple[str, int, str]]:
  """Prepares the train, eval and test splits of `data` where training reads them (the TFDS data
  folder `data.tfds_data_dir`, '' = TFDS's default), as train.py does on first use; returns each
  split's (name, pairs, folder). Already prepared data is only opened."""
  prepared = []
  for split in dict.fromkeys((data.train_split, data.eval_split, data.test_split)):
    builder = _builder(data, split)
    prepared.append((split, len(builder.as_data_source(split=split)), str(builder.data_dir)))
  return prepared


def split_alignments(data: DataConfig, split: str
                     ) -> list[tuple[str, str, list[tuple[int, int]]]]:
  """(source text, target text, word pairs (i, j)) of every pair of `split` with its word
  alignment (local: `{split}.align`; synthetic: the gold ones), in the dataset's order."""
  pair, word_pairs = _Pair(data.source_lang, data.target_lang), _WordPairs(data)
  return [(*pair(example), word_pairs(example))
          for example in _read_all(open_split(data, split, alignments=True))]


def _read_all(reader: _Reader, chunk: int = 4096) -> list[Any]:
  """Every example of a data source, read in chunks."""
  examples = []
  for start in range(0, len(reader), chunk):
    examples.extend(reader.__getitems__(list(range(start, min(start + chunk, len(reader))))))
  return examples


# ---------------------------------------------------------------------------------------------
# Text for the vocabulary (training/vocabulary.py trains it).
# ---------------------------------------------------------------------------------------------
def tokenizer_sample(data: DataConfig) -> list[str]:
  """Sentences of seeded-random training pairs, up to `data.vocab_max_chars` characters."""
  reader = open_split(data, data.train_split)
  pair = _Pair(data.source_lang, data.target_lang)
  order = np.random.default_rng(data.seed).permutation(len(reader))
  sentences, chars = [], 0
  for start in range(0, len(order), 4096):
    indices = [int(i) for i in order[start:start + 4096]]
    for example in reader.__getitems__(indices):
      for sentence in pair(example):
        if chars + len(sentence) > data.vocab_max_chars:
          return sentences
        sentences.append(sentence)
        chars += len(sentence)
  return sentences


# ---------------------------------------------------------------------------------------------
# Train batches.
# ---------------------------------------------------------------------------------------------
_READ_CHUNK = 256  # Examples read (one array_record call) and tokenized (one SentencePiece call).


class _TokenizeAndFilter:
  """(chunk index, examples) -> [{'inputs', 'targets'}] int32 ids ending with EOS, kept if short.

  Chunk i holds the shuffled examples [i * C, (i + 1) * C) of the endless train stream. With
  `data.bpe_dropout`, its sources and targets are segmented under BPE-dropout with seeds drawn
  from (data.seed, process index, i), so a pair's segmentation changes every epoch and a
  restored iterator sees the uninterrupted run's. Counts kept and dropped pairs and logs them at
  the end of each epoch it sees (the counts are per process, and per grain worker when
  num_workers > 0).
  """

  def __init__(self, tokenizer: TextTokenizer, data: DataConfig, epoch_size: int,
               alignments: bool = False, process_index: int = 0):
    self.tokenizer, self.max_length, self.epoch_size = tokenizer, data.max_length, epoch_size
    self.bpe_dropout, self.bpe_dropout_rule = data.bpe_dropout, data.bpe_dropout_rule
    self.seed, self.process_index = data.seed, process_index
    self.pair = _Pair(data.source_lang, data.target_lang)
    self.word_pairs = _WordPairs(data) if alignments else None
    self._pieces: list[str] | None = None  # id -> piece, read once (with alignments).
    self._lock = threading.Lock()
    self.kept = self.dropped = 0
    self.reported = False  # An epoch's counts were logged (later ones only if they drop pairs).

  def __call__(self, chunk_index: int, examples: list[Any]) -> list[dict[str, np.ndarray]]:
    pairs = [self.pair(example) for example in examples]
    if self.bpe_dropout:
      source_seed, target_seed = np.random.SeedSequence(
          [self.seed, self.process_index, chunk_index]).generate_state(2)
      sources = self.tokenizer.tokenize_batch_dropout(  # type: ignore[attr-defined]
          [source for source, _ in pairs], dropout=self.bpe_dropout, seed=int(source_seed),
          rule=self.bpe_dropout_rule)
      targets = self.tokenizer.tokenize_batch_dropout(  # type: ignore[attr-defined]
          [target for _, target in pairs], dropout=self.bpe_dropout, seed=int(target_seed),
          rule=self.bpe_dropout_rule)
    else:
      sources = self.tokenizer.tokenize_batch([source for source, _ in pairs])
      targets = self.tokenizer.tokenize_target_batch([target for _, target in pairs])
    keep = [len(source) < self.max_length and len(target) < self.max_length
            for source, target in zip(sources, targets, strict=True)]
    self._count(chunk_index * _READ_CHUNK, keep)
    kept = []
    for example, source, target, k in zip(examples, sources, targets, keep, strict=True):
      if k:
        kept.append({"inputs": np.array([*source, EOS_ID], np.int32),
                     "targets": np.array([*target, EOS_ID], np.int32)})
        if self.word_pairs is not None:
          kept[-1][ALIGNMENT_KEY] = self._alignment(self.word_pairs(example), source, target)
    return kept

  def _alignment(self, word_pairs: list[tuple[int, int]], source: list[int],
                 target: list[int]) -> np.ndarray:
    """bool [T + 1, L]: the example's piece alignment (EOS included), source pieces in the
    first S + 1 columns; the packer places it, `_PlaceAlignment` shifts its columns."""
    if self._pieces is None:
      self._pieces = [self.tokenizer.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
    source_words = alignments_lib.word_of_pieces([self._pieces[i] for i in source])
    target_words = alignments_lib.word_of_pieces([self._pieces[i] for i in target])
    matrix = alignments_lib.piece_alignment(word_pairs, source_words, target_words,
                                            len(source) + 1, len(target) + 1)
    out = np.zeros((len(target) + 1, self.max_length), bool)
    out[:, :len(source) + 1] = matrix > 0
    return out

  def _count(self, first: int, keep: list[bool]) -> None:
    """Adds one chunk's filter results; logs when the chunk holds the last pair of an epoch: the
    first such epoch, and any later one that dropped pairs (epochs that keep every pair would
    repeat the same line)."""
    with self._lock:
      in_epoch = (first // self.epoch_size + 1) * self.epoch_size - first  # Left in the epoch.
      self.kept += sum(keep[:in_epoch])
      self.dropped += len(keep[:in_epoch]) - sum(keep[:in_epoch])
      if in_epoch <= len(keep) and (self.dropped or not self.reported):
        self.reported = True
        logging.info("Train length filter, epoch %d: kept %d, dropped %d pairs with source or "
                     "target longer than max_length=%d tokens incl. EOS (counted by this "
                     "process since it started).", first // self.epoch_size, self.kept,
                     self.dropped, self.max_length)
      if in_epoch <= len(keep):
        rest = keep[in_epoch:]
        self.kept, self.dropped = sum(rest), len(rest) - sum(rest)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != "_lock"}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()


class _PlaceAlignment:
  """A packed row: moves each example's alignment columns to its packed source positions.

  The packer put example k's rows [T_k + 1, L] at its target positions, its columns still
  counting from 0; they move right by the position of k's first source piece.
  """

  def __call__(self, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    row = dict(row)
    local = row.pop(ALIGNMENT_KEY)  # [L, L], columns per example
    del row[f"{ALIGNMENT_KEY}_segment_ids"], row[f"{ALIGNMENT_KEY}_positions"]
    segments = row["inputs_segment_ids"]  # [L]
    length = len(segments)
    first = np.full(length + 1, length, np.int64)  # segment id -> its first source position
    np.minimum.at(first, segments, np.arange(length))
    shift = np.where(row["targets_segment_ids"] > 0, first[row["targets_segment_ids"]], 0)
    columns = np.arange(length)[None, :] - shift[:, None]  # [L, L] column to read
    placed = np.take_along_axis(local, np.clip(columns, 0, length - 1), axis=1)
    row[ALIGNMENT_KEY] = placed & (columns >= 0)
    return row


class _Flatten(grain.experimental.FlatMapTransform):
  """A list of examples -> its examples, one by one."""

  max_fan_out = _READ_CHUNK

  def flat_map(self, element):
    return element


def _check_bpe_dropout(data: DataConfig, tokenizer: TextTokenizer) -> None:
  """One line, before anything is read or compiled, when `data.bpe_dropout` cannot apply."""
  if not data.bpe_dropout:
    return
  model_type = getattr(tokenizer, "model_type", None)
  if model_type != "bpe":
    what = (f"a SentencePiece {model_type} model" if model_type else
            f"a {type(tokenizer).__name__}")
    raise ConfigError(
        f"config.data.bpe_dropout={data.bpe_dropout} needs a SentencePiece BPE vocabulary, but "
        f"{tokenizer.path or 'the vocabulary'} is {what} (a vocabulary given by "
        "config.data.vocab_path or kept from config.train.init_from is used as it is): set "
        "config.data.bpe_dropout=0, or train a new one with config.data.vocab_model_type='bpe' "
        "and neither.")


def train_dataset(data: DataConfig, tokenizer: TextTokenizer, *, process_index: int = 0,
                  process_count: int = 1, alignments: bool = False) -> grain.IterDataset:
  """The endless packed train dataset of one process (see the module docstring); with
  `alignments`, batches hold the piece alignment too (guided alignment training)."""
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, process_count={process_count}).")
  rows = data.rows_per_process(process_count)
  _check_bpe_dropout(data, tokenizer)
  reader = open_split(data, data.train_split, alignments=alignments)
  shard = grain.MapDataset.source(reader)[process_index::process_count]
  if len(shard) == 0:
    raise builders.DataError(f"Train split {data.train_split!r} has no examples for process "
                     f"{process_index} of {process_count}.")
  ds = shard.shuffle(seed=data.seed).repeat()  # A new permutation each epoch.
  ds = ds.batch(_READ_CHUNK, batch_fn=list)  # Chunks may straddle epochs, as the stream does.
  ds = ds.map_with_index(_TokenizeAndFilter(tokenizer, data, len(shard), alignments,
                                            process_index))
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4))
  ds = grain.experimental.FlatMapIterDataset(ds, _Flatten())
  length = {"inputs": data.max_length, "targets": data.max_length}
  if alignments:  # Rows [T + 1, L] of each example, packed along the target like `targets`.
    length[ALIGNMENT_KEY] = data.max_length
  ds = grain.experimental.FirstFitPackIterDataset(
      ds, length_struct=length, num_packing_bins=rows, seed=data.seed, shuffle_bins=False)
  if alignments:
    ds = ds.map(_PlaceAlignment())
  ds = ds.batch(rows, drop_remainder=True)
  if data.num_workers:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside absl.app (tests,
      flags.FLAGS.mark_as_parsed()  # notebooks) nothing parses them, so use their defaults.
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=data.num_workers),
                        worker_init_fn=_ignore_stop_signals)
    ds = ds.map(_own_memory)
  return ds


def _own_memory(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A batch from grain's workers copied out of their shared memory, in the trainer.

  Each leaf arrives as a block of shared memory that grain unlinks when its array is deleted,
  in a thread. A batch still alive when the job ends (the last one, held by the step's arrays)
  was never unlinked by grain, and Python's resource tracker ended every job with "There appear
  to be 6 leaked shared_memory objects to clean up at shutdown". A copy (a few hundred KB per
  batch) lets each block go as soon as it is read.
  """
  return {key: np.array(value) for key, value in batch.items()}


def _ignore_stop_signals(worker_index: int, worker_count: int) -> None:
  """Runs in every grain worker process before it reads: SIGINT and SIGTERM are ignored there.

  `scancel`, Kubernetes and Ctrl-C send them to the whole process group, the workers included.
  A worker that died of one takes its prefetched batches and shared memory with it, and the
  trainer's next batch fails with "Worker process was terminated unexpectedly". The trainer
  alone answers them: it finishes the step, saves (the iterator's position included) and
  closes the iterator, which stops the workers itself (grain's stop event, then SIGKILL).
  """
  del worker_index, worker_count
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)


def train_iterator(data: DataConfig, tokenizer: TextTokenizer, *, process_index: int = 0,
                   process_count: int = 1, alignments: bool = False) -> grain.DatasetIterator:
  """An endless iterator of packed batches, dict of int32 [R, L] (module docstring), plus
  'alignment' bool [R, L, L] with `alignments`.

  Its state (`get_state`/`set_state`, or grain.checkpoint.CheckpointSave/Restore with orbax)
  resumes exactly. With num_workers > 0, the order depends on num_workers too.
  """
  return iter(train_dataset(data, tokenizer, process_index=process_index,
                            process_count=process_count, alignments=alignments))


def position_worker_count(state: Mapping[str, Any]) -> int | None:
  """The `data.num_workers` of the train iterator whose `get_state()` `state` is: 0 for one that
  reads in the training process, N for N grain worker processes, None for a form not known here.

  A position fits only an iterator of the same count: grain's workers each read their own slice
  of the stream, and their positions cycle over them (`mp_prefetch`'s interleave state).
  """
  if "iterators_in_use_indices" in state:  # One iterator per worker, read in turn.
    return len(state["iterators_in_use_indices"])
  if "parent" in state:  # The in-process chain: the batcher's state over its parent's.
    return 0
  return None


# ---------------------------------------------------------------------------------------------
# Eval batches.
# ---------------------------------------------------------------------------------------------
def eval_batches(data: DataConfig, tokenizer: TextTokenizer, split: str, *,
                 process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
  """Every pair of `split` as {'inputs', 'targets'} int32 [eval_batch_size, eval_max_length].

  Sequences end with EOS; longer ones keep their first eval_max_length - 1 tokens plus EOS (the
  count is logged). Process p holds pairs [p * k, (p + 1) * k), k = ceil(n / process_count),
  in order; every process gets the same number of batches, the last ones padded with all-zero
  rows.
  """
  pairs = split_texts(data, split)
  if not pairs:
    raise builders.DataError(f"Split {split!r} is empty.")
  per_process = math.ceil(len(pairs) / process_count)
  mine = pairs[process_index * per_process:(process_index + 1) * per_process]
  rows = data.eval_batch_size * math.ceil(per_process / data.eval_batch_size)
  arrays = {}
  for key, texts, tokenize in (("inputs", [s for s, _ in mine], tokenizer.tokenize_batch),
                               ("targets", [t for _, t in mine], tokenizer.tokenize_target_batch)):
    arrays[key], truncated = _pad_and_truncate(tokenize(texts), rows, data.eval_max_length)
    if truncated:
      logging.warning("Eval split %r: truncated %d of %d %s to eval_max_length=%d tokens.",
                      split, truncated, len(texts), key, data.eval_max_length)
  b = data.eval_batch_size
  return [{k: v[i:i + b] for k, v in arrays.items()} for i in range(0, rows, b)]


def _pad_and_truncate(ids: Sequence[Sequence[int]], rows: int,
                      length: int) -> tuple[np.ndarray, int]:
  """int32 [rows, length]: each sequence + EOS, cut to `length` (EOS kept last), 0-padded."""
  out = np.zeros((rows, length), np.int32)
  truncated = 0
  for row, seq in enumerate(ids):
    seq = [*seq[:length - 1], EOS_ID]
    truncated += len(ids[row]) + 1 > length
    out[row, :len(seq)] = seq
  return out, truncated
