"""BLEU, chrF and length ratio of one checkpoint under every finishing rule and normalization.

Translates each split with greedy decoding and with beam search for every (finish_rule,
length_normalization, length_penalty) combination, all from one `Translator` (same weights,
same batching), and prints one JSON line per (split, setting) and a closing Markdown table.
Scores: sacreBLEU BLEU (13a) and chrF, as `flax-transformer evaluate` computes them; the length
ratio is the hypotheses' token count over the references' (BLEU's sys_len / ref_len).

  python benchmarks/quality/search_quality.py --workdir runs/m30k \
      --data_dir ../shared/data/multi30k [--splits val,test_2016_flickr] \
      [--length_penalties 0.6,1.0] [--beam_size 4]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import time
from pathlib import Path

from sacrebleu.metrics import BLEU

from flax_transformer import Translator
from flax_transformer.decoding.search import FINISH_RULES, LENGTH_NORMALIZATIONS
from flax_transformer.scoring import score_translations


def _read(path: Path) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def _settings(beam_size: int, alphas: list[float]) -> list[dict]:
  """Greedy, then beam `beam_size` for every rule x normalization x alpha, then beam 1."""
  rows = [dict(method="greedy")]
  for rule, norm, alpha in itertools.product(FINISH_RULES, LENGTH_NORMALIZATIONS, alphas):
    rows.append(dict(method="beam", beam_size=beam_size, finish_rule=rule,
                     length_normalization=norm, length_penalty=alpha))
  rows += [dict(method="beam", beam_size=1, finish_rule=rule) for rule in FINISH_RULES]
  return rows


def _label(setting: dict) -> str:
  if setting["method"] == "greedy":
    return "greedy"
  if setting["beam_size"] == 1:
    return f"beam 1, {setting['finish_rule']}"
  return (f"beam {setting['beam_size']}, {setting['finish_rule']}, "
          f"{setting['length_normalization']} α {setting['length_penalty']}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", required=True, help="holds SPLIT.SRC.gz and SPLIT.TGT.gz")
  parser.add_argument("--source_lang", default="en")
  parser.add_argument("--target_lang", default="de")
  parser.add_argument("--splits", default="val,test_2016_flickr")
  parser.add_argument("--length_penalties", default="0.6,1.0")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--max_sentences", type=int, default=None, help="first N lines only")
  args = parser.parse_args()

  translator = Translator.from_workdir(args.workdir)
  settings = _settings(args.beam_size, [float(a) for a in args.length_penalties.split(",")])
  table: dict[str, dict[str, dict]] = {}
  for split in args.splits.split(","):
    sources = _read(Path(args.data_dir) / f"{split}.{args.source_lang}.gz")[:args.max_sentences]
    references = _read(Path(args.data_dir) / f"{split}.{args.target_lang}.gz")[
        :args.max_sentences]
    for setting in settings:
      start = time.perf_counter()
      hypotheses = translator.translate(sources, **setting)
      seconds = time.perf_counter() - start
      scores = score_translations(hypotheses, references)
      bleu = BLEU().corpus_score(hypotheses, [references])
      row = dict(split=split, setting=_label(setting), **setting, bleu=round(scores["bleu"], 2),
                 chrf=round(scores["chrf"], 2), length_ratio=round(bleu.sys_len / bleu.ref_len, 3),
                 empty_lines=sum(not h for h in hypotheses), seconds=round(seconds, 1))
      print(json.dumps(row, ensure_ascii=False), flush=True)
      table.setdefault(row["setting"], {})[split] = row
  splits = args.splits.split(",")
  print("\n| decoder | " + " | ".join(f"{s} BLEU | chrF | len ratio" for s in splits) + " |")
  print("|---|" + "---:|---:|---:|" * len(splits))
  for label, by_split in table.items():
    cells = [f"{by_split[s]['bleu']:.2f} | {by_split[s]['chrf']:.2f} | "
             f"{by_split[s]['length_ratio']:.3f}" for s in splits]
    print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
