"""Translation quality with sacreBLEU: corpus BLEU and chrF with their signatures.

One function, `score_translations`, serves the training loop's periodic evaluation, the
`flax-transformer evaluate` command and the tests, so every reported number is computed the same
way: detokenized, cased text, sacreBLEU's default 13a tokenizer, one reference per sentence.

Given the target language it also gives the variant that papers report on Multi30k,
"lc.norm.tok": hypotheses and references lowercased, punctuation-normalized and
Moses-tokenized (`lc_norm_tok`, the shared task's `scripts/task1-tokenize.sh`), then BLEU on
whitespace tokens, as `multi-bleu.perl` computes it on the official tokenized files.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from flax_transformer.errors import InputError
from flax_transformer.files import check_line_aligned

LC_NORM_TOK = "lc.norm.tok"  # The label of the second BLEU, in its signature and JSON key.
# normalize-punctuation.perl at Moses 3a0631a (which made the official files) differs from
# today's script, which sacremoses ports, in two rules (`lc_norm_tok`).
_APOSTROPHE = re.compile(r"([a-z])[‘’]([a-z])", re.IGNORECASE)
_STOP_BEFORE_QUOTE = re.compile(r'(\.+)"')
_QUOTES_AFTER_STOP = ("en", "cs", "cz")  # Languages whose full stop stays before a quote.


@functools.cache
def _moses(lang: str):
  from sacremoses import MosesPunctNormalizer, MosesTokenizer

  return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def lc_norm_tok(texts: Sequence[str], lang: str) -> list[str]:
  """`texts` as the Multi30k shared task's `lc.norm.tok` files are made.

  `lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG` from Moses at
  commit 3a0631a, through sacremoses (a maintained Python port of today's Moses scripts, so no
  Perl is needed). Two rules of the old normalize-punctuation.perl are applied around it:
  a curly single quote is an apostrophe only between two ASCII letters and a double quote
  otherwise ("d’œil" -> `d &quot; œil`; today's script makes it an apostrophe), and outside
  English and Czech a full stop moves after a closing double quote at the end of a sentence too
  (`tea."` -> `tea &quot; .`; today's leaves it). Tokens are escaped as Moses escapes them
  (`&apos;`, `&quot;`, `&amp;`, ...). With these, the raw val and test2016 references (en, de,
  fr) give the official files line for line (tests/test_scoring.py).

  >>> lc_norm_tok(['Ein Schild: „What’s gayer than tea.“'], "de")
  ['ein schild : &quot; what &apos; s gayer than tea &quot; .']
  """
  normalizer, tokenizer = _moses(lang)
  out = []
  for text in texts:
    text = _APOSTROPHE.sub(r"\1'\2", text.lower()).replace("‘", '"').replace("’", '"')
    text = normalizer.normalize(text)
    if lang not in _QUOTES_AFTER_STOP:
      text = _STOP_BEFORE_QUOTE.sub(r'"\1', text)
    out.append(tokenizer.tokenize(text, escape=True, return_str=True))
  return out


def score_translations(hypotheses: Sequence[str], references: Sequence[str], *,
                       target_lang: str | None = None) -> dict[str, Any]:
  """Corpus-level BLEU and chrF of `hypotheses` against one reference each.

  Args:
    hypotheses: detokenized system outputs, one per sentence.
    references: detokenized references, line-aligned with `hypotheses`.
    target_lang: their language ("de", "fr", ...): also BLEU in the lc.norm.tok variant.

  Returns:
    {"bleu": float, "chrf": float, "bleu_signature": str, "chrf_signature": str, "bleu_details":
    str (n-gram precisions, brevity penalty, lengths), "num_sentences": int}, and with
    `target_lang` "bleu_lc_norm_tok" and "bleu_lc_norm_tok_signature" (both sides through
    `lc_norm_tok`, BLEU on whitespace tokens without smoothing, as multi-bleu.perl).
    Scores are in [0, 100].

  Raises:
    ValueError: if the two lists differ in length, or an item is not a string.
  """
  check_line_aligned({"hypotheses": len(hypotheses), "references": len(references)})
  for name, texts in (("hypotheses", hypotheses), ("references", references)):
    for index, text in enumerate(texts):
      if not isinstance(text, str):
        raise InputError(
            f"score_translations: {name}[{index}] is {type(text).__name__}, expected str.")
  bleu, chrf = BLEU(), CHRF()
  bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
  chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
  scores = {
      "bleu": float(bleu_score.score),
      "chrf": float(chrf_score.score),
      "bleu_signature": str(bleu.get_signature()),
      "chrf_signature": str(chrf.get_signature()),
      "bleu_details": str(bleu_score),
      "num_sentences": len(hypotheses),
  }
  if target_lang:
    # force: both sides are Moses-tokenized on purpose, so sacreBLEU's warning that the
    # hypotheses look tokenized ("That's 100 lines that end in a tokenized period") is noise.
    # It changes nothing else, the signature included.
    tokenized = BLEU(tokenize="none", smooth_method="none", force=True)
    score = tokenized.corpus_score(lc_norm_tok(hypotheses, target_lang),
                                   [lc_norm_tok(references, target_lang)])
    scores["bleu_lc_norm_tok"] = float(score.score)
    scores["bleu_lc_norm_tok_signature"] = f"{lc_norm_tok_label(target_lang)}|" + str(
        tokenized.get_signature())
  return scores


def lc_norm_tok_label(lang: str) -> str:
  """The fixed label of the lc.norm.tok variant: what made both sides' tokens."""
  import sacremoses

  return f"{LC_NORM_TOK}:{lang}|moses:3a0631a|sacremoses:{sacremoses.__version__}"


def summary(scores: dict[str, Any]) -> str:
  """Lines for people: BLEU and chrF with their signatures (and lc.norm.tok BLEU if scored)."""
  lines = [f"BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})",
           f"chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})"]
  if "bleu_lc_norm_tok" in scores:
    lines.append(f"BLEU {scores['bleu_lc_norm_tok']:.2f}  "
                 f"({scores['bleu_lc_norm_tok_signature']})")
  return "\n".join(lines)


__all__ = ["LC_NORM_TOK", "lc_norm_tok", "lc_norm_tok_label", "score_translations", "summary"]
