"""Terminology constraints on a real test set (issue 41): quality, coverage and cost.

Takes one or two content words from each reference (as Post & Vilar 2018 and Hu et al. 2019
did: the terms come from the reference, so this measures what a glossary that knows the
answer can add, not what a real glossary would): the words of the reference without
punctuation, at least 4 characters long and not in a short list of German function words,
of which a seeded RNG picks one or two (two where it can, with probability 1/2), kept in
reference order, leaving out any the vocabulary cannot spell. Then, in one process with every
program compiled first:

  * BLEU and chrF (sacreBLEU, cased; and BLEU lc.norm.tok) of the unconstrained and the
    constrained beam search, unordered and ordered;
  * the share of lines whose output holds all their terms, as target pieces (what the search
    guarantees where the length cap allows) and as whole words;
  * wall seconds of `Translator.translate` over the split, unconstrained against constrained
    (unordered), alternating, --repeats each; the medians and their ratio.

Prints one JSON line per measurement and a closing summary line.

  python benchmarks/quality/terminology_constraints.py --workdir /work/runs/mini_s0 \
      [--data_dir ../shared/data/multi30k] [--split test_2016_flickr] [--beam_size 4] \
      [--repeats 3] [--limit N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import statistics
import time
from pathlib import Path

from flax_transformer import Translator
from flax_transformer.data import UNK_ID
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
  with gzip.open(path, "rt", encoding="utf-8") as lines:
    return [line.rstrip("\n") for line in lines]


def choose_terms(references: list[str], spellable, seed: int = 0) -> list[list[str]]:
  """One or two content words of each reference, in reference order (module docstring)."""
  rng = random.Random(seed)
  terms = []
  for reference in references:
    words = [re.sub(r"^[^\w]+|[^\w]+$", "", word) for word in reference.split()]
    content = list(dict.fromkeys(w for w in words if len(w) >= 4
                                 and w.lower() not in FUNCTION_WORDS and spellable(w)))
    count = min(len(content), 2 if rng.random() < 0.5 else 1)
    chosen = set(rng.sample(content, count))
    terms.append([w for w in content if w in chosen])
  return terms


def holds_words(text: str, terms: list[str]) -> bool:
  words = [re.sub(r"^[^\w]+|[^\w]+$", "", word) for word in text.split()]
  return all(term in words for term in terms)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", default="../shared/data/multi30k")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--source_lang", default="en")
  parser.add_argument("--target_lang", default="de")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--limit", type=int, default=None, help="Only the first N lines.")
  args = parser.parse_args()
  data = Path(args.data_dir)
  sources = read(data / f"{args.split}.{args.source_lang}.gz")[:args.limit]
  references = read(data / f"{args.split}.{args.target_lang}.gz")[:args.limit]
  translator = Translator.from_workdir(args.workdir, beam_size=args.beam_size)
  vocab = translator.tokenizer
  spellable = lambda word: UNK_ID not in vocab.tokenize_target(word)
  terms = choose_terms(references, spellable)
  emit = lambda **fields: print(json.dumps(fields), flush=True)
  emit(kind="terms", lines=len(terms), terms=sum(map(len, terms)),
       lines_with_terms=sum(1 for t in terms if t), example=terms[:3])

  def run(constraints=None, order="unordered"):
    outputs, met, start = [""] * len(sources), [True] * len(sources), time.perf_counter()
    for batch in translator.iter_nbest(sources, 1, constraints=constraints,
                                       constraint_order=order):
      for i, hypotheses, holds in zip(batch.indices, batch.hypotheses,
                                      batch.constraints_met or [[True]] * len(batch.indices),
                                      strict=True):
        outputs[i], met[i] = hypotheses[0][0], holds[0]
    return outputs, met, time.perf_counter() - start

  results = {}
  for name, constraints, order in (("unconstrained", None, "unordered"),
                                   ("constrained", terms, "unordered"),
                                   ("constrained_ordered", terms, "ordered")):
    outputs, met, seconds = run(constraints, order)  # The first run compiles.
    scores = score_translations(outputs, references, target_lang=args.target_lang)
    results[name] = outputs
    emit(kind="quality", variant=name, bleu=round(scores["bleu"], 2),
         chrf=round(scores["chrf"], 2), bleu_lc_norm_tok=round(scores["bleu_lc_norm_tok"], 2),
         lines_holding_all_terms_as_pieces=None if constraints is None else sum(met) / len(met),
         lines_holding_all_terms_as_words=sum(holds_words(o, t) for o, t in
                                              zip(outputs, terms, strict=True)) / len(terms),
         first_run_seconds=round(seconds, 2))
  times = {"unconstrained": [], "constrained": []}
  for _ in range(args.repeats):
    for name, constraints in (("unconstrained", None), ("constrained", terms)):
      outputs, _, seconds = run(constraints)
      assert outputs == results[name], f"{name}: a repeat translated differently"
      times[name].append(seconds)
      emit(kind="time", variant=name, seconds=round(seconds, 3))
  median = {name: statistics.median(values) for name, values in times.items()}
  emit(kind="summary", lines=len(sources), beam_size=args.beam_size,
       unconstrained_seconds=round(median["unconstrained"], 2),
       constrained_seconds=round(median["constrained"], 2),
       constrained_over_unconstrained=round(median["constrained"] / median["unconstrained"], 3))


if __name__ == "__main__":
  main()
