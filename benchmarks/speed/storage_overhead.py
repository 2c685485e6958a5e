"""What a gs:// workdir costs against a local one, side by side in one run, on a GCS emulator on
127.0.0.1 (fake-gcs-server from the [test] extra; tests/gcs_emulator.py starts it).

python benchmarks/speed/storage_overhead.py                      # 2 rounds, alternating local / gs://
python benchmarks/speed/storage_overhead.py --rounds 3 --steps 300 --lines 3000

Training: `train.py --config=configs/default.py` (its model; evaluation off) for --steps steps,
a checkpoint (async) every --save_every steps, a metrics line every 25, into a local workdir
and into gs://; the time of a step is the median of the logged `seconds_per_step` over the
steps after the first log line (compilation excluded), checkpoint saves and metric uploads
included; plus the wall time of the whole process. Bulk translation: the trained workdir's
latest checkpoint translates --lines synthetic sentences (beam 4) local -> local, and with
workdir, input and output all on gs:// -> gs://; the time is the CLI's own "Translated N
sentences in X s" (restore and search), plus the process's wall time. Rounds alternate local
and gs:// so drift on a shared machine moves both, after a warm-up run of each that fills the
compilation cache (not counted). Prints one JSON line per measurement and a
summary line with the ratios (gs:// / local).

The emulator is a local process: this measures our overhead (uploads, listings, the lease, the
rewritten metrics log) and the client libraries', not a real bucket's latency or bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from gcs_emulator import GcsEmulator  # noqa: E402

BUCKET = "bench"


def _train(workdir: str, tfds: Path, cache: Path, args: argparse.Namespace) -> dict:
  command = [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs/default.py'}",
             f"--workdir={workdir}", f"--config.train.num_train_steps={args.steps}",
             f"--config.train.warmup_steps={min(200, args.steps // 2)}",
             "--config.train.log_every_steps=25", "--config.eval.eval_every_steps=0",
             "--config.eval.translate=False", "--config.eval.test_at_end=False",
             f"--config.checkpoint.save_every_steps={args.save_every}",
             f"--config.data.tfds_data_dir={tfds}", f"--compilation_cache_dir={cache}"]
  start = time.perf_counter()
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  wall = time.perf_counter() - start
  if result.returncode:
    raise SystemExit(f"train.py failed: {result.stderr[-2000:]}")
  from flax_transformer import files

  lines = [json.loads(line) for line in
           files.to_path(f"{workdir}/metrics.jsonl").read_text().splitlines()]
  per_step = [m["value"] for m in lines if m["name"] == "seconds_per_step"][1:]
  return {"seconds_per_step": statistics.median(per_step), "wall_s": wall}


def _translate(workdir: str, source: str, output: str, cache: Path) -> dict:
  command = [sys.executable, "-m", "flax_transformer.cli", "translate", "--workdir", workdir,
             "--input", source, "--output", output, "--beam_size", "4",
             "--compilation_cache_dir", str(cache)]
  start = time.perf_counter()
  result = subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
  wall = time.perf_counter() - start
  seconds = float(re.search(r"Translated \d+ sentences in ([\d.]+) s", result.stderr).group(1))
  return {"translate_s": seconds, "wall_s": wall}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--save_every", type=int, default=50)
  parser.add_argument("--lines", type=int, default=2000)
  args = parser.parse_args()
  scratch = Path(tempfile.mkdtemp(prefix="storage_bench_"))
  emulator = GcsEmulator(scratch / "fake-gcs-server.log")
  os.environ.update(emulator.environment)
  emulator.create_bucket(BUCKET)
  from flax_transformer import files
  from flax_transformer.data import synthetic

  rng = random.Random(0)
  text = [synthetic.sample_pair(rng)[0] for _ in range(args.lines)]
  files.write_lines_atomically(str(scratch / "in.txt"), text)
  files.write_lines_atomically(f"gs://{BUCKET}/in.txt", text)
  tfds, cache = scratch / "tfds", scratch / "xla"
  results: dict[str, list[dict]] = {}
  try:
    # Warm-up, not counted: the compilation cache gets the train step and the search programs.
    _train(str(scratch / "warmup"), tfds, cache, args)
    _translate(str(scratch / "warmup"), str(scratch / "in.txt"), str(scratch / "warmup.txt"),
               cache)
    for round_index in range(args.rounds):
      for kind in ("local", "gs"):
        root = str(scratch) if kind == "local" else f"gs://{BUCKET}"
        workdir = f"{root}/run_{round_index}"
        record = {"what": "train", "storage": kind, "round": round_index,
                  **_train(workdir, tfds, cache, args)}
        print(json.dumps(record), flush=True)
        results.setdefault(f"train_{kind}", []).append(record)
        record = {"what": "translate", "storage": kind, "round": round_index,
                  **_translate(workdir, f"{root}/in.txt",
                               f"{root}/out_{round_index}.txt", cache)}
        print(json.dumps(record), flush=True)
        results.setdefault(f"translate_{kind}", []).append(record)
  finally:
    emulator.stop()
  summary = {"what": "summary", "rounds": args.rounds}
  for what, key in (("train", "seconds_per_step"), ("train", "wall_s"),
                    ("translate", "translate_s"), ("translate", "wall_s")):
    local = statistics.median(r[key] for r in results[f"{what}_local"])
    remote = statistics.median(r[key] for r in results[f"{what}_gs"])
    summary[f"{what}_{key}_local"], summary[f"{what}_{key}_gs"] = local, remote
    summary[f"{what}_{key}_gs_over_local"] = remote / local
  print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  main()
