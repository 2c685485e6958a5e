"""Where a beam-search step's time goes on XLA:CPU: op time from a `jax.profiler` trace, by kind.

    python benchmarks/profiling/search_step_profile.py [--config base] [--precision int8] [--top 0]

The workload of benchmarks/speed/ctranslate2_throughput.py (32 random sentences of 32 tokens, beam
4, 64 output tokens forced, random weights converted by `model.precision` as a Translator converts
them). One compiled call is timed untraced (3 calls) and traced (1 call); each traced XLA op is
looked up in the compiled HLO and sorted into a kind by its output shape and the ops it fuses: the
decoder's matmuls [rows, ...], the tied logits matmul, attention's batched dots, the vocabulary's
log-softmax and the beam's top-k, activation quantization, the once-per-call encoder, the rest.
Prints a Markdown table (share, ms per step) and one JSON line.

XLA:CPU's thunk executor runs independent ops on both cores at once, so op time summed can
exceed the wall time, and an op's share says what it costs, not what removing it would save
(merging the decoder's three query/key/value matmuls into one cut their op time by 30 % and
the wall time not at all: the three ran side by side before).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np

# The workload of benchmarks/speed/ctranslate2_throughput.py and decode_throughput.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "speed"))
from ctranslate2_throughput import CONFIGS, EOS_ID, LENGTH_PENALTY
from decode_throughput import jit_search

from flax_transformer import Transformer
from flax_transformer.model import precision

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+?\[[^\]]*\])\S* (\w[\w\-]*)\((.*)$",
                          re.M)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(.*?\{\n(.*?)^\}", re.M | re.S)


def op_signatures(hlo_text: str) -> dict[str, str]:
  """Each instruction's name -> "<output shape> <ops it fuses>" (a fusion's called computation
  read for its dots and other ops), from a compiled module's text."""
  bodies = {m.group(1): m.group(2) for m in _COMPUTATION.finditer(hlo_text)}
  signatures = {}
  for name, shape, op, rest in _INSTRUCTION.findall(hlo_text):
    called = re.search(r"calls=%([\w.\-]+)", rest)
    body = bodies.get(called.group(1), "") if called else ""
    fused = sorted(set(re.findall(r"= \S+ (\w[\w\-]*)\(", body)) - {
        "parameter", "constant", "bitcast", "broadcast", "reshape"}) if body else [op]
    signatures[name] = f"{shape} {' '.join(fused)}"
  return signatures


def kind_of(signature: str, vocab_size: int, rows: int) -> str:
  """The kind of one op by its signature (op_signatures)."""
  shape, ops = signature.split(" ", 1)
  if "dot" in ops.split():
    if f",{vocab_size}]" in shape:
      return "logits matmul"
    if re.match(rf"\w+\[{rows},", shape):
      return "decoder projections and feed-forward matmuls"
    if len(shape.split(",")) == 2:
      return "encoder, cross-attention keys/values (once per call)"
    return "attention's batched dots"
  if shape.startswith("s8[") or ops == "abs reduce":
    return "activation quantization"
  if f",{vocab_size}]" in shape or "sort" in ops or "custom-call" in ops or re.match(
      rf"f32\[{rows}(,\d+)?\]$", shape):
    return "vocabulary log-softmax, beam top-k"
  return "the rest (layer norms, softmaxes, cache writes, small fusions)"


def _op_times(trace_dir: str) -> collections.Counter:
  """Summed duration (µs) of each XLA op in the trace (thunk and thread-pool events left out)."""
  path = sorted(glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True))[-1]
  with gzip.open(path) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  times = collections.Counter()
  for event in events:
    if event.get("ph") == "X" and not event["name"].startswith(("$", "Thunk", "Slinky")):
      times[event["name"]] += event["dur"]
  return times


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="base", choices=sorted(CONFIGS))
  parser.add_argument("--precision", default="int8", choices=precision.PRECISIONS)
  parser.add_argument("--sentences", type=int, default=32)
  parser.add_argument("--steps", type=int, default=64)
  parser.add_argument("--top", type=int, default=0, help="also print the N costliest ops")
  args = parser.parse_args()

  trained = CONFIGS[args.config]().replace(dropout_rate=0.0, attention_dropout_rate=0.0)
  ids = np.random.default_rng(0).integers(3, trained.vocab_size, (args.sentences, 32), np.int32)
  ids[:, -1] = EOS_ID
  variables = jax.jit(Transformer(trained).init)(jax.random.key(0), ids, ids)
  config = precision.precision_config(trained, args.precision)
  variables = {"params": precision.convert_params(nn.unbox(variables["params"]), config)}
  translate = jit_search(Transformer(config), beam_size=4, max_decode_len=args.steps,
                         min_length=args.steps, length_penalty=LENGTH_PENALTY,
                         length_normalization="fairseq")
  compiled = translate.lower(variables, ids).compile()
  jax.block_until_ready(compiled(variables, ids))
  untraced = []
  for _ in range(3):
    start = time.perf_counter()
    jax.block_until_ready(compiled(variables, ids))
    untraced.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(compiled(variables, ids))
    times = _op_times(trace_dir)

  signatures = op_signatures(compiled.as_text())
  rows = args.sentences * 4
  by_kind = collections.Counter()
  for name, microseconds in times.items():
    by_kind[kind_of(signatures.get(name, "? ?"), trained.vocab_size, rows)] += microseconds
  total = sum(by_kind.values())
  print(f"| {args.config} {args.precision}: kind | share of op time | ms per step |")
  print("|---|---:|---:|")
  for kind, microseconds in by_kind.most_common():
    print(f"| {kind} | {100 * microseconds / total:.0f}% | {microseconds / 1e3 / args.steps:.1f} |")
  for name, microseconds in times.most_common(args.top):
    print(f"{microseconds / 1e3:9.1f} ms  {name}: {signatures.get(name, '?')}")
  print(json.dumps({
      "benchmark": "search_step_profile", "config": args.config, "precision": args.precision,
      "untraced_call_s": round(float(np.median(untraced)), 3),
      "op_time_per_step_ms": round(total / 1e3 / args.steps, 1),
      "by_kind_ms_per_step": {k: round(v / 1e3 / args.steps, 2) for k, v in by_kind.items()},
      "jax": jax.__version__, "date": datetime.datetime.now(datetime.UTC).isoformat(
          timespec="seconds")}))


if __name__ == "__main__":
  main()
