"""Evaluation during training: loss/accuracy over a whole split, and BLEU/chrF of its translation.

Every process holds a contiguous block of the split's pairs as equal-sized batches (the data
pipeline's `eval_batches`); batch j of all processes forms one global batch split over the
mesh. Translations come back replicated on every process and are put back in the split's order,
so every sentence of the split is scored exactly once (padding rows are dropped).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from flax_transformer.data.tokenizer import EOS_ID, Tokenizer
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training import sharding as sharding_lib


@dataclasses.dataclass
class SplitResult:
  """The metrics of one evaluation of a split, and a few example translations as text."""

  scalars: dict[str, float]
  examples: str = ""


class SplitEvaluator:
  """Loss and translation quality of one split, reusable at every evaluation."""

  def __init__(self, *, name: str, batches: list[dict[str, np.ndarray]],
               pairs: Sequence[tuple[str, str]], eval_step: Callable, translate: Callable | None,
               tokenizer: Tokenizer, mesh: Mesh):
    """
    Args:
      name: the split's name in metrics ('eval', 'test').
      batches: this process's batches of the split, all of the same shape.
      pairs: every (source, reference) text pair of the split, in order (all processes).
      eval_step: (params, global batch) -> loss sums, jitted.
      translate: (params, global inputs [B, S]) -> token ids [B, L] of the best hypothesis,
        replicated; None to skip BLEU.
      tokenizer: to detokenize hypotheses.
      mesh: the training mesh.
    """
    self.name, self.batches, self.pairs = name, batches, list(pairs)
    self.eval_step, self.translate, self.tokenizer = eval_step, translate, tokenizer
    self.sharding = sharding_lib.batch_sharding(mesh)

  def loss_metrics(self, params: Any) -> dict[str, float]:
    """Per-token 'loss', 'nll', 'accuracy' over every real target token of the split."""
    totals = None
    for batch in self.batches:
      sums = self.eval_step(params, sharding_lib.global_batch(batch, self.sharding))
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    return metrics_lib.reduce_metrics(jax.device_get(totals))

  def translations(self, params: Any) -> list[str]:
    """The detokenized best translation of every pair of the split, in the split's order."""
    outputs = []  # Per global batch: [P * b, L] ids, rows of process 0 first.
    for batch in self.batches:
      inputs = sharding_lib.global_batch({"inputs": batch["inputs"]}, self.sharding)["inputs"]
      outputs.append(np.asarray(jax.device_get(self.translate(params, inputs))))
    return [self._detokenize(ids) for ids in self._in_split_order(outputs)]

  def _in_split_order(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
    processes = jax.process_count()
    per_process = math.ceil(len(self.pairs) / processes)
    # [num_batches, P, b, L] -> [P, num_batches * b, L]: each process's block in order.
    stacked = np.stack(outputs).reshape(len(outputs), processes, -1, outputs[0].shape[-1])
    blocks = np.swapaxes(stacked, 0, 1).reshape(processes, -1, outputs[0].shape[-1])
    rows = []
    for p in range(processes):
      real = max(0, min(per_process, len(self.pairs) - p * per_process))
      rows.extend(blocks[p, :real])
    return rows

  def _detokenize(self, ids: np.ndarray) -> str:
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    return self.tokenizer.decode([i for i in ids if i > EOS_ID])

  def run(self, params: Any, step: int, writer: metrics_lib.MetricWriter,
          num_examples: int = 0) -> SplitResult:
    """Computes and writes the split's metrics; logs `num_examples` example translations."""
    scalars, examples = self.loss_metrics(params), ""
    if self.translate is not None:
      from flax_transformer.evaluate import score_translations

      hypotheses = self.translations(params)
      scores = score_translations(hypotheses, [ref for _, ref in self.pairs])
      scalars.update(bleu=float(scores["bleu"]), chrf=float(scores["chrf"]))
      examples = _examples(self.pairs, hypotheses, num_examples)
      if examples:
        writer.write_text(step, f"{self.name}/examples", examples.replace("\n", "  \n"))
        logging.info("%s examples at step %d:\n%s", self.name, step, examples)
    writer.write(step, self.name, scalars)
    logging.info("%s at step %d: %s", self.name, step,
                 " | ".join(f"{k} {v:.4g}" for k, v in scalars.items()))
    return SplitResult(scalars, examples)


def _examples(pairs: Sequence[tuple[str, str]], hypotheses: Sequence[str], count: int) -> str:
  lines = []
  for (source, reference), hypothesis in list(zip(pairs, hypotheses, strict=True))[:count]:
    lines += [f"  source:    {source}", f"  reference: {reference}", f"  output:    {hypothesis}"]
  return "\n".join(lines)


def make_translate(model: Any, mesh: Mesh, param_shardings: Any, *, beam_size: int,
                   max_decode_len: int, length_penalty: float,
                   grow_cache: str = "auto") -> Callable:
  """(params, inputs [B, S]) -> best hypotheses [B, L], jitted over `mesh`, replicated out.

  Uses `flax_transformer.predict.translate_ids` (cached beam search with shared cross-attention);
  `grow_cache` is "auto", "yes" or "no" (`predict.GROW_CACHE_SETTINGS`).
  """
  from flax_transformer.predict import GROW_CACHE_SETTINGS, translate_ids

  def best(params, inputs):
    sequences, _ = translate_ids(
        model, {"params": params}, inputs, beam_size=beam_size, max_decode_len=max_decode_len,
        length_penalty=length_penalty, eos_id=EOS_ID,
        grow_cache=GROW_CACHE_SETTINGS[grow_cache])
    return sequences  # [B, L], the best hypothesis

  return jax.jit(
      best,
      in_shardings=(param_shardings, sharding_lib.batch_sharding(mesh)),
      out_shardings=sharding_lib.replicated(mesh))
