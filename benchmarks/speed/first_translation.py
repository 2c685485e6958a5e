"""Time to first translation: a short CLI call, a new Python process, a new number of sentences,
and CTranslate2 on the same weights, each in a new process, with its breakdown.

    python benchmarks/speed/first_translation.py --workdir workdirs/default [--repeats 3]

For the workdir it measures, with a fresh persistent compilation cache folder:
  - `flax-transformer translate` of 3 sentences, wall time of the whole command: cold (empty
    cache) and warm (the same command again);
  - the Python API in a new process with the warm cache: imports, `open_workdir` (config.json
    and the vocabulary), restoring the parameters, the first `translate` of 3 sentences (split
    into getting the search program, i.e. loading or compiling it, and the rest: tokenizing,
    searching, detokenizing), then 5 sentences of the same length bucket (a new number);
  - CTranslate2 (`export --format ctranslate2`, float32) in a new process: import, load,
    translate the same 3 sentences (beam 4), wall time of the whole process.
Prints one JSON line per measurement (the median of --repeats runs) and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SENTENCES = ["A man is riding a bike down the street.", "Two dogs play in the snow.",
             "The girl reads a book."]
MORE = ["A woman is cooking in a kitchen.", "The boy throws a red ball.",
        "Three people walk on the beach.", "An old man sits on a bench.",
        "A child is eating an apple."]

_API = r"""
import json, sys, time
start = time.perf_counter()
from flax_transformer import Translator
from flax_transformer.serving import programs
from flax_transformer.workdir import open_workdir
import jax  # What the first call would load anyway.
imported = time.perf_counter()
opened = open_workdir(sys.argv[1])
read = time.perf_counter()
translator = Translator.from_workdir(opened, beam_size=4)
restored = time.perf_counter()
program_seconds = []
real = programs.StoredPrograms._program
def timed(self, *args):
  begin = time.perf_counter()
  try:
    return real(self, *args)
  finally:
    program_seconds.append(time.perf_counter() - begin)
programs.StoredPrograms._program = timed
first = translator.translate(json.loads(sys.argv[2]))
translated = time.perf_counter()
translator.translate(json.loads(sys.argv[3]))
again = time.perf_counter()
print(json.dumps({"imports": imported - start, "open_workdir": read - imported,
                  "restore": restored - read, "first_translate": translated - restored,
                  "program": sum(program_seconds), "programs": len(program_seconds),
                  "new_number": again - translated, "output": first}))
"""

_CT2 = r"""
import json, sys, time
start = time.perf_counter()
import ctranslate2, sentencepiece
imported = time.perf_counter()
translator = ctranslate2.Translator(sys.argv[1], device="cpu", compute_type="float32")
source = sentencepiece.SentencePieceProcessor(model_file=sys.argv[1] + "/source.spm")
target = sentencepiece.SentencePieceProcessor(model_file=sys.argv[1] + "/target.spm")
loaded = time.perf_counter()
pieces = [source.encode(s, out_type=str) for s in json.loads(sys.argv[2])]
results = translator.translate_batch(pieces, beam_size=4, max_decoding_length=64)
output = [target.decode(r.hypotheses[0]) for r in results]
done = time.perf_counter()
print(json.dumps({"imports": imported - start, "load": loaded - imported,
                  "translate": done - loaded, "output": output}))
"""


def _run(command: list[str], env: dict[str, str]) -> tuple[float, str]:
  start = time.perf_counter()
  result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
  seconds = time.perf_counter() - start
  if result.returncode:
    raise RuntimeError(f"{' '.join(command[:3])} failed:\n{result.stderr[-3000:]}")
  return seconds, result.stdout


def _median(records: list[dict], key: str) -> float:
  return round(statistics.median(r[key] for r in records), 3)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--ctranslate2", action=argparse.BooleanOptionalAction, default=True)
  args = parser.parse_args()
  scratch = tempfile.mkdtemp(prefix="first_translation_")
  source = os.path.join(scratch, "in.txt")
  with open(source, "w") as handle:
    handle.write("".join(line + "\n" for line in SENTENCES))
  results = {}
  cli = [sys.executable, "-m", "flax_transformer.cli", "translate", "--workdir", args.workdir,
         "--input", source, "--output", os.path.join(scratch, "out.txt"), "--beam_size", "4"]
  colds, warms = [], []
  for repeat in range(args.repeats):
    env = {**os.environ,
           "FLAX_TRANSFORMER_COMPILATION_CACHE": os.path.join(scratch, f"xla{repeat}")}
    colds.append(_run(cli, env)[0])
    warms.append(_run(cli, env)[0])
  results["cli_cold"] = {"wall": round(statistics.median(colds), 3)}
  results["cli_warm"] = {"wall": round(statistics.median(warms), 3)}
  env = {**os.environ, "FLAX_TRANSFORMER_COMPILATION_CACHE": os.path.join(scratch, "xla0")}
  api = []
  for _ in range(args.repeats):
    wall, out = _run([sys.executable, "-c", _API, args.workdir, json.dumps(SENTENCES),
                      json.dumps(MORE)], env)
    api.append({**json.loads(out), "wall": wall})
  results["api_warm"] = {key: _median(api, key) for key in (
      "wall", "imports", "open_workdir", "restore", "first_translate", "program", "new_number")}
  if args.ctranslate2:
    model = os.path.join(scratch, "ct2")
    _run([sys.executable, "-m", "flax_transformer.cli", "export", "--workdir", args.workdir,
          "--format", "ctranslate2", "--output", model], dict(os.environ))
    ct2 = []
    for _ in range(args.repeats):
      wall, out = _run([sys.executable, "-c", _CT2, model, json.dumps(SENTENCES)],
                       dict(os.environ))
      ct2.append({**json.loads(out), "wall": wall})
    results["ctranslate2"] = {key: _median(ct2, key)
                              for key in ("wall", "imports", "load", "translate")}
  for name, record in results.items():
    print(json.dumps({"benchmark": "first_translation", "measure": name, "value": record}))
  api = results["api_warm"]
  print(f"\n| {args.workdir} | seconds |\n|---|---:|")
  print(f"| CLI, 3 sentences, cold cache (whole command) | {results['cli_cold']['wall']} |")
  print(f"| CLI, 3 sentences, warm cache (whole command) | {results['cli_warm']['wall']} |")
  print(f"| API, new process: imports | {api['imports']} |")
  print(f"| API: open_workdir (config.json, vocabulary) | {api['open_workdir']} |")
  print(f"| API: restore the parameters | {api['restore']} |")
  print(f"| API: first translate (3 sentences) | {api['first_translate']} |")
  print(f"| API: of which loading the search program | {api['program']} |")
  print(f"| API: 5 sentences of the same bucket (a new number) | {api['new_number']} |")
  if "ctranslate2" in results:
    ct2 = results["ctranslate2"]
    print(f"| CTranslate2, new process (whole): imports {ct2['imports']}, load {ct2['load']}, "
          f"translate {ct2['translate']} | {ct2['wall']} |")


if __name__ == "__main__":
  main()
