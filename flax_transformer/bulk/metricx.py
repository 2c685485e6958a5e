"""MetricX-24 scores of translations with an imported MetricX checkpoint (an mT5 workdir).

    flax-transformer import-hf google/metricx-24-hybrid-large-v2p6 --workdir runs/metricx24
    flax-transformer score --metric metricx --workdir runs/metricx24 \\
        --src test.en --tgt test.de [--ref ref.de] --output scores.txt

    scores(translator, sources, candidates, references)  # -> [float], lower is better

The rule is google-research/metricx's (metricx24/predict.py and models.py, read at fc4978e; this
is our own code):

  1. the input text is "source: " + source + " candidate: " + translation + " reference: " +
     reference (the hybrid model with a reference), or "source: " + source + " candidate: " +
     translation (reference-free, QE: metricx24's --qe), for every line, empty ones included;
  2. it is tokenized with mT5's SentencePiece model (the checkpoints' tokenizer is
     google/mt5-xl's), cut to `max_tokens` (1536, the README's length, which the models were
     trained with) with EOS, and the EOS then removed: at most 1535 pieces, no EOS;
  3. the decoder reads one token, the padding id 0, over the encoder's output;
  4. the score is the logit of "<extra_id_10>" at that first step (id 250089 in mT5's
     vocabulary, which metricx hard-codes; here it is looked up in the workdir's vocabulary,
     so a model with another vocabulary size works too), clipped to [0, 25]. Lower is better
     (an MQM-like error score: 0 is a perfect translation).

MetricX's head is mT5's untied `lm_head` (its D^-0.5 scale only where the config ties it), which
`import-hf` maps as for any mT5. Each line is scored in a padded batch of length bucket
(`serving.batching`), over the devices of the translator's mesh; rows never mix, so a line's
score does not depend on its neighbours beyond the last bits of float32.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from flax_transformer import files
from flax_transformer.bulk.chunk_tasks import format_score
from flax_transformer.bulk.jobs import ChunkOutput, Progress
from flax_transformer.conventions import EOS_ID, PAD_ID
from flax_transformer.errors import InputError
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.transformer import Transformer
from flax_transformer.runtime import sharding
from flax_transformer.serving import batching
from flax_transformer.serving.translator import Translator

SCORE_TOKEN = "<extra_id_10>"  # The piece whose logit is the score (250089 in mT5's vocabulary).
MAX_TOKENS = 1536  # metricx24's --max_input_length in its README: pieces with EOS, before its cut.
SCORE_RANGE = (0.0, 25.0)  # The clip of MT5ForRegression.
FORMAT = "mt5"  # config.json's origin format of an imported MetricX checkpoint.

Array = jax.Array


def input_text(source: str, candidate: str, reference: str | None = None) -> str:
  """The text MetricX-24 reads for one line: with a reference, the hybrid model's input; with
  None, the reference-free (QE) one.

  >>> input_text("Hallo Welt.", "Hello world.", "Hello, world.")
  'source: Hallo Welt. candidate: Hello world. reference: Hello, world.'
  >>> input_text("Hallo Welt.", "Hello world.")
  'source: Hallo Welt. candidate: Hello world.'
  """
  text = f"source: {source} candidate: {candidate}"
  return text if reference is None else f"{text} reference: {reference}"


def input_ids(tokenizer: Any, texts: Sequence[str], max_tokens: int = MAX_TOKENS
              ) -> tuple[list[list[int]], np.ndarray]:
  """(each text's ids as MetricX feeds them: its pieces cut to `max_tokens` - 1, no EOS;
  bool [n], which were cut): metricx24 tokenizes with truncation to `max_tokens` including EOS,
  then drops the last id, the EOS."""
  if max_tokens < 2:
    raise InputError(f"max_tokens must be >= 2 (pieces and EOS), got {max_tokens}.")
  pieces = tokenizer.tokenize_batch(list(texts))
  cut = np.asarray([len(ids) > max_tokens - 1 for ids in pieces], bool)
  return [list(ids[:max_tokens - 1]) for ids in pieces], cut


def score_id(tokenizer: Any, where: str = "the workdir") -> int:
  """Our id of `SCORE_TOKEN` in a T5 vocabulary (one piece of its own); InputError otherwise."""
  ids = tokenizer.tokenize(SCORE_TOKEN)
  if len(ids) != 1 or tokenizer.id_to_piece(ids[0]) != SCORE_TOKEN:
    raise InputError(f"{where} is not a MetricX-24 model: its vocabulary has no {SCORE_TOKEN} "
                     "token (MetricX's score); import one with flax-transformer import-hf "
                     "google/metricx-24-hybrid-large-v2p6 (and google/mt5-xl's spiece.model).")
  return ids[0]


def check_workdir(opened: Any) -> int:
  """The score id of an opened MetricX workdir (`workdir.Workdir`), after checking that it is
  one: an imported mT5 (T5's relative positions, decoding from the padding id) whose vocabulary
  holds `SCORE_TOKEN`. Raises InputError in one line naming the workdir otherwise."""
  config = opened.model_config
  origin = (opened.config.get("origin") or {}).get("format")
  if (origin != FORMAT or config.relative_attention_num_buckets <= 0
      or config.decoder_start_id != PAD_ID):
    what = f"imported from a {origin!r} model" if origin else "not imported by import-hf"
    raise InputError(f"{opened.path} is not a MetricX-24 model: an mT5 imported with "
                     f"flax-transformer import-hf google/metricx-24-hybrid-large-v2p6 (it is "
                     f"{what}).")
  return score_id(opened.tokenizer, str(opened.path))


def score_batch(model: Transformer, params: Any, inputs: Array, *, score_id: int) -> Array:
  """float32 [B]: MetricX's score of each row of inputs int32 [B, S] (padding 0): the logit of
  `score_id` at the decoder's first step, read from the padding id, clipped to `SCORE_RANGE`."""
  # One target token per row: teacher forcing feeds the decoder the start id (0) and reads the
  # logits of position 0; its value only marks the position as real (not padding).
  targets = jnp.full((inputs.shape[0], 1), EOS_ID, jnp.int32)  # [B, 1]
  logits = model.apply({"params": params}, inputs, targets)  # [B, 1, V]
  return jnp.clip(logits[:, 0, score_id].astype(jnp.float32), *SCORE_RANGE)


@functools.cache
def _program(model_config: ModelConfig, mesh: Mesh | None, score_id: int) -> Any:
  """`score_batch` jitted once per (served) model config, mesh and score id."""
  replicated = None if mesh is None else sharding.replicated(mesh)
  return jax.jit(functools.partial(score_batch, Transformer(model_config), score_id=score_id),
                 out_shardings=replicated)


class Scores(NamedTuple):
  """One step's scores, in plan order."""

  indices: np.ndarray  # int [n]: positions in the input list
  scores: np.ndarray  # float32 [n], in [0, 25]
  tokens: int  # input pieces scored
  truncated: int  # inputs of this step cut to max_tokens


def iter_scores(translator: Translator, texts: Sequence[str], *, score_id: int,
                max_tokens: int = MAX_TOKENS) -> Iterator[Scores]:
  """Yields the MetricX scores of `input_text`s step by step: sorted into length buckets of at
  most `translator.settings.batch_tokens` padded tokens, one device batch per device of its
  mesh, step i + 1 dispatched before step i is fetched."""
  if translator.ensemble:
    raise InputError("MetricX scores with one checkpoint, not an ensemble: give one "
                     "--checkpoint (or --step).")
  ids, cut = input_ids(translator.tokenizer, texts, max_tokens)
  batches = batching.plan_batches([len(row) for row in ids], translator.settings.batch_tokens,
                         max_tokens)
  program = _program(translator.model_config, translator.mesh, score_id)
  pending = None
  for step in [*batching.group_steps(batches, translator.num_devices), None]:
    if step is not None:
      outputs = program(translator.params, _place(translator.mesh,
                                                  batching.fill_rows(step, ids, step.length)))
    if pending is not None:
      done, values = pending[0], np.asarray(jax.device_get(pending[1]))
      yield Scores(done.indices, values[done.row_positions()],
                   sum(len(ids[i]) for i in done.indices), int(cut[done.indices].sum()))
    pending = None if step is None else (step, outputs)


def _place(mesh: Mesh | None, array: np.ndarray) -> Array:
  """A batch on the device, or its rows split over the mesh's 'data' axis."""
  if mesh is None:
    return jnp.asarray(array)
  return jax.make_array_from_callback(array.shape, sharding.batch_sharding(mesh),
                                      lambda index: array[index])


def scores(translator: Translator, sources: Sequence[str], candidates: Sequence[str],
           references: Sequence[str] | None = None, *, max_tokens: int = MAX_TOKENS
           ) -> list[float]:
  """MetricX-24's score of each candidate translation of its source (and, given `references`,
  with its reference; reference-free otherwise), in input order, in [0, 25], lower is better.
  `translator`: a MetricX workdir's (`Translator.from_workdir`)."""
  given = {"sources": len(sources), "candidates": len(candidates)}
  if references is not None:
    given["references"] = len(references)
  files.check_line_aligned(given)
  texts = [input_text(s, c, None if references is None else references[i])
           for i, (s, c) in enumerate(zip(sources, candidates, strict=True))]
  steps = iter_scores(translator, texts, score_id=score_id(translator.tokenizer),
                      max_tokens=max_tokens)
  ordered = batching.in_input_order(len(texts), ((s.indices, s.scores) for s in steps), 0.0)
  return [float(v) for v in ordered]


class MetricxTask:
  """A bulk job's chunk of (source, translation[, reference]) records -> one MetricX-24 score
  a line (`format_score`); `truncated` counts the inputs cut to `max_tokens`."""

  verb = "Scored"
  line_per_record = True
  independent = False  # Scored in batches: a chunk is kept whole or not at all.

  def __init__(self, translator: Translator, score_id: int, *, max_tokens: int = MAX_TOKENS):
    self.translator, self.score_id, self.max_tokens = translator, score_id, max_tokens

  def __call__(self, first_line: int, records: Sequence[tuple[str, ...]],
               progress: Progress) -> ChunkOutput:
    del first_line  # Scores need no key.
    texts = [input_text(*record) for record in records]
    truncated = 0

    def steps() -> Iterator[tuple[np.ndarray, np.ndarray]]:
      nonlocal truncated
      for step in iter_scores(self.translator, texts, score_id=self.score_id,
                              max_tokens=self.max_tokens):
        truncated += step.truncated
        progress(len(step.indices), step.tokens)
        yield step.indices, step.scores

    values = batching.in_input_order(len(records), steps(), 0.0)
    return ChunkOutput(("".join(format_score(float(v)) + "\n" for v in values),), truncated)


__all__ = ["FORMAT", "MAX_TOKENS", "SCORE_RANGE", "SCORE_TOKEN", "MetricxTask", "Scores",
           "check_workdir", "input_ids", "input_text", "iter_scores", "score_batch", "score_id",
           "scores"]
