"""The engine's slots against the batches, side by side in one process: sentences/s of
`Translator.translate` over a file, each configuration warmed first (its programs compiled),
then timed `--repeats` times in rotating order; BLEU against the references, so a faster
configuration that translated differently shows.

Configurations: `batches` (the default, --batch_tokens 4096), `batches:N` (--batch_tokens N),
`slots` (engine="slots", --batch_tokens 4096), `slots:N`, `slots[:N]@T`, the engine's first
cache tier at T positions for the configuration's calls (`serving.engine.FIRST_TIER`, 16 by
default), `slots[:N][@T]/gG`, G slots stepped together (--slot_group G; the backend's
by default, 8 on a CPU; e.g. `slots:512/g32`), and `slots[...]/lM`, the tiers above the first
stepped in groups of G / 2^t down to M slots instead of the backend's
(`serving.engine.LEAST_TIER_GROUP`, 4 on a CPU; M = G: every tier in groups of G, as on a
GPU; e.g. `slots:512/g32/l32`). Each configuration's first
call (its programs compiled, or loaded from the persistent compilation cache:
FLAX_TRANSFORMER_COMPILATION_CACHE='' for none) is reported as `first_call_s`.

  python benchmarks/speed/engine_throughput.py --workdir W \\
      --src ../shared/data/multi30k/test_2016_flickr.en.gz \\
      --ref ../shared/data/multi30k/test_2016_flickr.de.gz \\
      --configs batches batches:512 slots [--flags method=greedy ...] [--repeats 3] \\
      [--precision bfloat16] [--lone 40]

One JSON line per configuration: best and median seconds, sentences/s, BLEU, the lines that
differ from the first configuration's. Each call's seconds go to stderr as it ends, so a long
run shows where it is. `--lone N` adds each configuration's latency of one
sentence alone: the first N lines, one `translate` call each (each line's call made once
untimed first, then timed, the configurations taking turns line by line), their p50 and p90
in ms (`lone_p50_ms`, `lone_p90_ms`), and how many of those lines alone translate otherwise
than in the file (`lone_unlike_file`: 0 on the engine).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
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


CONFIG = re.compile(r"(batches|slots)(?::(\d+))?(?:@(\d+))?(?:/g(\d+))?(?:/l(\d+))?")


def parse_config(config: str) -> tuple[str, int | None, int | None, int | None, int | None]:
  """`engine[:N][@T][/gG][/lM]` -> (engine, N, T, G, M), None where not given; T, G and M for
  slots only."""
  match = CONFIG.fullmatch(config)
  if not match or (match[1] == "batches" and any(match.groups()[2:])):
    raise SystemExit(f"--configs: {config!r} is not batches[:N] or slots[:N][@T][/gG][/lM].")
  return match[1], *(None if group is None else int(group) for group in match.groups()[1:])


def settings_of(config: str, flags: dict[str, object]) -> dict[str, object]:
  """A configuration's Translator settings (its engine, budget and group over `flags`)."""
  engine, tokens, _, group, _ = parse_config(config)
  return {**flags, "engine": engine, **({"batch_tokens": tokens} if tokens else {}),
          **({"slot_group": group} if group else {})}


def translate(translator, sources: list[str], config: str, flags: dict[str, object]
              ) -> tuple[list[str], float]:
  """`translator.translate` of `sources` in `config` (the engine's first tier and its tiers'
  least group set for the call), and its seconds."""
  from flax_transformer.serving import engine

  _, _, first, _, least = parse_config(config)
  default, default_least = engine.FIRST_TIER, engine.LEAST_TIER_GROUP
  engine.FIRST_TIER = first or default
  if least:
    engine.LEAST_TIER_GROUP = dict.fromkeys(("cpu", "gpu", "tpu"), least)
  try:
    start = time.perf_counter()
    translated = translator.translate(sources, **settings_of(config, flags))
    return translated, time.perf_counter() - start
  finally:
    engine.FIRST_TIER, engine.LEAST_TIER_GROUP = default, default_least


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
  parser.add_argument("--precision", default="float32", choices=("float32", "bfloat16", "int8"),
                      help="the Translator's (chosen when it is made)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--lone", type=int, default=0,
                      help="also time this many lines one call each (the latency of one sentence)")
  args = parser.parse_args()

  import sacrebleu

  from flax_transformer import Translator

  sources = read(args.src, args.lines)
  references = read(args.ref, args.lines) if args.ref else None
  flags = parse_flags(args.flags)
  translator = Translator.from_workdir(args.workdir, precision=args.precision)
  outputs, times, first_calls = {}, {config: [] for config in args.configs}, {}
  for config in args.configs:  # Warm: every program compiled (or loaded) before timing.
    outputs[config], first_calls[config] = translate(translator, sources, config, flags)
    _progress(f"{config}: first call {first_calls[config]:.1f} s")
  for repeat in range(args.repeats):
    order = args.configs[repeat % len(args.configs):] + args.configs[:repeat % len(args.configs)]
    for config in order:
      translated, seconds = translate(translator, sources, config, flags)
      times[config].append(seconds)
      assert translated == outputs[config], f"{config}: another run translated differently"
      _progress(f"{config}: repeat {repeat + 1} of {args.repeats}, {seconds:.1f} s")
  lone = {config: [] for config in args.configs}
  lone_unlike = dict.fromkeys(args.configs, 0)  # Lines whose text alone is not their file's.
  for line in sources[:args.lone]:  # Warm: the batches' programs of one row compiled.
    for config in args.configs:
      translate(translator, [line], config, flags)
  for index, line in enumerate(sources[:args.lone]):
    for config in args.configs:
      (translated,), seconds = translate(translator, [line], config, flags)
      lone[config].append(seconds * 1e3)
      lone_unlike[config] += translated != outputs[config][index]
  first = outputs[args.configs[0]]
  for config in args.configs:
    best, median = min(times[config]), statistics.median(times[config])
    bleu = (round(sacrebleu.corpus_bleu(outputs[config], [references]).score, 2)
            if references else None)
    print(json.dumps({
        "config": config, "flags": flags, "precision": args.precision, "lines": len(sources),
        "first_call_s": round(first_calls[config], 3), "best_s": round(best, 3),
        "median_s": round(median, 3), "sentences_per_s": round(len(sources) / median, 1),
        "bleu": bleu,
        "lines_unlike_first": sum(a != b for a, b in zip(outputs[config], first, strict=True)),
        **({**_percentiles(lone[config]), "lone_unlike_file": lone_unlike[config]}
           if lone[config] else {})}), flush=True)


def _progress(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _percentiles(milliseconds: list[float]) -> dict[str, float]:
  """p50 and p90 (nearest rank) of the lone calls' milliseconds."""
  ranked = sorted(milliseconds)
  rank = lambda q: ranked[min(len(ranked) - 1, int(q * len(ranked)))]
  return {"lone_p50_ms": round(statistics.median(ranked), 1), "lone_p90_ms": round(rank(0.9), 1)}


if __name__ == "__main__":
  main()
