"""Terminology constraints on a real test set: quality, coverage and cost.

Takes one content word from each reference as its term, chosen (a) first, (b) last or (c) at
random (seeded) among the reference's content words: words (`data.words.split_words`) of at
least --min_chars characters, not in a short list of German function words, that the
vocabulary can spell. The terms come from the reference, so this measures what a glossary that
knows the answer can add; the "last" choice is the case fairseq's stop rule got wrong (a
sentence-final term). Then, in one process with every program compiled first:

  * BLEU and chrF (sacreBLEU, cased; and BLEU lc.norm.tok) of the unconstrained and the
    constrained beam search, for each choice;
  * the share of lines whose output holds their term as a whole word (`data.words`);
  * wall seconds of `Translator.translate` over the split, unconstrained against constrained,
    alternating, --repeats each; the medians and their ratio.

Prints one JSON line per measurement and a closing summary line per choice.

  python benchmarks/quality/terminology_constraints.py --workdir W \
      [--src test.en.gz --ref test.de.gz | --data_dir ../shared/data/multi30k] \
      [--choices first,last,random] [--terms_from own|next] [--beam_size 4] [--repeats 3]
      [--limit N]

--terms_from next takes each line's term from the next line's reference (the last line's from
the first's): a term the translation has no reason to hold, which the search must place
somewhere; there a term placed inside a word cut that word (issue 89 item 3).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import time
from pathlib import Path

from flax_transformer import Translator
from flax_transformer.data import UNK_ID, words
from flax_transformer.scoring import score_translations

FUNCTION_WORDS = frozenset((
    "der", "die", "das", "den", "dem", "des", "ein", "eine", "einer", "einem", "einen", "eines",
    "und", "oder", "mit", "ohne", "in", "im", "ins", "auf", "an", "am", "zu", "zum", "zur", "von",
    "vom", "vor", "hinter", "neben", "unter", "über", "bei", "beim", "aus", "nach", "durch", "für",
    "gegen", "um", "ist", "sind", "war", "hat", "haben", "wird", "werden", "sich", "sie", "er",
    "es", "ihr", "ihre", "ihren", "seine", "seinen", "seiner", "sein", "noch", "nicht", "auch",
    "als", "wie", "dass", "während", "etwas", "einige", "viele", "zwei", "drei", "vier", "andere",
    "anderen", "anderer",
))


def read(path: Path) -> list[str]:
  """The lines of a text file, gzipped or not."""
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8") as lines:
    return [line.rstrip("\n") for line in lines]


def choose_terms(references: list[str], spellable, choice: str, min_chars: int,
                 seed: int = 0) -> list[list[str]]:
  """One content word of each reference (module docstring); [] where it has none."""
  rng = random.Random(seed)
  terms = []
  for reference in references:
    content = [w for w in words.split_words(reference) if len(w) >= min_chars
               and w.lower() not in FUNCTION_WORDS and spellable(w)]
    if not content:
      terms.append([])
      continue
    pick = {"first": 0, "last": len(content) - 1}.get(choice)
    terms.append([content[rng.randrange(len(content)) if pick is None else pick]])
  return terms


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--src", type=Path, help="Source lines (plain or .gz).")
  parser.add_argument("--ref", type=Path, help="Reference lines (plain or .gz).")
  parser.add_argument("--data_dir", default="../shared/data/multi30k",
                      help="Without --src/--ref: DATA_DIR/SPLIT.{source,target}_lang.gz.")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--source_lang", default="en")
  parser.add_argument("--target_lang", default="de")
  parser.add_argument("--choices", default="first,last,random")
  parser.add_argument("--min_chars", type=int, default=4)
  parser.add_argument("--terms_from", choices=("own", "next"), default="own",
                      help="Each line's own reference, or the next line's.")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--limit", type=int, default=None, help="Only the first N lines.")
  args = parser.parse_args()
  data = Path(args.data_dir)
  sources = read(args.src or data / f"{args.split}.{args.source_lang}.gz")[:args.limit]
  references = read(args.ref or data / f"{args.split}.{args.target_lang}.gz")[:args.limit]
  translator = Translator.from_workdir(args.workdir, beam_size=args.beam_size)
  vocab = translator.tokenizer
  spellable = lambda word: UNK_ID not in vocab.tokenize_target(word)
  emit = lambda **fields: print(json.dumps(fields), flush=True)

  def run(constraints=None):
    outputs, start = [""] * len(sources), time.perf_counter()
    for batch in translator.iter_nbest(sources, 1, constraints=constraints):
      for i, hypotheses in zip(batch.indices, batch.hypotheses, strict=True):
        outputs[i] = hypotheses[0][0]
    return outputs, time.perf_counter() - start

  def quality(name, outputs, terms, seconds):
    scores = score_translations(outputs, references, target_lang=args.target_lang)
    holding = [words.holds_words(o, t) for o, t in zip(outputs, terms, strict=True) if t]
    emit(kind="quality", variant=name, bleu=round(scores["bleu"], 2),
         chrf=round(scores["chrf"], 2), bleu_lc_norm_tok=round(scores["bleu_lc_norm_tok"], 2),
         lines_holding_their_term_as_a_word=round(sum(holding) / max(1, len(holding)), 4),
         first_run_seconds=round(seconds, 2))
    return scores

  plain, seconds = run()  # The first run compiles.
  for choice in args.choices.split(","):
    given = references if args.terms_from == "own" else references[1:] + references[:1]
    terms = choose_terms(given, spellable, choice, args.min_chars)
    emit(kind="terms", choice=choice, lines=len(terms), lines_with_terms=sum(map(bool, terms)),
         example=terms[:3])
    base = quality(f"unconstrained ({choice} terms)", plain, terms, seconds)
    constrained, first = run(terms)
    scores = quality(f"constrained ({choice})", constrained, terms, first)
    times = {"unconstrained": [], "constrained": []}
    for _ in range(args.repeats):
      for name, constraints, expected in (("unconstrained", None, plain),
                                          ("constrained", terms, constrained)):
        outputs, took = run(constraints)
        assert outputs == expected, f"{name}: a repeat translated differently"
        times[name].append(took)
    median = {name: statistics.median(values) for name, values in times.items()}
    emit(kind="summary", choice=choice, lines=len(sources), beam_size=args.beam_size,
         bleu_unconstrained=round(base["bleu"], 2), bleu_constrained=round(scores["bleu"], 2),
         unchanged_lines=sum(a == b for a, b in zip(plain, constrained, strict=True)),
         unconstrained_seconds=round(median["unconstrained"], 2),
         constrained_seconds=round(median["constrained"], 2),
         constrained_over_unconstrained=round(median["constrained"] / median["unconstrained"], 3))


if __name__ == "__main__":
  main()
