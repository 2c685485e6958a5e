"""Evaluation during training: loss/accuracy over a whole split, and BLEU/chrF of its translation.

The loss runs over the data pipeline's eval batches: every process holds a contiguous block of
the split's pairs as equal-sized batches, and batch j of all processes forms one global batch
split over the mesh. The translations come from the serving path itself, a `Translator` on the
training mesh with the experiment's `config.search` settings, so the BLEU logged here is the
BLEU `flax-transformer evaluate` reports for the same checkpoint and split.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from flax_transformer.runtime import sharding as sharding_lib
from flax_transformer.scoring import score_translations
from flax_transformer.serving.translator import Translator
from flax_transformer.training import metrics as metrics_lib


@dataclasses.dataclass
class SplitResult:
  """The metrics of one evaluation of a split, and a few example translations as text."""

  scalars: dict[str, float]
  examples: str = ""


class SplitEvaluator:
  """Loss and translation quality of one split, reusable at every evaluation."""

  def __init__(self, *, name: str, batches: list[dict[str, np.ndarray]],
               pairs: Sequence[tuple[str, str]], eval_step: Callable,
               translator: Translator | None, mesh: Mesh, target_lang: str | None = None):
    """
    Args:
      name: the split's name in metrics ('eval', 'test').
      batches: this process's batches of the split, all of the same shape.
      pairs: every (source, reference) text pair of the split, in order (all processes).
      eval_step: (params, global batch) -> loss sums, jitted.
      translator: translates with the params it is given at each evaluation; None: no BLEU.
      mesh: the training mesh.
      target_lang: the references' language: BLEU in the lc.norm.tok variant too
        ('bleu_lc_norm_tok', `scoring.score_translations`).
    """
    self.name, self.batches, self.pairs = name, batches, list(pairs)
    self.eval_step, self.translator, self.target_lang = eval_step, translator, target_lang
    self.sharding = sharding_lib.batch_sharding(mesh)

  def loss_metrics(self, params: Any) -> dict[str, float]:
    """Per-token 'loss', 'nll', 'accuracy' over every real target token of the split."""
    totals = None
    for batch in self.batches:
      sums = self.eval_step(params, sharding_lib.global_batch(batch, self.sharding))
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    return metrics_lib.reduce_metrics(jax.device_get(totals))

  def translations(self, params: Any) -> list[str]:
    """The best translation of every source of the split, in the split's order."""
    return self.translator.translate([source for source, _ in self.pairs], params=params)

  def run(self, params: Any, step: int, writer: metrics_lib.MetricWriter,
          num_examples: int = 0) -> SplitResult:
    """Computes and writes the split's metrics; logs `num_examples` example translations."""
    scalars, examples = self.loss_metrics(params), ""
    if self.translator is not None:
      hypotheses = self.translations(params)
      scores = score_translations(hypotheses, [ref for _, ref in self.pairs],
                                  target_lang=self.target_lang)
      scalars.update(bleu=float(scores["bleu"]), chrf=float(scores["chrf"]))
      if "bleu_lc_norm_tok" in scores:
        scalars["bleu_lc_norm_tok"] = float(scores["bleu_lc_norm_tok"])
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
