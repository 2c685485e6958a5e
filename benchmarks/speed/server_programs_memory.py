"""The resident memory of `flax-transformer serve` while requests ask for ever new search
settings, under each --max_programs: bounded, it stays flat; unbounded, it grows by one
compiled program per setting.

Each request is `POST /v1/translate` of one sentence with `"method": "sample"` and its own
`top_k` (1, 2, 3, ...): a static setting, so every request compiles a program of its own. One
client, one request at a time, so every program is compiled (nothing else is measured). Every
--every requests the server's RSS (psutil, the server process) is read, and the time of a
request with the server's own settings (whose programs are always kept: it must not compile
again). One JSON line per reading, per --max_programs value, in one run.

  python benchmarks/speed/server_programs_memory.py --workdir W --requests 60 \\
      --max_programs 8 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
SENTENCE = "a man is walking down the street ."


def start(workdir: str, max_programs: int) -> tuple[subprocess.Popen, str]:
  """A `serve` process on a free port of 127.0.0.1 and its address, once it is ready."""
  command = [sys.executable, "-m", "flax_transformer.cli", "serve", "--workdir", workdir,
             "--port", "0", "--max_programs", str(max_programs)]
  process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
  line = process.stdout.readline()
  if "ready at " not in line:
    process.kill()
    raise SystemExit(f"serve did not start: {line!r}")
  return process, line.split("ready at ")[1].split()[0]


def measure(workdir: str, max_programs: int, requests: int, every: int) -> list[dict]:
  process, address = start(workdir, max_programs)
  rss = lambda: psutil.Process(process.pid).memory_info().rss / 2**20
  rows = []
  try:
    with httpx.Client(base_url=address, timeout=600) as client:

      def ask(**fields) -> float:
        begin = time.perf_counter()
        answer = client.post("/v1/translate", json={"sentences": [SENTENCE], **fields})
        answer.raise_for_status()
        return time.perf_counter() - begin

      ask()  # The server's own settings: compiled once, kept.
      for k in range(1, requests + 1):
        seconds = ask(method="sample", top_k=k, seed=0)
        if k % every == 0:
          rows.append({"max_programs": max_programs, "requests": k, "rss_mib": round(rss(), 1),
                       "last_request_s": round(seconds, 3), "own_settings_s": round(ask(), 3)})
          print(json.dumps(rows[-1]), flush=True)
  finally:
    process.send_signal(signal.SIGTERM)
    process.wait(60)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="A trained workdir.")
  parser.add_argument("--requests", type=int, default=60, help="Requests of new settings.")
  parser.add_argument("--every", type=int, default=10, help="Read the RSS every N requests.")
  parser.add_argument("--max_programs", type=int, nargs="+", default=[8, 1_000_000])
  args = parser.parse_args()
  for bound in args.max_programs:
    measure(args.workdir, bound, args.requests, args.every)


if __name__ == "__main__":
  main()
