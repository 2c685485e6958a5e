"""Whether a sentence's translation depends on what else is searched with it: each engine's
n-best (texts and scores, to the last bit) of a file's sentences, searched in the file's order,
shuffled, reversed, each alone, and each between the file's longest and shortest sentences.

The engine's promise (docs/design.md, "The engine") is that the slots give the same bytes in
every case. The batches give a sentence the shape of its length bucket's batch, which depends on
its neighbours: on XLA:CPU another row count changes a score's last bits and can flip a near
tie, which an early checkpoint has many of. So this check is run on one:

  python benchmarks/quality/engine_invariance.py --workdir W --step 79 \\
      --src ../shared/data/multi30k/test_2016_flickr.en.gz --lines 300 --alone 60 \\
      [--engines slots batches] [--flags method=greedy ...] [--mesh] [--dump F | --against F]

`--mesh` searches over every local device (XLA_FLAGS=--xla_force_host_platform_device_count=8
makes 8 of a CPU); `--dump F` writes the file-order n-best of each engine to F, and `--against
F` compares this run's with F's, e.g. 8 devices against 1.

One JSON line per engine and case: the sentences compared, how many differ from the file-order
run (text or score), and the first that does. Exits 1 when the slots differ anywhere.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # This checkout's package, not an installed one.
sys.path.insert(0, str(REPO / "benchmarks" / "speed"))
from engine_throughput import parse_flags, read  # noqa: E402  (its file and flag readers)

NEIGHBOURS = 8  # Longest and shortest sentences around each sentence of the neighbours case.


Search = Callable[[Sequence[str]], list[list[tuple[str, float]]]]


def cases(sources: Sequence[str], alone: int, seed: int
          ) -> dict[str, Callable[[Search], dict[int, list[tuple[str, float]]]]]:
  """Each case: given a search of a list of sentences, the n-best of the sentences it covers,
  by index into `sources`."""
  order = list(range(len(sources)))
  shuffled = random.Random(seed).sample(order, len(order))
  by_length = sorted(order, key=lambda i: len(sources[i]))
  long, short = by_length[-NEIGHBOURS:], by_length[:NEIGHBOURS]

  def in_order(indices: Sequence[int]) -> Callable[[Search], dict[int, list]]:
    return lambda search: dict(zip(indices, search([sources[i] for i in indices]), strict=True))

  def one_by_one(search: Search) -> dict[int, list]:
    return {i: search([sources[i]])[0] for i in order[:alone]}

  def between(search: Search) -> dict[int, list]:
    found = {}
    for i in order[:alone]:
      batch = [*long, i, *short]
      found[i] = search([sources[j] for j in batch])[len(long)]
    return found

  return {"shuffled": in_order(shuffled), "reversed": in_order(order[::-1]),
          "alone": one_by_one, "between_long_and_short": between}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--step", type=int, default=None, help="default: the latest checkpoint")
  parser.add_argument("--src", required=True)
  parser.add_argument("--lines", type=int, default=300)
  parser.add_argument("--alone", type=int, default=60,
                      help="sentences searched alone and between neighbours (one call each)")
  parser.add_argument("--nbest", type=int, default=None, help="default: the beam size")
  parser.add_argument("--engines", nargs="+", default=["slots", "batches"])
  parser.add_argument("--flags", nargs="*", default=[])
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--mesh", action="store_true", help="search over every local device")
  parser.add_argument("--dump", default=None, help="write the file-order n-best here (JSON)")
  parser.add_argument("--against", default=None, help="compare with another run's --dump")
  args = parser.parse_args()

  from flax_transformer import Translator

  sources = read(args.src, args.lines)
  flags = parse_flags(args.flags)
  from flax_transformer.runtime import sharding

  translator = Translator.from_workdir(args.workdir, args.step,
                                       mesh=sharding.local_mesh() if args.mesh else None)
  other = json.loads(Path(args.against).read_text()) if args.against else {}
  dumped, slots_differ = {}, 0
  for engine in args.engines:
    search = lambda batch, engine=engine: translator.translate_nbest(
        list(batch), args.nbest, engine=engine, **flags)
    reference = dict(enumerate(search(sources)))
    dumped[engine] = [reference[i] for i in range(len(sources))]
    if engine in other:
      theirs = [[tuple(h) for h in nbest] for nbest in other[engine]]
      differ = [i for i, nbest in enumerate(theirs) if nbest != reference[i]]
      print(json.dumps({"engine": engine, "case": f"against {args.against}",
                        "devices": translator.num_devices, "sentences": len(theirs),
                        "differ": len(differ)}), flush=True)
      slots_differ += len(differ) if engine == "slots" else 0
    for case, run in cases(sources, args.alone, args.seed).items():
      found = run(search)
      differ = [i for i, nbest in found.items() if nbest != reference[i]]
      example = None if not differ else {
          "line": differ[0] + 1, "file_order": reference[differ[0]][:2],
          case: found[differ[0]][:2]}
      print(json.dumps({"engine": engine, "case": case, "flags": flags, "step": translator.step,
                        "devices": translator.num_devices,
                        "sentences": len(found), "differ": len(differ), "example": example},
                       ensure_ascii=False), flush=True)
      if engine == "slots":
        slots_differ += len(differ)
  if args.dump:
    Path(args.dump).write_text(json.dumps(dumped, ensure_ascii=False))
  sys.exit(1 if slots_differ else 0)


if __name__ == "__main__":
  main()
