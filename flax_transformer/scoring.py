"""Translation quality with sacreBLEU: corpus BLEU and chrF with their signatures.

One function, `score_translations`, serves the training loop's periodic evaluation, the
`flax-transformer evaluate` command and the tests, so every reported number is computed the same
way: detokenized, cased text, sacreBLEU's default 13a tokenizer, one reference per sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
  """Corpus-level BLEU and chrF of `hypotheses` against one reference each.

  Args:
    hypotheses: detokenized system outputs, one per sentence.
    references: detokenized references, line-aligned with `hypotheses`.

  Returns:
    {"bleu": float, "chrf": float, "bleu_signature": str, "chrf_signature": str,
     "bleu_details": str (n-gram precisions, brevity penalty, lengths), "num_sentences": int}.
    Scores are in [0, 100].

  Raises:
    ValueError: if the two lists differ in length, or an item is not a string.
  """
  if len(hypotheses) != len(references):
    raise ValueError(
        f"score_translations: {len(hypotheses)} hypotheses but {len(references)} references; "
        "they must be line-aligned (one reference per hypothesis).")
  for name, texts in (("hypotheses", hypotheses), ("references", references)):
    for index, text in enumerate(texts):
      if not isinstance(text, str):
        raise ValueError(
            f"score_translations: {name}[{index}] is {type(text).__name__}, expected str.")
  bleu, chrf = BLEU(), CHRF()
  bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
  chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
  return {
      "bleu": float(bleu_score.score),
      "chrf": float(chrf_score.score),
      "bleu_signature": str(bleu.get_signature()),
      "chrf_signature": str(chrf.get_signature()),
      "bleu_details": str(bleu_score),
      "num_sentences": len(hypotheses),
  }


def summary(scores: dict[str, Any]) -> str:
  """Two lines for people: BLEU and chrF with their signatures."""
  return (f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})\n"
          f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})")
