"""Several seeds' Multi30k selections side by side: each seed's choice on val, its test2016
scores, and the mean and spread over the seeds, per selection grid.

Reads what `multi30k_select.py` prints (one JSON line per scored setting; its closing table is
skipped), one file per (seed, protocol): the output of, for each seed's workdir,

  python benchmarks/quality/multi30k_select.py --workdir runs/mini7k_s0 ... | tee select_s0.log

  python benchmarks/quality/multi30k_seeds.py select_s0.log select_s1.log select_s2.log

Files that tried different grids (windows x beams x normalizations x length penalties) are
reported in separate tables, so that a mean never mixes two protocols. Prints Markdown.

A lever against the recipe, on val: `--against select_s1.log select_lever_s1.log` gives, per
file, its val lc.norm.tok minus the base's at each point of the grid both tried (min / max /
mean, and the mean per candidate), and each one's best point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

CHOSEN = "test_2016_flickr (chosen on val)"
SETTINGS = ("beam_size", "length_normalization", "length_penalty")


_FIELDS = ("workdir", "candidate", "split", "bleu_lc_norm_tok")


def _selection_rows(path: Path) -> list[dict]:
  """The JSON lines multi30k_select.py printed to `path`. Raises ValueError naming the file and
  line of one that is not JSON or lacks a field the reports read."""
  rows = []
  for number, line in enumerate(path.read_text().splitlines(), start=1):
    if line.startswith("{"):
      try:
        row = json.loads(line)
      except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {number}: not JSON ({error.msg}).") from None
      if row.get("benchmark") == "multi30k_select":
        missing = [name for name in _FIELDS if name not in row]
        if missing:
          raise ValueError(f"{path}, line {number}: no {', '.join(missing)} field.")
        rows.append(row)
  return rows


def _point(row: dict) -> tuple:
  """A row's point of the selection grid: (candidate, beam, normalization, length penalty)."""
  return (row["candidate"], *(row.get(name) for name in SETTINGS))


def read_selection(path: Path) -> dict:
  """One selection run: its workdir, grid, chosen (candidate, settings), the chosen setting's
  val and test scores. Raises ValueError naming the file if it holds no finished selection."""
  rows = _selection_rows(path)
  chosen = [row for row in rows if row["split"] == CHOSEN]
  if len(chosen) != 1 or len({row["workdir"] for row in rows}) != 1:
    raise ValueError(f"{path}: expected the JSON lines of one finished multi30k_select run "
                     f"(one '{CHOSEN}' line), found {len(chosen)} such lines.")
  [test] = chosen
  val_rows = [row for row in rows if row["split"] == "val"]
  val = [row for row in val_rows if _point(row) == _point(test)]
  if len(val) != 1:
    raise ValueError(f"{path}: {len(val)} val lines for the setting chosen on val, "
                     f"{_point(test)}; expected 1.")
  val = val[0]
  grid = (tuple(sorted({row["candidate"] for row in val_rows})),
          *(tuple(sorted({row[name] for row in val_rows})) for name in SETTINGS))
  return {"workdir": test["workdir"], "grid": grid, "candidate": test["candidate"],
          "settings": {name: test[name] for name in SETTINGS}, "val": val, "test": test}


def val_grid(path: Path) -> dict[tuple, float]:
  """Val lc.norm.tok per (candidate, beam, normalization, length penalty) of one selection."""
  return {_point(row): row["bleu_lc_norm_tok"] for row in _selection_rows(path)
          if row["split"] == "val"}


def compare_grids(base: dict[tuple, float], other: dict[tuple, float]) -> dict:
  """`other` minus `base` at the points both tried: min, max, mean, the mean per candidate,
  and each grid's best point. Raises ValueError when they share no point."""
  shared = [key for key in base if key in other]
  if not shared:
    raise ValueError("the two selections share no point of the val grid.")
  differences = [other[key] - base[key] for key in shared]
  per_candidate = {}
  for candidate in dict.fromkeys(key[0] for key in shared):
    values = [other[key] - base[key] for key in shared if key[0] == candidate]
    per_candidate[candidate] = statistics.fmean(values)
  best = lambda grid: max(grid.items(), key=lambda item: item[1])
  return {"points": len(shared), "min": min(differences), "max": max(differences),
          "mean": statistics.fmean(differences), "per_candidate": per_candidate,
          "best_base": best(base), "best_other": best(other)}


def comparison_report(base_path: Path, paths: list[Path]) -> str:
  """Markdown: a row per file, its val grid against `base_path`'s."""
  base = val_grid(base_path)
  if not base:
    raise ValueError(f"{base_path}: no val lines of multi30k_select.")
  out = [f"Val lc.norm.tok minus {base_path}'s, at the grid points both tried:\n",
         "| selection | points | min / max / mean | mean per candidate | best point |",
         "|---|---:|---|---|---|"]
  for path in paths:
    other = val_grid(path)
    try:
      c = compare_grids(base, other)
    except ValueError as error:
      raise ValueError(f"{path} against {base_path}: {error}") from None
    (candidate, beam, normalization, alpha), score = c["best_other"]
    out.append(f"| {path} | {c['points']} | {c['min']:+.2f} / {c['max']:+.2f} / "
               f"{c['mean']:+.2f} | " + ", ".join(
                   f"{name} {value:+.2f}" for name, value in c["per_candidate"].items()) +
               f" | {score:.2f} ({candidate}, beam {beam}, {normalization} {alpha}) |")
  (candidate, beam, normalization, alpha), score = c["best_base"]
  out.append(f"\nThe base's best point: {score:.2f} ({candidate}, beam {beam}, "
             f"{normalization} {alpha}).")
  return "\n".join(out)


def _spread(values: list[float]) -> str:
  mean = statistics.fmean(values)
  if len(values) == 1:
    return f"{mean:.2f}"
  return (f"{mean:.2f} (min {min(values):.2f}, max {max(values):.2f}, "
          f"sd {statistics.stdev(values):.2f})")


def report(selections: list[dict]) -> str:
  """Markdown: one table per grid, a row per seed, then the mean over its seeds."""
  grids: dict[tuple, list[dict]] = {}
  for selection in selections:
    grids.setdefault(selection["grid"], []).append(selection)
  out = []
  for grid, group in grids.items():
    candidates, beams, normalizations, alphas = grid
    out.append(f"Grid: {', '.join(candidates)} x beam {list(beams)} x "
               f"{list(normalizations)} x alpha {list(alphas)}\n")
    out.append("| workdir | chosen on val | val lc.norm.tok / cased | test2016 lc.norm.tok "
               "| test2016 cased |")
    out.append("|---|---|---:|---:|---:|")
    for s in group:
      setting = (f"{s['candidate']}, beam {s['settings']['beam_size']}, "
                 f"{s['settings']['length_normalization']} {s['settings']['length_penalty']}")
      out.append(f"| {s['workdir']} | {setting} | {s['val']['bleu_lc_norm_tok']:.2f} / "
                 f"{s['val']['bleu']:.2f} | {s['test']['bleu_lc_norm_tok']:.2f} | "
                 f"{s['test']['bleu']:.2f} |")
    out.append(f"| **mean of {len(group)}** | | "
               f"{statistics.fmean(s['val']['bleu_lc_norm_tok'] for s in group):.2f} / "
               f"{statistics.fmean(s['val']['bleu'] for s in group):.2f} | "
               f"{_spread([s['test']['bleu_lc_norm_tok'] for s in group])} | "
               f"{_spread([s['test']['bleu'] for s in group])} |\n")
  return "\n".join(out)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("logs", type=Path, nargs="+", help="multi30k_select.py's output, one "
                      "file per seed and protocol")
  parser.add_argument("--against", type=Path, metavar="BASE_LOG",
                      help="print each log's val grid minus this selection's instead")
  args = parser.parse_args()
  try:
    if args.against:
      print(comparison_report(args.against, args.logs))
      return
    selections = [read_selection(path) for path in args.logs]
  except (OSError, ValueError) as error:
    parser.exit(2, f"multi30k_seeds: {error}\n")
  print(report(selections))


if __name__ == "__main__":
  main()
