"""Batch translation with a trained checkpoint: the `Translator` API and its file helpers.

    tr = Translator.from_workdir("workdirs/multi30k")          # latest checkpoint
    tr.translate(["A man is riding a bike."], beam_size=4)    # -> ["Ein Mann fährt Fahrrad."]

Sentences are tokenized once, sorted by length, grouped into a few padded bucket shapes (so the
decoder compiles a handful of times, not once per batch), encoded once per batch, decoded with
the cached beam search, and returned in the input order.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import averaging, predict
from flax_transformer.config import ModelConfig, model_config_from
from flax_transformer.data.tokenizer import EOS_ID, Tokenizer
from flax_transformer.model.transformer import Transformer
from flax_transformer.training import checkpoints

Array = jax.Array
MIN_BUCKET = 8  # Shortest padded source length; buckets double from here up to max_len.


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """How translations are searched. At most floor(max_len_a * n + max_len_b) tokens before EOS
  for a source of n tokens (EOS included; the paper used n + 50), within the model's max_len."""

  beam_size: int = 4
  length_penalty: float = 0.6
  max_len_a: float = 1.0
  max_len_b: int = 50
  batch_tokens: int = 4096  # Source tokens (padded) per decoding batch.
  # Grow the self-attention cache with the output (faster runs, longer compiles): None = on
  # for beam search on CPU (`predict.translate_ids`).
  grow_cache: bool | None = None

  def __post_init__(self):
    if self.beam_size < 1:
      raise ValueError(f"beam_size must be >= 1, got {self.beam_size}.")
    if self.length_penalty < 0:
      raise ValueError(f"length_penalty must be >= 0, got {self.length_penalty}.")
    if self.max_len_a < 0 or self.max_len_b < 1:
      raise ValueError(
          f"max_len_a must be >= 0 and max_len_b >= 1, got {self.max_len_a}, {self.max_len_b}.")
    if self.batch_tokens < MIN_BUCKET:
      raise ValueError(f"batch_tokens must be >= {MIN_BUCKET}, got {self.batch_tokens}.")
    if self.grow_cache not in (None, True, False):
      raise ValueError(f"grow_cache must be None, True or False, got {self.grow_cache!r}.")


@dataclasses.dataclass(frozen=True)
class Batch:
  """One decoding batch: which sentences, padded to which shape."""

  indices: np.ndarray  # int [rows used], positions in the input list
  rows: int  # padded row count (a power of two)
  length: int  # padded source length (a bucket)


def bucket_length(length: int, max_len: int) -> int:
  """The padded length for a source of `length` tokens: a power of two >= 8, at most max_len."""
  bucket = MIN_BUCKET
  while bucket < length:
    bucket *= 2
  return min(bucket, max_len)


def plan_batches(lengths: Sequence[int], batch_tokens: int, max_len: int) -> list[Batch]:
  """Groups sentences of similar length into batches of at most `batch_tokens` padded tokens.

  Example: lengths [3, 30, 5] with batch_tokens 64 give Batch([0, 2], rows=2, length=8) and
  Batch([1], rows=1, length=32). Row counts are powers of two, so with B buckets there are at
  most B * log2(rows) shapes to compile.
  """
  order = np.argsort(np.asarray(lengths), kind="stable")
  batches: list[Batch] = []
  by_bucket: dict[int, list[int]] = {}
  for index in order:
    by_bucket.setdefault(bucket_length(int(lengths[index]), max_len), []).append(int(index))
  for length, indices in sorted(by_bucket.items()):
    capacity = _floor_power_of_two(max(1, batch_tokens // length))
    for start in range(0, len(indices), capacity):
      chunk = np.asarray(indices[start:start + capacity])
      batches.append(Batch(chunk, rows=min(capacity, _ceil_power_of_two(len(chunk))),
                           length=length))
  return batches


def _floor_power_of_two(n: int) -> int:
  return 1 << (n.bit_length() - 1)


def _ceil_power_of_two(n: int) -> int:
  return 1 << (n - 1).bit_length()


class Translator:
  """Restored parameters + vocabulary + model config, ready to translate lists of sentences."""

  def __init__(self, model_config: ModelConfig, params: Any, tokenizer: Tokenizer,
               settings: DecodeSettings | None = None, *, step: int | None = None):
    if tokenizer.vocab_size != model_config.vocab_size:
      raise ValueError(
          f"The vocabulary {tokenizer.path} has {tokenizer.vocab_size} pieces but the model "
          f"expects {model_config.vocab_size}.")
    self.model_config = model_config
    self.model = Transformer(model_config)
    self.params = params
    self.tokenizer = tokenizer
    self.settings = settings or DecodeSettings()
    self.step = step
    self._search = jax.jit(self._search_batch, static_argnames=(
        "beam_size", "max_decode_len", "length_penalty", "max_len_a", "max_len_b",
        "grow_cache"))
    self.truncated = 0  # Sentences cut to the model's max_len in the last call.

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, step: int | None = None, *,
                   checkpoint: str | os.PathLike | None = None, **settings: Any) -> Translator:
    """Restores a training workdir: its config.json, vocab.model and a checkpoint's params.

    Args:
      workdir: the training workdir.
      step: the checkpoint step (default: the latest).
      checkpoint: instead of a step, an averaged checkpoint written by `average_checkpoints`.
      **settings: `DecodeSettings` fields (beam_size, length_penalty, ...); defaults come from
        the workdir's config.decode where it has them.
    """
    workdir = Path(workdir)
    config_path = workdir / checkpoints.CONFIG_FILE
    if not config_path.is_file():
      raise FileNotFoundError(
          f"{config_path} not found: is {workdir} a training workdir (train.py --workdir)?")
    config = json.loads(config_path.read_text())
    tokenizer = Tokenizer.load(workdir / checkpoints.VOCAB_FILE)
    model_config = model_config_from(config["model"], tokenizer.vocab_size)
    defaults = {k: v for k, v in config.get("decode", {}).items()
                if k in {f.name for f in dataclasses.fields(DecodeSettings)}}
    if "grow_cache" in defaults:  # "auto", "yes" or "no" in the config.
      if defaults["grow_cache"] not in predict.GROW_CACHE_SETTINGS:
        raise ValueError(
            f"{config_path}: decode.grow_cache must be one of "
            f"{', '.join(predict.GROW_CACHE_SETTINGS)}; got {defaults['grow_cache']!r}.")
      defaults["grow_cache"] = predict.GROW_CACHE_SETTINGS[defaults["grow_cache"]]
    defaults.update(settings)
    settings = DecodeSettings(**defaults)  # Checked before the checkpoint is read.
    if checkpoint is not None:
      params, step = averaging.restore_averaged_params(checkpoint)
    else:
      params, step = checkpoints.restore_params(workdir, step)
    return cls(model_config, params, tokenizer, settings, step=step)

  def translate(self, sentences: Sequence[str], **settings: Any) -> list[str]:
    """One translation per sentence, in input order; empty sentences give empty strings."""
    return [hyps[0][0] for hyps in self.translate_nbest(sentences, n=1, **settings)]

  def translate_nbest(self, sentences: Sequence[str], n: int | None = None,
                      **settings: Any) -> list[list[tuple[str, float]]]:
    """The n best (text, score) pairs per sentence, best first (n defaults to beam_size).

    Scores are length-normalised log-probabilities: sum of log p / ((5 + m) / 6) ** alpha.
    """
    results: list[list[tuple[str, float]]] = [[] for _ in sentences]
    for indices, sequences, scores in self._translate_ids(sentences, **settings):
      take = n or sequences.shape[1]
      for row, index in enumerate(indices):
        results[index] = [(self.tokenizer.decode(sequences[row, k]), float(scores[row, k]))
                          for k in range(min(take, sequences.shape[1]))]
    for index, sentence in enumerate(sentences):
      if not sentence.strip():
        results[index] = [("", 0.0)]
    return results

  def iter_translate(self, sentences: Sequence[str],
                     **settings: Any) -> Iterator[tuple[np.ndarray, list[str]]]:
    """Yields (input indices, best translations) batch by batch, for progress reporting."""
    for indices, sequences, _ in self._translate_ids(sentences, **settings):
      yield indices, [self.tokenizer.decode(seq[0]) for seq in sequences[: len(indices)]]

  def _translate_ids(self, sentences: Sequence[str], **settings: Any):
    options = dataclasses.replace(self.settings, **settings)
    limit = self.model_config.max_len - 1  # Room for EOS.
    token_ids = []
    self.truncated = 0
    for sentence in sentences:
      ids = self.tokenizer.encode(sentence) if sentence.strip() else []
      if len(ids) > limit:
        self.truncated += 1
        ids = ids[:limit]
      token_ids.append(ids + [EOS_ID] if ids else [])
    if self.truncated:
      logging.warning("%d of %d sentences were longer than the model's max_len (%d tokens) "
                      "and were truncated.", self.truncated, len(sentences), limit + 1)
    real = [i for i, ids in enumerate(token_ids) if ids]
    lengths = [len(token_ids[i]) for i in real]
    for batch in plan_batches(lengths, options.batch_tokens, self.model_config.max_len):
      indices = np.asarray(real)[batch.indices]
      inputs = np.zeros((batch.rows, batch.length), np.int32)  # [B, S]
      for row, index in enumerate(indices):
        inputs[row, : len(token_ids[index])] = token_ids[index]
      # Room for the longest cap in the bucket, plus EOS.
      cap = math.floor(options.max_len_a * batch.length) + options.max_len_b + 1
      sequences, scores = self._search(
          self.params, jnp.asarray(inputs), beam_size=options.beam_size,
          max_decode_len=int(min(cap, self.model_config.max_len)),
          length_penalty=float(options.length_penalty), max_len_a=float(options.max_len_a),
          max_len_b=int(options.max_len_b), grow_cache=options.grow_cache)
      yield indices, np.asarray(sequences)[: len(indices)], np.asarray(scores)[: len(indices)]

  def _search_batch(self, params: Any, inputs: Array, *, beam_size: int, max_decode_len: int,
                    length_penalty: float, max_len_a: float, max_len_b: int,
                    grow_cache: bool | None) -> tuple[Array, Array]:
    """inputs [B, S] -> (sequences [B, K, L], scores [B, K]), best first."""
    return predict.translate_ids(
        self.model, {"params": params}, inputs, beam_size=beam_size,
        max_decode_len=max_decode_len, length_penalty=length_penalty, eos_id=EOS_ID,
        max_len_a=max_len_a, max_len_b=max_len_b, return_all=True, grow_cache=grow_cache)


# ------------------------------------------------------------------------------------ files
def read_lines(path: str) -> list[str]:
  """Lines of a UTF-8 text file ('-' for stdin; gzip-compressed when it ends in .gz), without
  line ends.

  Raises:
    FileNotFoundError for a missing file; ValueError naming the file for a corrupt .gz, and the
    file and line number of the first invalid UTF-8 byte sequence.
  """
  name = "<stdin>" if path == "-" else path
  if path == "-":
    raw = sys.stdin.buffer.read()
  else:
    if not Path(path).is_file():
      raise FileNotFoundError(f"Input file not found: {path}")
    raw = Path(path).read_bytes()
    if path.endswith(".gz"):
      try:
        raw = gzip.decompress(raw)
      except (OSError, EOFError) as error:
        raise ValueError(f"{path}: not a valid gzip file ({error}).") from None
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  text = []
  for number, line in enumerate(lines, start=1):
    try:
      text.append(line.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as error:
      raise ValueError(f"{name}:{number}: invalid UTF-8 ({error.reason} at byte "
                       f"{error.start}); translate needs UTF-8 text.") from None
  return text


def write_lines_atomically(path: str, lines: Sequence[str]) -> None:
  """Writes one line per item to `path` ('-' for stdout; gzip-compressed when it ends in .gz,
  as `read_lines` reads it) through a temporary file + rename, so a failure never leaves a
  partial file that looks complete."""
  text = "".join(line.replace("\n", " ") + "\n" for line in lines)
  if path == "-":
    sys.stdout.write(text)
    sys.stdout.flush()
    return
  target = Path(path)
  tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}")
  try:
    data = text.encode("utf-8")
    tmp.write_bytes(gzip.compress(data, mtime=0) if path.endswith(".gz") else data)
    os.replace(tmp, target)
  finally:
    tmp.unlink(missing_ok=True)


def translate_lines(translator: Translator, lines: Sequence[str], *,
                    progress: Callable[[int], None] | None = None,
                    **settings: Any) -> list[str]:
  """Translations of `lines` in order, one per line; `progress(n)` after each batch of n."""
  outputs = [""] * len(lines)
  for indices, texts in translator.iter_translate(lines, **settings):
    for index, text in zip(indices, texts, strict=True):
      outputs[index] = text
    if progress:
      progress(len(indices))
  return outputs


class ProgressBar:
  """A one-line progress bar on stderr (only when stderr is a terminal) and a final summary."""

  def __init__(self, total: int, stream=sys.stderr):
    self.total, self.done, self.stream = total, 0, stream
    self.start = time.perf_counter()
    self.interactive = stream.isatty()

  def __call__(self, count: int) -> None:
    self.done += count
    if self.interactive and self.total:
      width = 30
      filled = int(width * self.done / self.total)
      rate = self.done / max(time.perf_counter() - self.start, 1e-9)
      self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                        f"sentences, {rate:.1f}/s")
      self.stream.flush()

  def close(self) -> float:
    """Ends the bar, prints sentences/s, and returns the elapsed seconds."""
    elapsed = time.perf_counter() - self.start
    if self.interactive:
      self.stream.write("\n")
    self.stream.write(f"Translated {self.total} lines in {elapsed:.1f} s "
                      f"({self.total / max(elapsed, 1e-9):.1f} sentences/s).\n")
    return elapsed
