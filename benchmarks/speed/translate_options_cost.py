"""The cost of `translate --alignments`, `--target_prefix` and a 2-model ensemble (issue 33).

On a trained workdir, translates one split with `flax-transformer translate` (a new process per
call, as a user runs it), beam --beam_size, in four variants:

  plain          --checkpoint WORKDIR/checkpoints/S              (the last checkpoint)
  alignments     the same, plus --alignments FILE                (word alignments written)
  ensemble of 2  --checkpoint .../checkpoints/S' --checkpoint .../checkpoints/S (the last two)
  target_prefix  the same as plain, plus --target_prefix FILE    (each reference's first word)

Timing as benchmarks/quality/ensemble_report.py (whose helpers it uses): a compilation cache of its
own, one warm-up round that compiles, then --repeats rounds alternating the variants; medians of the
whole command's wall seconds and of the CLI's own "Translated N sentences in T s". Then checks what
came out of the last round: that --alignments leaves the translations unchanged, that every pair i-j
names a word inside its source and output line (and how many output words are aligned), that every
prefixed output starts with its prefix; prints sacreBLEU BLEU of each variant and a few alignment
lines. Prints one JSON line per call and a closing Markdown table.

  python benchmarks/speed/translate_options_cost.py --workdir /tmp/m30k_ens \
      [--data_dir ../shared/data/multi30k] [--split test_2016_flickr] [--beam_size 4] \
      [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

# benchmarks/quality/ensemble_report.py, whose timing this shares.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quality"))
from ensemble_report import (
    alternate,
    checkpoint_flags,
    checkpoint_steps,
    plain_text,
    timing,
)

from flax_transformer.scoring import score_translations


def _lines(path: Path) -> list[str]:
  return path.read_text(encoding="utf-8").splitlines()


def check_alignments(sources: list[str], outputs: list[str], alignments: list[str]) -> dict:
  """Counts of alignment lines, pairs, pairs out of range, and output words left unaligned."""
  if len(alignments) != len(outputs):
    raise RuntimeError(f"{len(alignments)} alignment lines for {len(outputs)} outputs.")
  pairs = out_of_range = unaligned = words = 0
  for source, output, line in zip(sources, outputs, alignments, strict=True):
    s, t = len(source.split()), len(output.split())
    aligned = set()
    for pair in line.split():
      i, j = map(int, pair.split("-"))
      pairs += 1
      out_of_range += not (0 <= i < s and 0 <= j < t)
      aligned.add(j)
    words += t
    unaligned += t - len(aligned & set(range(t)))
  return dict(lines=len(alignments), pairs=pairs, out_of_range=out_of_range,
              target_words=words, unaligned_target_words=unaligned)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", default="../shared/data/multi30k",
                      help="holds SPLIT.SRC.gz and SPLIT.TGT.gz")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--source_lang", default="en")
  parser.add_argument("--target_lang", default="de")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3, help="measured rounds after warm-up")
  parser.add_argument("--show", type=int, default=3, help="alignment lines to print")
  args = parser.parse_args()

  workdir = Path(args.workdir)
  steps = checkpoint_steps(workdir)[-2:]
  last_two = [workdir / "checkpoints" / str(step) for step in steps]
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    src = plain_text(Path(args.data_dir), args.split, args.source_lang, folder)
    ref = plain_text(Path(args.data_dir), args.split, args.target_lang, folder)
    sources, references = _lines(src), _lines(ref)
    prefixes = [line.split()[0] if line.split() else "" for line in references]
    prefix_file = folder / "prefix.txt"
    prefix_file.write_text("".join(f"{p}\n" for p in prefixes), encoding="utf-8")

    def out(name: str) -> str:
      return str(folder / f"{name}_{{round}}.txt")

    common = ["--input", str(src), "--beam_size", str(args.beam_size)]
    variants = {
        "plain": ["translate", *checkpoint_flags(last_two[-1:]), *common, "--output", out("plain")],
        "alignments": ["translate", *checkpoint_flags(last_two[-1:]), *common,
                       "--output", out("alignments"), "--alignments", out("align")],
        "ensemble of 2": ["translate", *checkpoint_flags(last_two), *common,
                          "--output", out("ensemble")],
        "target_prefix": ["translate", *checkpoint_flags(last_two[-1:]), *common,
                          "--output", out("prefix"), "--target_prefix", str(prefix_file)],
    }
    results = alternate(variants, folder / "xla_cache", args.repeats)

    final = str(args.repeats)
    outputs = {name: _lines(folder / f"{stem}_{final}.txt") for name, stem in
               (("plain", "plain"), ("alignments", "alignments"),
                ("ensemble of 2", "ensemble"), ("target_prefix", "prefix"))}
    alignments = _lines(folder / f"align_{final}.txt")

  checks = dict(
      alignments_change_nothing=outputs["alignments"] == outputs["plain"],
      alignment=check_alignments(sources, outputs["alignments"], alignments),
      outputs_missing_their_prefix=sum(
          not o.startswith(p) for o, p in zip(outputs["target_prefix"], prefixes, strict=True)),
      bleu={name: round(score_translations(hyps, references)["bleu"], 2)
            for name, hyps in outputs.items()})
  print(json.dumps(checks, ensure_ascii=False))
  for index in range(args.show):
    print(f"\nsource: {sources[index]}\noutput: {outputs['alignments'][index]}\n"
          f"alignment: {alignments[index]}")

  plain = timing(results["plain"], len(sources))
  print(f"\n{args.split}, {len(sources)} lines, beam {args.beam_size}, checkpoints "
        f"{', '.join(map(str, steps))}; medians of {args.repeats} rounds after a warm-up\n")
  print("| variant | wall s | sentences/s | x plain | search s | search sentences/s | "
        "x plain | first call (compiles) s | BLEU |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  for name, runs in results.items():
    t = timing(runs, len(sources))
    print(f"| {name} | {t['wall_s']:.1f} | {t['sentences_per_s']:.1f} | "
          f"{t['wall_s'] / plain['wall_s']:.2f} | {t['search_s']:.1f} | "
          f"{t['search_sentences_per_s']:.1f} | {t['search_s'] / plain['search_s']:.2f} | "
          f"{t['first_wall_s']:.1f} | {checks['bleu'][name]:.2f} |")


if __name__ == "__main__":
  main()
