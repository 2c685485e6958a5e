"""Issue 43's protocol for one trained Multi30k workdir: every choice on val, then test2016.

The candidates are the final checkpoint and the average of the last K checkpoints for each K of
`--last` (made with `average_checkpoints` when missing); each is translated on val with every
(beam size, length normalization, length penalty) of `--beam_sizes` x `--length_normalizations`
x `--length_penalties`. The setting with the best val BLEU in the lc.norm.tok variant (the
papers' metric; cased sacreBLEU breaks ties) is then scored on test2016, once, in both metrics.
The final checkpoint with the config's own search settings is scored on test2016 too, so the
gain of the selection is visible.

  python benchmarks/quality/multi30k_select.py --workdir runs/mini_s0 \
      --data_dir ../shared/data/multi30k [--last 5 10] [--beam_sizes 4 5] \
      [--length_penalties 0.6 1.0 1.4] [--length_normalizations gnmt fairseq] [--target_lang de]

Prints one JSON line per scored (candidate, split, setting) and a closing Markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import time
from pathlib import Path

from flax_transformer import Translator, score_translations
from flax_transformer.workdir import average_checkpoints, saved_steps


def _read(path: Path) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def _candidates(workdir: Path, lasts: list[int]) -> dict[str, Path]:
  """'final' and 'last_K' for each K the workdir keeps enough checkpoints for."""
  steps = saved_steps(workdir)
  found = {"final": workdir / "checkpoints" / str(steps[-1])}
  for k in lasts:
    if k <= len(steps):
      averaged = workdir / "averaged" / f"step_{steps[-1]}_last_{k}"
      found[f"last_{k}"] = averaged if averaged.exists() else average_checkpoints(workdir, k)
  return found


def _score(translator: Translator, sources: list[str], references: list[str], target_lang: str,
           **settings) -> dict:
  start = time.perf_counter()
  hypotheses = translator.translate(sources, **settings)
  scores = score_translations(hypotheses, references, target_lang=target_lang)
  return {"bleu": round(scores["bleu"], 2), "bleu_lc_norm_tok": round(
      scores["bleu_lc_norm_tok"], 2), "chrf": round(scores["chrf"], 2),
      "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", type=Path, required=True)
  parser.add_argument("--data_dir", type=Path, required=True)
  parser.add_argument("--source_lang", default="en")
  parser.add_argument("--target_lang", default="de")
  parser.add_argument("--last", type=int, nargs="+", default=[5, 10])
  parser.add_argument("--beam_sizes", type=int, nargs="+", default=[4, 5])
  parser.add_argument("--length_penalties", type=float, nargs="+", default=[0.6, 1.0, 1.4])
  parser.add_argument("--length_normalizations", nargs="+", default=["gnmt"],
                      choices=["gnmt", "fairseq"],
                      help="gnmt: ((5 + m) / 6) ** alpha; fairseq: m ** alpha (fairseq's "
                           "--lenpen, Wu et al.'s search at alpha 1.0).")
  parser.add_argument("--batch_tokens", type=int, default=8192)
  parser.add_argument("--max_sentences", type=int, default=None,
                      help="Only the first N of each split (a quick check of the plumbing).")
  args = parser.parse_args()
  files = [args.data_dir / f"{name}.{lang}.gz" for name in ("val", "test_2016_flickr")
           for lang in (args.source_lang, args.target_lang)]
  if missing := [str(f) for f in files if not f.is_file()]:
    parser.error(f"--data_dir: no {', '.join(missing)} (Multi30k's gzipped val and test2016 "
                 "files, as in ../shared/data/multi30k).")
  if not (args.workdir / "checkpoints").is_dir():
    parser.error(f"--workdir: {args.workdir} has no checkpoints/ folder.")

  def split(name: str) -> tuple[list[str], list[str]]:
    return (_read(args.data_dir / f"{name}.{args.source_lang}.gz")[:args.max_sentences],
            _read(args.data_dir / f"{name}.{args.target_lang}.gz")[:args.max_sentences])

  val, test = split("val"), split("test_2016_flickr")
  rows = []

  def record(candidate: str, split_name: str, settings: dict, scores: dict) -> None:
    row = {"benchmark": "multi30k_select", "workdir": str(args.workdir), "candidate": candidate,
           "split": split_name, **settings, **scores}
    rows.append(row)
    print(json.dumps(row), flush=True)

  translators = {}
  for name, folder in _candidates(args.workdir, args.last).items():
    translators[name] = Translator.from_workdir(args.workdir, checkpoint=folder,
                                                batch_tokens=args.batch_tokens)
    for beam, norm, alpha in itertools.product(args.beam_sizes, args.length_normalizations,
                                               args.length_penalties):
      settings = {"beam_size": beam, "length_normalization": norm, "length_penalty": alpha}
      record(name, "val", settings, _score(translators[name], *val, args.target_lang,
                                           **settings))
  best = max((row for row in rows if row["split"] == "val"),
             key=lambda row: (row["bleu_lc_norm_tok"], row["bleu"]))
  settings = {key: best[key] for key in ("beam_size", "length_normalization", "length_penalty")}
  record(best["candidate"], "test_2016_flickr (chosen on val)", settings,
         _score(translators[best["candidate"]], *test, args.target_lang, **settings))
  record("final", "test_2016_flickr (config's search)", {},
         _score(translators["final"], *test, args.target_lang))

  print("\n| candidate | split | beam | normalization | alpha | BLEU lc.norm.tok | BLEU cased |"
        " chrF |")
  print("|---|---|---:|---|---:|---:|---:|---:|")
  for row in rows:
    print(f"| {row['candidate']} | {row['split']} | {row.get('beam_size', 'config')} | "
          f"{row.get('length_normalization', 'config')} | "
          f"{row.get('length_penalty', 'config')} | {row['bleu_lc_norm_tok']:.2f} | "
          f"{row['bleu']:.2f} | {row['chrf']:.2f} |")


if __name__ == "__main__":
  main()
