"""The TPU plans of docs/performance.md: the shipped WMT14 configs (and the notebook's) compiled
for TPU slices by `flax_transformer.planning`, on this CPU, with per-chip memory, fit and FLOPs, at
the config's batch and at the largest data.batch_tokens that fits (found by bisection).

  pip install -e ".[tpu]"
  python benchmarks/profiling/tpu_plan_table.py --results runs/tpu_plans.jsonl        # every row
  python benchmarks/profiling/tpu_plan_table.py --only big --chips v5e:2x4 --no-largest  # a few

Every compile is appended to --results as one JSON line, and read back on a rerun, so a killed
run continues where it stopped (a base or big train step takes 1 to 5 minutes to compile on a
2-core CPU). The largest batch: memory grows about linearly with the batch, so the first guess
is where the line through the config's batch meets the chip's HBM; then bisection between a
batch that fits and one that does not, in whole rows per chip, until they are within 10%.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from flax_transformer import planning  # noqa: E402
from flax_transformer.experiment_flags import config_from_flags  # noqa: E402

CONFIGS = {
    "base": "configs/wmt14_en_de_base.py:bf16",
    "big": "configs/wmt14_en_de_big.py:bf16",
    "notebook": "configs/default.py",
}
TOPOLOGIES = ("v5e:2x4", "v5:2x2x1", "v6e:2x4", "v4:2x2x1")
SLICE_NAMES = {"v5e:2x4": "v5e-8", "v5:2x2x1": "v5p-8", "v6e:2x4": "v6e-8", "v4:2x2x1": "v4-8",
               "v5e:1x1": "v5e-1 (Colab)"}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--results", default="runs/tpu_plans.jsonl")
  parser.add_argument("--only", nargs="*", default=["base", "big", "notebook"],
                      choices=sorted(CONFIGS))
  parser.add_argument("--chips", nargs="*", default=list(TOPOLOGIES))
  parser.add_argument("--fsdp", nargs="*", default=["False", "True"])
  parser.add_argument("--no-largest", dest="largest", action="store_false")
  args = parser.parse_args()
  results = Path(args.results)
  results.parent.mkdir(parents=True, exist_ok=True)
  done = _read(results)
  print("| config | slice | fsdp | batch_tokens | HBM per chip | of | fits | compiler TFLOP/step "
        "| model TFLOP/step | compile s |")
  print("|---|---|---|---:|---:|---:|---|---:|---:|---:|")
  for name in args.only:
    topologies = ("v5e:1x1",) if name == "notebook" else args.chips
    for topology in topologies:
      for fsdp in (["False"] if name == "notebook" else args.fsdp):
        overrides = {"train.fsdp": fsdp}
        row = _plan(name, topology, overrides, None, done, results)
        _print(row)
        if args.largest:
          _print(_largest(name, topology, overrides, row, done, results), largest=True)


def _plan(name: str, topology: str, overrides: dict, batch_tokens: int | None, done: dict,
          results: Path) -> dict:
  """One compile (or its earlier result from `results`)."""
  settings = dict(overrides)
  if batch_tokens is not None:
    settings["data.batch_tokens"] = str(batch_tokens)
  key = json.dumps([name, topology, sorted(settings.items())])
  if key in done:
    return done[key]
  argv = [f"--config={REPO / CONFIGS[name]}", *(f"--config.{k}={v}" for k, v in settings.items())]
  config = config_from_flags(argv)
  parsed = planning.parse_topology(topology)
  plan = planning.plan_train(config, planning.topology_devices(parsed), parsed)
  row = {"key": key, "config": name, "topology": topology, "fsdp": settings["train.fsdp"],
         "batch_tokens": config.data.batch_tokens, "plan": planning.as_json([plan])[0]}
  with results.open("a") as sink:
    sink.write(json.dumps(row) + "\n")
  done[key] = row
  return row


def _largest(name: str, topology: str, overrides: dict, first: dict, done: dict,
             results: Path) -> dict:
  """The largest batch_tokens that fits, in whole rows per chip, within 10%."""
  plan = first["plan"]
  unit = plan["settings"]["max_length"] * plan["num_chips"]  # One row per chip.
  rows = first["batch_tokens"] // unit
  memory = plan["total_bytes"]
  fits_at, fails_at = (rows, None) if plan["fits"] else (0, rows)
  if plan["memory"] is not None:  # A line through (0, state + code) and (rows, total).
    fixed = plan["memory"]["arguments"] + plan["memory"]["code"]
    per_row = max(1.0, (memory - fixed) / rows)
    guess = int((plan["chip_memory"] - fixed) / per_row)
  else:
    guess = rows // 2
  best = first if plan["fits"] else None
  tried = {rows}
  while True:
    guess = max(1, guess)
    if fails_at is not None:
      guess = min(guess, fails_at - 1)
    guess = max(guess, fits_at + 1)
    if (fails_at is not None and guess >= fails_at) or guess in tried:
      break
    tried.add(guess)
    row = _plan(name, topology, overrides, guess * unit, done, results)
    if row["plan"]["fits"]:
      fits_at, best = guess, row
    else:
      fails_at = guess
    if fails_at is not None and fits_at and fails_at <= math.ceil(fits_at * 1.1):
      break
    guess = (fits_at + fails_at) // 2 if fails_at is not None else math.ceil(fits_at * 1.25)
  if best is None:
    return {"config": name, "topology": topology, "fsdp": overrides["train.fsdp"],
            "batch_tokens": 0, "plan": None}
  return best


def _print(row: dict, largest: bool = False) -> None:
  plan = row["plan"]
  slice_name = SLICE_NAMES.get(row["topology"], row["topology"])
  label = f"largest {row['batch_tokens']:,}" if largest else f"{row['batch_tokens']:,}"
  if plan is None:
    print(f"| {row['config']} | {slice_name} | {row['fsdp']} | {label} | none fits | | | | | |")
    return
  total = plan["total_bytes"] if plan["total_bytes"] is not None else plan["needed"]
  hbm = f"{total / 2**30:.2f} GiB" if total else "?"
  compiler = "" if plan["compiler_flops"] is None else f"{plan['compiler_flops'] / 1e12:.2f}"
  print(f"| {row['config']} | {slice_name} | {row['fsdp']} | {label} | {hbm} | "
        f"{plan['chip_memory'] / 2**30:.0f} GiB | {'yes' if plan['fits'] else 'no'} | {compiler} | "
        f"{plan['model_flops'] / 1e12:.2f} | {plan['compile_seconds']:.0f} |", flush=True)


def _read(results: Path) -> dict:
  done = {}
  if results.exists():
    for line in results.read_text().splitlines():
      if line.strip():
        row = json.loads(line)
        done[row["key"]] = row
  return done


if __name__ == "__main__":
  main()
