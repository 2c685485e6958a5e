"""Batch translation with a trained model: the `Translator` and the batched search it runs.

    tr = Translator.from_workdir("workdirs/multi30k")          # latest checkpoint
    tr.translate(["A man is riding a bike."], beam_size=4)    # -> ["Ein Mann fährt Fahrrad."]

Sentences are tokenized once, sorted by length, grouped into a few padded bucket shapes (so the
search compiles a handful of times, not once per batch), encoded once per batch, searched with
the cached beam search (or greedy decoding, or sampling: `config.search.method`), and returned
in the input order. With a `mesh`, every batch is split over its first axis (training's BLEU
runs this way on the training mesh, so it is the number `flax-transformer evaluate` gives).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flax_transformer import predict, search
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import ModelConfig, SearchConfig, TranslateConfig, search_config_from
from flax_transformer.data.tokenizer import EOS_ID, Tokenizer
from flax_transformer.model.transformer import Transformer

Array = jax.Array
MIN_BUCKET = 8  # Shortest padded source length; buckets double from here up to max_len.


def search_batch(model: Transformer, params: Any, inputs: Array, rng: Array, *,
                 settings: SearchConfig, max_decode_len: int) -> tuple[Array, Array]:
  """Searches translations of one batch: inputs int32 [B, S] -> (sequences int32 [B, K, L],
  scores float32 [B, K]), best first; K = 1 for greedy decoding and sampling.

  Jit it with `settings` and `max_decode_len` static. Scores: beam search's are
  length-normalized log-probabilities, the others' summed log-probabilities.
  """
  prepared = predict.prepare_search(
      model, {"params": params}, inputs, max_decode_len=max_decode_len,
      max_len_a=settings.max_len_a, max_len_b=settings.max_len_b,
      grow_cache=predict.grows_cache(settings.grow_cache, settings.method))
  if settings.method == "beam":
    return search.beam_search(
        **prepared.arguments, beam_size=settings.beam_size,
        length_penalty=settings.length_penalty, min_length=settings.min_length)
  if settings.method == "greedy":
    sequences, scores = search.greedy_search(**prepared.arguments,
                                             min_length=settings.min_length)
  else:
    sequences, scores = search.sample(
        **prepared.arguments, rng=rng, temperature=settings.temperature, top_k=settings.top_k,
        top_p=settings.top_p, min_length=settings.min_length)
  return sequences[:, None], scores[:, None]


@dataclasses.dataclass(frozen=True)
class Batch:
  """One search batch: which sentences, padded to which shape."""

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
  """Parameters + vocabulary + model config, ready to translate lists of sentences.

  Args:
    model_config: the architecture. params: its parameters (variables['params']).
    tokenizer: the shared vocabulary. settings: how to search and batch (default: defaults).
    step: the checkpoint step the parameters come from (for reports).
    mesh: split every batch over this mesh's first axis (rows padded to a multiple of its
      size); parameters stay where they are. None: one device.
  """

  def __init__(self, model_config: ModelConfig, params: Any, tokenizer: Tokenizer,
               settings: TranslateConfig | None = None, *, step: int | None = None,
               mesh: Mesh | None = None):
    if tokenizer.vocab_size != model_config.vocab_size:
      raise ValueError(
          f"The vocabulary {tokenizer.path} has {tokenizer.vocab_size} pieces but the model "
          f"expects {model_config.vocab_size}.")
    self.model_config = model_config
    self.model = Transformer(model_config)
    self.params = params
    self.tokenizer = tokenizer
    self.settings = settings or TranslateConfig()
    self.step = step
    self.mesh = mesh
    replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())
    self._search = jax.jit(functools.partial(search_batch, self.model),
                           static_argnames=("settings", "max_decode_len"),
                           out_shardings=replicated)
    self.truncated = 0  # Sentences cut to the model's max_len in the last call.

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, step: int | None = None, *,
                   checkpoint: str | os.PathLike | None = None, **settings: Any) -> Translator:
    """Restores a training workdir: its config.json, vocab.model and a checkpoint's params.

    Args:
      workdir: the training workdir.
      step: the checkpoint step (default: the latest).
      checkpoint: instead of a step, an averaged checkpoint written by `average_checkpoints`.
      **settings: `TranslateConfig` fields, its search group's included (beam_size,
        length_penalty, batch_tokens, ...); the defaults come from the workdir's config.search.
    """
    config = workdir_lib.read_config(workdir)
    tokenizer = workdir_lib.load_tokenizer(workdir)
    model_config = workdir_lib.model_config(config, tokenizer)
    try:
      search_config = search_config_from(config)
    except ValueError as error:
      raise ValueError(f"{Path(workdir) / workdir_lib.CONFIG_FILE}: {error}") from None
    # Checked before the checkpoint is read.
    translate_config = TranslateConfig(search=search_config).replace(**settings)
    params, step = workdir_lib.restore_params(workdir, step, checkpoint=checkpoint)
    return cls(model_config, params, tokenizer, translate_config, step=step)

  def translate(self, sentences: Sequence[str], **settings: Any) -> list[str]:
    """One translation per sentence, in input order; empty sentences give empty strings."""
    return [hyps[0][0] for hyps in self.translate_nbest(sentences, n=1, **settings)]

  def translate_nbest(self, sentences: Sequence[str], n: int | None = None,
                      **settings: Any) -> list[list[tuple[str, float]]]:
    """The n best (text, score) pairs per sentence, best first (n defaults to beam_size).

    Beam scores are length-normalised log-probabilities: sum of log p / ((5 + m) / 6) ** alpha.
    """
    results: list[list[tuple[str, float]]] = [[] for _ in sentences]
    for indices, sequences, scores in self._translate_ids(sentences, **settings):
      take = min(n or sequences.shape[1], sequences.shape[1])
      for row, index in enumerate(indices):
        results[index] = [(self.tokenizer.detokenize(sequences[row, k]), float(scores[row, k]))
                          for k in range(take)]
    for index, sentence in enumerate(sentences):
      if not sentence.strip():
        results[index] = [("", 0.0)]
    return results

  def iter_translate(self, sentences: Sequence[str],
                     **settings: Any) -> Iterator[tuple[np.ndarray, list[str]]]:
    """Yields (input indices, best translations) batch by batch, for progress reporting."""
    for indices, sequences, _ in self._translate_ids(sentences, **settings):
      yield indices, [self.tokenizer.detokenize(seq[0]) for seq in sequences[: len(indices)]]

  def _tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
    """Source ids + EOS per sentence ([] for blank ones), cut to the model's max_len."""
    limit = self.model_config.max_len - 1  # Room for EOS.
    token_ids = []
    self.truncated = 0
    for sentence in sentences:
      ids = self.tokenizer.tokenize(sentence) if sentence.strip() else []
      if len(ids) > limit:
        self.truncated += 1
        ids = ids[:limit]
      token_ids.append(ids + [EOS_ID] if ids else [])
    if self.truncated:
      logging.warning("%d of %d sentences were longer than the model's max_len (%d tokens) "
                      "and were truncated.", self.truncated, len(sentences), limit + 1)
    return token_ids

  def _translate_ids(self, sentences: Sequence[str], **settings: Any):
    options = self.settings.replace(**settings)
    token_ids = self._tokenize(sentences)
    real = [i for i, ids in enumerate(token_ids) if ids]
    lengths = [len(token_ids[i]) for i in real]
    rng = jax.random.key(options.seed)
    for batch in plan_batches(lengths, options.batch_tokens, self.model_config.max_len):
      indices = np.asarray(real)[batch.indices]
      inputs = np.zeros((self._rows(batch.rows), batch.length), np.int32)  # [B, S]
      for row, index in enumerate(indices):
        inputs[row, : len(token_ids[index])] = token_ids[index]
      # Room for the longest cap in the bucket, plus EOS.
      cap = math.floor(options.search.max_len_a * batch.length) + options.search.max_len_b + 1
      sequences, scores = self._search(
          self.params, self._place(inputs), rng, settings=options.search,
          max_decode_len=int(min(cap, self.model_config.max_len)))
      yield indices, np.asarray(sequences)[: len(indices)], np.asarray(scores)[: len(indices)]

  def _rows(self, rows: int) -> int:
    """Rows padded up to a multiple of the mesh's first axis, so they split evenly."""
    if self.mesh is None:
      return rows
    size = self.mesh.shape[self.mesh.axis_names[0]]
    return -(-rows // size) * size

  def _place(self, inputs: np.ndarray) -> Array:
    """The batch on the device, or split over the mesh's first axis (every process passes the
    same whole batch and keeps its own rows)."""
    if self.mesh is None:
      return jnp.asarray(inputs)
    sharding = NamedSharding(self.mesh, PartitionSpec(self.mesh.axis_names[0]))
    return jax.make_array_from_callback(inputs.shape, sharding, lambda index: inputs[index])


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
