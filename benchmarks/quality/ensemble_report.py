"""BLEU and speed of one checkpoint, the average of the last K, and the ensemble of the last K.

Issue 33's report: on a trained workdir (e.g. `configs/multi30k_en_de.py:cpu` with close
checkpoints), runs `flax-transformer evaluate` on one split for three variants, each a new
process through the CLI as a user would:

  single    --checkpoint WORKDIR/checkpoints/S                       (the last checkpoint)
  average   --checkpoint WORKDIR/averaged/step_S_last_K              (`average --last K`)
  ensemble  --checkpoint WORKDIR/checkpoints/S1 ... --checkpoint .../S  (the last K, one search)

The averaged checkpoint is written first when absent (`flax-transformer average --workdir W
--last K`). Every call uses a compilation cache of its own (a new temporary folder), filled by
one warm-up round (reported as `first_wall_s`: it compiles); then --repeats rounds alternate the
variants, so a drift in the shared machine's speed hits each alike. Per variant: BLEU and chrF
(sacreBLEU, as `evaluate --json` prints them; the same every round or it raises), the median
wall seconds of the whole command (process start, restore and search), the median of the CLI's
own "Translated N sentences in T s" (the search alone, after the restore), and sentences/s of
each. Prints one JSON line per call and a closing Markdown table.

  python benchmarks/quality/ensemble_report.py --workdir /tmp/m30k_ens \
      [--data_dir ../shared/data/multi30k] [--split test_2016_flickr] [--last 4] \
      [--beam_size 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_TRANSLATED = re.compile(r"Translated (\d+) sentences in ([\d.]+) s")


def cli() -> list[str]:
  """The `flax-transformer` command of this Python's environment."""
  beside = Path(sys.executable).with_name("flax-transformer")
  if beside.exists():
    return [str(beside)]
  return [shutil.which("flax-transformer") or "flax-transformer"]


def checkpoint_steps(workdir: Path) -> list[int]:
  """The steps of WORKDIR/checkpoints/<step>, ascending."""
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def averaged_checkpoint(workdir: Path, last: int) -> Path:
  """WORKDIR/averaged/step_S_last_K, written by `flax-transformer average` when absent."""
  path = workdir / "averaged" / f"step_{checkpoint_steps(workdir)[-1]}_last_{last}"
  if not path.exists():
    subprocess.run([*cli(), "average", "--workdir", str(workdir), "--last", str(last)],
                   check=True)
  return path


def plain_text(data_dir: Path, split: str, lang: str, folder: Path) -> Path:
  """DATA_DIR/SPLIT.LANG.gz decompressed into `folder` (the CLI reads plain files)."""
  path = folder / f"{split}.{lang}"
  with gzip.open(data_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
    path.write_text(f.read(), encoding="utf-8")
  return path


def run(arguments: list[str], cache: Path) -> dict:
  """Runs the CLI with `arguments`; returns wall seconds, the CLI's own search seconds and
  stdout. Raises with the command's stderr when it fails."""
  command = [*cli(), *arguments, "--compilation_cache_dir", str(cache)]
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if done.returncode:
    raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
  found = _TRANSLATED.search(done.stderr)
  return dict(wall_s=wall, search_s=float(found.group(2)) if found else None,
              sentences=int(found.group(1)) if found else None, stdout=done.stdout)


def checkpoint_flags(paths: list[Path]) -> list[str]:
  return [flag for path in paths for flag in ("--checkpoint", str(path))]


def alternate(variants: dict[str, list[str]], cache: Path,
              repeats: int) -> dict[str, list[dict]]:
  """One warm-up round (index 0, compiles into `cache`), then `repeats` rounds, each running
  every variant once in order; returns each variant's results in round order. "{round}" in an
  argument becomes the round's index (a new output file per call: translate resumes a job
  whose output exists)."""
  results: dict[str, list[dict]] = {name: [] for name in variants}
  for round_index in range(repeats + 1):
    for name, arguments in variants.items():
      result = run([a.replace("{round}", str(round_index)) for a in arguments], cache)
      result.update(variant=name, round=round_index)
      results[name].append(result)
      print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                        for k, v in result.items() if k != "stdout"}), flush=True)
  return results


def timing(results: list[dict], lines: int) -> dict:
  """Medians over the measured rounds (not the warm-up) and the warm-up's wall time."""
  measured = results[1:]
  wall = statistics.median(r["wall_s"] for r in measured)
  searches = [r["search_s"] for r in measured if r["search_s"] is not None]
  search = statistics.median(searches) if searches else float("nan")
  return dict(first_wall_s=results[0]["wall_s"], wall_s=wall, search_s=search,
              walls=[round(r["wall_s"], 1) for r in measured],
              sentences_per_s=lines / wall, search_sentences_per_s=lines / search)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", default="../shared/data/multi30k",
                      help="holds SPLIT.SRC.gz and SPLIT.TGT.gz")
  parser.add_argument("--split", default="test_2016_flickr")
  parser.add_argument("--source_lang", default="en")
  parser.add_argument("--target_lang", default="de")
  parser.add_argument("--last", type=int, default=4, help="K: checkpoints averaged/ensembled")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3, help="measured rounds after warm-up")
  args = parser.parse_args()

  workdir = Path(args.workdir)
  steps = checkpoint_steps(workdir)[-args.last:]
  if len(steps) < args.last:
    raise SystemExit(f"{workdir}/checkpoints has {len(steps)} checkpoints, fewer than "
                     f"--last {args.last}.")
  last = [workdir / "checkpoints" / str(step) for step in steps]
  members = {"single": last[-1:], "average": [averaged_checkpoint(workdir, args.last)],
             "ensemble": last}
  with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    src = plain_text(Path(args.data_dir), args.split, args.source_lang, folder)
    ref = plain_text(Path(args.data_dir), args.split, args.target_lang, folder)
    lines = len(src.read_text(encoding="utf-8").splitlines())
    variants = {name: ["evaluate", *checkpoint_flags(paths), "--src", str(src), "--ref",
                       str(ref), "--beam_size", str(args.beam_size), "--json"]
                for name, paths in members.items()}
    results = alternate(variants, folder / "xla_cache", args.repeats)

  rows = []
  for name, runs in results.items():
    scores = [json.loads(r["stdout"]) for r in runs]
    if len({(s["bleu"], s["chrf"]) for s in scores}) != 1:
      raise RuntimeError(f"{name}: scores differ between rounds: {scores}")
    rows.append(dict(variant=name, bleu=scores[0]["bleu"], chrf=scores[0]["chrf"],
                     **timing(runs, lines)))
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                      for k, v in rows[-1].items()}), flush=True)
  described = {"single": f"step {steps[-1]}",
               "average": f"mean params of {', '.join(map(str, steps))}",
               "ensemble": ", ".join(map(str, steps))}
  print(f"\n{args.split}, {lines} lines, beam {args.beam_size}, checkpoints "
        f"{', '.join(map(str, steps))}; medians of {args.repeats} rounds after a warm-up\n")
  print("| variant | checkpoints | BLEU | chrF | wall s | sentences/s | search s | "
        "search sentences/s | first call (compiles) s |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for row in rows:
    print(f"| {row['variant']} | {described[row['variant']]} | {row['bleu']:.2f} | "
          f"{row['chrf']:.2f} | {row['wall_s']:.1f} | {row['sentences_per_s']:.1f} | "
          f"{row['search_s']:.1f} | {row['search_sentences_per_s']:.1f} | "
          f"{row['first_wall_s']:.1f} |")

if __name__ == "__main__":
  main()
