"""Peak memory of `flax-transformer translate` against the input's size: bulk jobs must not grow.

Writes input files of N lines (synthetic source sentences, `flax_transformer.data.synthetic`,
the pair configs/default.py trains on), runs the translate command on each in a subprocess,
and reads that process's peak resident set size from `os.wait4` (ru_maxrss). One JSON line per
size: lines, wall seconds, peak RSS (MiB), sentences/s.

  python train.py --config=configs/default.py --workdir=/tmp/bulkbench/default
  python benchmarks/speed/translate_memory.py --workdir /tmp/bulkbench/default \\
      --lines 10000 1000000 --flags --method greedy

`--python_path DIR` runs another checkout's command instead (e.g. the commit before bulk jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # This checkout's package, not an installed one.

from flax_transformer.data.synthetic import sample_pair  # noqa: E402


def write_input(path: Path, lines: int, seed: int = 0) -> None:
  """`lines` synthetic source sentences, written in blocks (never all in memory)."""
  rng = random.Random(seed)
  partial = path.with_suffix(".partial")
  with partial.open("w") as f:
    for start in range(0, lines, 10_000):
      f.write("".join(sample_pair(rng)[0] + "\n" for _ in range(min(10_000, lines - start))))
  partial.rename(path)


def run(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
  """(seconds, peak RSS in MiB, exit status) of one subprocess."""
  start = time.perf_counter()
  process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
  _, status, usage = os.wait4(process.pid, 0)
  return time.perf_counter() - start, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="A trained workdir (configs/default.py).")
  parser.add_argument("--lines", type=int, nargs="+", default=[10_000, 1_000_000])
  parser.add_argument("--tmp", default="/tmp/bulkbench/memory", help="Inputs and outputs.")
  parser.add_argument("--python_path", default=None, help="Run this checkout's command.")
  parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[],
                      help="More `translate` flags (the rest of the command line).")
  args = parser.parse_args()
  tmp = Path(args.tmp)
  tmp.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=args.python_path or str(REPO))
  for lines in args.lines:
    source, output = tmp / f"in_{lines}.txt", tmp / f"out_{lines}.txt"
    if not source.exists():
      write_input(source, lines)
    command = [sys.executable, "-m", "flax_transformer.cli", "translate", "--workdir",
               args.workdir, "--input", str(source), "--output", str(output), *args.flags]
    seconds, peak_mib, status = run(command, env)
    print(json.dumps({"lines": lines, "seconds": round(seconds, 1),
                      "peak_rss_mib": round(peak_mib, 1), "exit": status,
                      "sentences_per_s": round(lines / seconds, 1),
                      "python_path": args.python_path, "flags": args.flags}), flush=True)


if __name__ == "__main__":
  main()
