"""lc.norm.tok BLEU, the variant papers report on Multi30k (`scoring.lc_norm_tok`).

The pipeline must give the shared task's official tokenized files (`lowercase.perl |
normalize-punctuation.perl | tokenizer.perl` from Moses 3a0631a, in ../shared/data/multi30k/tok)
from the raw references, line for line; BLEU is then computed on whitespace tokens, checked
against a hand-written corpus BLEU. The cased sacreBLEU is tested in test_decoding_bridge.py.
"""

import gzip
from pathlib import Path

import pytest

from flax_transformer.scoring import lc_norm_tok, score_translations, summary

import numpy_reference as ref

MULTI30K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "multi30k"
# The official files sit beside the repository in its workspace and CI; a clone elsewhere skips.
needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(),
                                    reason=f"Multi30k not found at {MULTI30K}")
FILES = [(split, lang) for split in ("val", "test_2016_flickr") for lang in ("en", "de", "fr")]


def _lines(path: Path) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return f.read().splitlines()


@pytest.mark.parametrize("split, lang", FILES)
@needs_multi30k
def test_the_raw_references_give_the_official_tokenized_files(split, lang):
  """Every line of the six official files (1014 or 1000 each), and so BLEU 100 between them."""
  raw = _lines(MULTI30K / f"{split}.{lang}.gz")
  official = _lines(MULTI30K / "tok" / f"{split}.lc.norm.tok.{lang}.gz")
  ours = lc_norm_tok(raw, lang)
  assert len(ours) == len(official) == len(raw) > 0
  different = [(i, a, b) for i, (a, b) in enumerate(zip(ours, official, strict=True)) if a != b]
  assert not different, different[:3]


@pytest.mark.parametrize("text, lang, expected", [
    # Escaping, as tokenizer.perl escapes.
    ('A "big" dog & a cat\'s <toy>.', "en",
     "a &quot; big &quot; dog &amp; a cat &apos;s &lt; toy &gt; ."),
    # normalize-punctuation.perl: German quotes become ", and outside English a full stop
    # moves after the closing quote, at the end of a sentence too (Moses 3a0631a).
    ("Er sagt: „Komm.“", "de", "er sagt : &quot; komm &quot; ."),
    ('Il dit "Viens."', "fr", "il dit &quot; viens &quot; ."),
    # In English a full stop or comma after a closing quote moves inside it.
    ('He says "come", then "go".', "en", "he says &quot; come , &quot; then &quot; go . &quot;"),
    # A curly quote between two ASCII letters is an apostrophe; otherwise a double quote.
    ("Un coup d’œil, l’homme.", "fr", "un coup d &quot; œil , l&apos; homme ."),
])
def test_moses_rules(text, lang, expected):
  assert lc_norm_tok([text], lang) == [expected]


@needs_multi30k
def test_lc_norm_tok_bleu_is_whitespace_bleu_of_the_tokenized_text():
  references = _lines(MULTI30K / "test_2016_flickr.de.gz")[:200]
  # Systems that differ from the references in case, punctuation and words.
  hypotheses = [r.upper() if i % 3 == 0 else r.replace(".", " .").replace("ein", "der")
                for i, r in enumerate(references)]
  scores = score_translations(hypotheses, references, target_lang="de")
  expected = ref.bleu(lc_norm_tok(hypotheses, "de"), lc_norm_tok(references, "de"))
  assert scores["bleu_lc_norm_tok"] == pytest.approx(expected, abs=1e-9)
  # Lowercasing makes the upper-cased third count: above the cased score.
  assert scores["bleu_lc_norm_tok"] > scores["bleu"] + 10
  assert scores["bleu_lc_norm_tok_signature"].startswith("lc.norm.tok:de|moses:3a0631a|")
  assert "tok:none" in scores["bleu_lc_norm_tok_signature"]
  assert "lc.norm.tok:de" in summary(scores).splitlines()[2]
  official = _lines(MULTI30K / "tok" / "test_2016_flickr.lc.norm.tok.de.gz")[:200]
  assert ref.bleu(official, lc_norm_tok(references, "de")) == pytest.approx(100.0)


def test_without_a_language_only_the_cased_scores():
  scores = score_translations(["Ein Hund ."], ["Ein Hund ."])
  assert "bleu_lc_norm_tok" not in scores and len(summary(scores).splitlines()) == 2


@needs_multi30k
def test_lc_norm_tok_scoring_prints_no_detokenize_warning(caplog, capsys):
  # The tokenized side is tokenized on purpose: sacreBLEU's "forgot to detokenize" warning
  # (three lines on stderr whenever 100 hypotheses end in " .") would be noise in every score.
  references = _lines(MULTI30K / "test_2016_flickr.de.gz")[:150]
  with caplog.at_level("WARNING"):
    score_translations(references, references, target_lang="de")
  assert not [r for r in caplog.records if r.name.startswith("sacrebleu")]
  assert "detokenize" not in capsys.readouterr().err
