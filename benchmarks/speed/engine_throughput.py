"""The engine's slots against the batches, side by side in one process: sentences/s of
`Translator.translate` over a file, each configuration warmed first (its programs compiled),
then timed `--repeats` times in rotating order; BLEU against the references, so a faster
configuration that translated differently shows.

Configurations: `batches` (the default, --batch_tokens 4096), `batches:N` (--batch_tokens N),
`slots` (engine="slots", --batch_tokens 4096), `slots:N`, and `slots[:N]@T`: the engine with
its first cache tier at T positions (`serving.engine.FIRST_TIER`, 16 by default) during that
configuration's calls. Each configuration's first call (its programs compiled, or loaded from
the persistent compilation cache: FLAX_TRANSFORMER_COMPILATION_CACHE='' for none) is reported
as `first_call_s`.

  python benchmarks/speed/engine_throughput.py --workdir W \\
      --src ../shared/data/multi30k/test_2016_flickr.en.gz \\
      --ref ../shared/data/multi30k/test_2016_flickr.de.gz \\
      --configs batches batches:512 slots [--flags method=greedy ...] [--repeats 3]

One JSON line per configuration: best and median seconds, sentences/s, BLEU, the lines that
differ from the first configuration's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # This checkout's package, not an installed one.


def read(path: str, lines: int | None) -> list[str]:
  data = Path(path).read_bytes()
  text = (gzip.decompress(data) if path.endswith(".gz") else data).decode("utf-8")
  return text.splitlines()[:lines]


def settings_of(config: str, flags: dict[str, object]) -> dict[str, object]:
  """`batches`, `batches:N`, `slots`, `slots:N` (and `@T`, `first_tier`) -> Translator
  settings."""
  engine, _, tokens = config.partition("@")[0].partition(":")
  if engine not in ("batches", "slots") or ("@" in config and engine != "slots"):
    raise SystemExit(f"--configs: {config!r} is not batches[:N] or slots[:N][@T].")
  return {**flags, "engine": engine, **({"batch_tokens": int(tokens)} if tokens else {})}


def first_tier(config: str) -> int | None:
  """T of a `slots[:N]@T` configuration, else None (the engine's default)."""
  return int(config.partition("@")[2]) if "@" in config else None


def translate(translator, sources: list[str], config: str, flags: dict[str, object]
              ) -> tuple[list[str], float]:
  """`translator.translate` of `sources` in `config` (its first tier set for the call), and
  its seconds."""
  from flax_transformer.serving import engine

  default, tier = engine.FIRST_TIER, first_tier(config)
  engine.FIRST_TIER = tier or default
  try:
    start = time.perf_counter()
    translated = translator.translate(sources, **settings_of(config, flags))
    return translated, time.perf_counter() - start
  finally:
    engine.FIRST_TIER = default


def parse_flags(pairs: list[str]) -> dict[str, object]:
  flags = {}
  for pair in pairs:
    key, _, value = pair.partition("=")
    for kind in (int, float):
      try:
        flags[key] = kind(value)
        break
      except ValueError:
        continue
    else:
      flags[key] = value
  return flags


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--src", required=True)
  parser.add_argument("--ref", default=None)
  parser.add_argument("--lines", type=int, default=None)
  parser.add_argument("--configs", nargs="+", default=["batches", "batches:512", "slots"])
  parser.add_argument("--flags", nargs="*", default=[])
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  import sacrebleu

  from flax_transformer import Translator

  sources = read(args.src, args.lines)
  references = read(args.ref, args.lines) if args.ref else None
  flags = parse_flags(args.flags)
  translator = Translator.from_workdir(args.workdir)
  outputs, times, first_calls = {}, {config: [] for config in args.configs}, {}
  for config in args.configs:  # Warm: every program compiled (or loaded) before timing.
    outputs[config], first_calls[config] = translate(translator, sources, config, flags)
  for repeat in range(args.repeats):
    order = args.configs[repeat % len(args.configs):] + args.configs[:repeat % len(args.configs)]
    for config in order:
      translated, seconds = translate(translator, sources, config, flags)
      times[config].append(seconds)
      assert translated == outputs[config], f"{config}: another run translated differently"
  first = outputs[args.configs[0]]
  for config in args.configs:
    best, median = min(times[config]), statistics.median(times[config])
    bleu = (round(sacrebleu.corpus_bleu(outputs[config], [references]).score, 2)
            if references else None)
    print(json.dumps({
        "config": config, "flags": flags, "lines": len(sources),
        "first_call_s": round(first_calls[config], 3), "best_s": round(best, 3),
        "median_s": round(median, 3), "sentences_per_s": round(len(sources) / median, 1),
        "bleu": bleu,
        "lines_unlike_first": sum(a != b for a, b in zip(outputs[config], first, strict=True))}),
        flush=True)


if __name__ == "__main__":
  main()
