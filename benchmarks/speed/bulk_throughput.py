"""Throughput of a bulk translate job on 1 device and on 8 (fake) devices, compile time apart.

Runs the job the CLI runs (`jobs.plan_file_job` + `jobs.run_file_job` with a `TranslationTask`,
the Translator on a mesh over the local devices) in a subprocess per device count, with
`--xla_force_host_platform_device_count=N`. Every search shape is compiled ahead of its first
call (`jit.lower(...).compile()`, timed apart), so `run_s` excludes compilation. One JSON line
per (input, device count): sentences/s and target tokens/s over run_s, and compile_s.

  python benchmarks/speed/bulk_throughput.py --workdir W --inputs test2016 train100k \\
      --devices 1 8 [--flags method=greedy beam_size=4 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # This checkout's package, not an installed one.

MULTI30K = Path("/work/shared/data/multi30k")
INPUTS = {"test2016": (MULTI30K / "test_2016_flickr.en.gz", 1000),
          "train100k": (MULTI30K / "train.en.gz", 100_000)}


def build_input(name: str, tmp: Path) -> Path:
  """The input file: test2016 as it is, or the training source repeated to 100k lines."""
  source, lines = INPUTS[name]
  path = tmp / f"{name}.en"
  if not path.exists():
    text = gzip.decompress(source.read_bytes()).decode("utf-8").splitlines()
    path.write_text("".join(line + "\n" for line in itertools.islice(itertools.cycle(text),
                                                                     lines)))
  return path


def timed_compiles(translator):
  """The translator with its jitted search wrapped so each new shape is compiled apart (timed),
  and the compile totals. A compile waits for the work already dispatched, which would
  otherwise run during it and be counted as compile time."""
  import jax

  # The plain jitted search (a Translator stores it exported: the same program, loaded).
  jitted = getattr(translator.search_fn, "jitted", translator.search_fn)
  compiled, totals = {}, {"compile_s": 0.0, "shapes": 0}
  dispatched = []  # The last call's outputs: calls return before their work ends.

  def search(params, inputs, rng, *optional, **static):
    # optional: the length penalty (data) and the options asked for; static: settings,
    # max_decode_len and the rest (`Translator._search_step`).
    key = (inputs.shape, rng.shape, tuple(None if x is None else x.shape for x in optional),
           tuple(sorted(static.items())))
    if key not in compiled:
      jax.block_until_ready(dispatched)  # Work still running is not compile time.
      start = time.perf_counter()
      compiled[key] = jitted.lower(params, inputs, rng, *optional, **static).compile()
      totals["compile_s"] += time.perf_counter() - start
      totals["shapes"] += 1
    dispatched[:] = [compiled[key](params, inputs, rng, *optional)]
    return dispatched[0]

  return dataclasses.replace(translator, search_fn=search), totals


def counting_task(translator):
  """A TranslationTask that also counts the target tokens it produced."""
  from flax_transformer.bulk.chunk_tasks import TranslationTask

  class CountingTask(TranslationTask):
    tokens = 0

    def __call__(self, first_line, records, progress):
      def counted(lines, tokens):
        self.tokens += tokens
        progress(lines, tokens)
      return super().__call__(first_line, records, counted)

  return CountingTask(translator)


def child(args: argparse.Namespace) -> None:
  """One measurement in this process (its device count set by the parent)."""
  import jax

  from flax_transformer.bulk import jobs
  from flax_transformer.runtime.sharding import local_mesh
  from flax_transformer.serving.translator import Translator

  settings = {k: json.loads(v) if v[:1].isdigit() else v
              for k, v in (flag.split("=", 1) for flag in args.flags)}
  translator = Translator.from_workdir(args.workdir, mesh=local_mesh(), **settings)
  translator, totals = timed_compiles(translator)
  source = Path(args.input)
  output = Path(args.tmp) / f"{source.name}.{jax.local_device_count()}dev.out"
  output.unlink(missing_ok=True)
  shutil.rmtree(jobs.partial_dir(str(output)), ignore_errors=True)  # Start afresh.
  job = jobs.plan_file_job([str(source)], str(output), chunk_lines=args.chunk_lines,
                           job={"command": "translate", "checkpoint": {}, "settings": settings})
  task = counting_task(translator)
  start = time.perf_counter()
  jobs.run_file_job(job, task, params_sha256="bench")
  wall = time.perf_counter() - start
  run_s = wall - totals["compile_s"]
  print(json.dumps({
      "input": source.name, "lines": job.num_lines, "devices": jax.local_device_count(),
      "settings": settings, "chunk_lines": args.chunk_lines, "wall_s": round(wall, 1),
      "compile_s": round(totals["compile_s"], 1), "shapes": totals["shapes"],
      "run_s": round(run_s, 1), "sentences_per_s": round(job.num_lines / run_s, 1),
      "target_tokens_per_s": round(task.tokens / run_s, 1)}), flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--inputs", nargs="+", default=list(INPUTS), choices=list(INPUTS))
  parser.add_argument("--devices", type=int, nargs="+", default=[1, 8])
  parser.add_argument("--chunk_lines", type=int, default=50_000)
  parser.add_argument("--tmp", default="/tmp/bulkbench/throughput")
  parser.add_argument("--flags", nargs="*", default=[], help="TranslateConfig fields, k=v.")
  parser.add_argument("--input", help=argparse.SUPPRESS)  # Set in the child process.
  args = parser.parse_args()
  Path(args.tmp).mkdir(parents=True, exist_ok=True)
  if args.input:
    child(args)
    return
  for name in args.inputs:
    source = build_input(name, Path(args.tmp))
    for devices in args.devices:
      env = dict(os.environ, JAX_PLATFORMS="cpu", FLAX_TRANSFORMER_COMPILATION_CACHE="",
                 XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                 PYTHONPATH=str(REPO))
      subprocess.run([sys.executable, __file__, "--workdir", args.workdir, "--input",
                      str(source), "--tmp", args.tmp, "--chunk_lines", str(args.chunk_lines),
                      "--flags", *args.flags], env=env, check=True)


if __name__ == "__main__":
  main()
