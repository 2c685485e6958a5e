"""Decoding loop variants side by side in one process, optionally against Flax examples/wmt.

Variants of our search on the side-by-side harness's workload (`shared/bench`: 32 sentences x
32 source tokens, 63 decoder steps forced, alpha 0.6, random parameters): steps per while-loop
iteration, the inner loop's form (static unroll or `lax.fori_loop`), the self-attention cache
(fixed or growing) and XLA's command buffers (CUDA graphs), passed per compile as
`compiler_options`. All programs are compiled first (several at a time with
--compile_threads), then timed in alternating rounds; prints one JSON line per variant with
its median time, sentences/s, compile time, the ratio to the anchor and whether its outputs
equal the first variant's.

  python benchmarks/profiling/decode_loop_variants.py --bench-dir ../shared/bench \\
      --flax-wmt-dir /tmp/flaxwmt/examples/wmt --configs small base --methods beam greedy \\
      --variants k=2 k=8 k=8,loop=fori k=8,cb=while k=8,cb=none k=8,cache=growing

A variant is comma-separated key=value: k (steps per iteration), loop (unroll | fori), cache
(fixed | growing), cb (default | while: the default command types plus WHILE and CONDITIONAL |
none: no command buffers | a '+'-separated list of types), mingraph
(xla_gpu_graph_min_graph_size).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np
from jax import lax

from flax_transformer import ModelConfig, Transformer, decoding
from flax_transformer.decoding import bridge, loop, search

DEFAULT_COMMANDS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION"
COMMAND_BUFFERS = {"default": None, "while": DEFAULT_COMMANDS + ",WHILE,CONDITIONAL", "none": ""}


def parse_variant(spec: str) -> dict[str, Any]:
  """'k=8,cb=while' -> {'k': 8, 'loop': 'unroll', 'cache': 'fixed', 'cb': 'while', ...}."""
  variant = dict(k=None, loop="unroll", cache="fixed", cb="default", mingraph=None, name=spec)
  for item in spec.split(","):
    key, value = item.split("=")
    if key not in variant:
      raise ValueError(f"unknown variant key {key!r} in {spec!r}")
    variant[key] = int(value) if key in ("k", "mingraph") else value
  return variant


def compiler_options(variant: dict[str, Any]) -> dict[str, Any]:
  options = {}
  if variant["cb"] != "default":
    commands = COMMAND_BUFFERS.get(variant["cb"], variant["cb"].replace("+", ","))
    options["xla_gpu_enable_command_buffer"] = commands
  if variant["mingraph"] is not None:
    options["xla_gpu_graph_min_graph_size"] = variant["mingraph"]
  return options


def _search(model, variables, inputs, *, beam_size: int, steps: int, k: int | None,
            growing: bool):
  """prepare_search, then beam_search (or greedy_search), `steps` tokens forced."""
  problem = bridge.prepare_search(model, variables, inputs, max_decode_len=steps,
                                 min_length=steps, grow_cache=growing)
  options = loop.LoopOptions(steps_per_iteration=k)
  if beam_size == 1:
    return decoding.greedy_search(problem, loop_options=options)
  return decoding.beam_search(problem, beam_size=beam_size, ranking=search.Ranking(0.6),
                            return_all=False, loop_options=options)


def _fori_steps(step, steps, loop_state):
  return lax.fori_loop(0, steps, lambda _, s: step(s), loop_state)


class OursVariant:
  """Our search on the harness workload, configured by one variant."""

  def __init__(self, h, preset: dict, beam_size: int, variant: dict[str, Any], seed: int = 0):
    self.h, self.preset, self.beam_size, self.variant = h, preset, beam_size, variant
    config = ModelConfig(
        vocab_size=preset["vocab_size"], emb_dim=preset["emb_dim"],
        num_heads=preset["num_heads"], mlp_dim=preset["mlp_dim"],
        num_encoder_layers=preset["num_layers"], num_decoder_layers=preset["num_layers"],
        dropout_rate=0.0, attention_dropout_rate=0.0, max_len=256)
    self.model = Transformer(config)
    ones = np.ones((h.DECODE_BATCH, h.DECODE_SRC_LEN), np.int32)
    self.variables = jax.jit(self.model.init)(jax.random.key(seed), ones, ones)
    steps = h.DECODE_MAX_LEN - 1
    self.fn = jax.jit(functools.partial(
        _search, self.model, beam_size=beam_size, steps=steps, k=variant["k"],
        growing=variant["cache"] == "growing"))

  def make_inputs(self, i: int):
    return self.h.make_decode_inputs(self.preset, 0, self.beam_size, i)

  def lower(self):
    """Traces now (in the calling thread: the inner-loop form is a module-level switch)."""
    original = loop._run_steps
    if self.variant["loop"] == "fori":
      loop._run_steps = _fori_steps
    try:
      example = self.h.jax_materialize(self.make_inputs(self.h.COMPILE_EXAMPLE_INDEX))
      self._lowered = self.fn.lower(self.variables, example)
    finally:
      loop._run_steps = original

  def compile(self) -> float:
    start = time.perf_counter()
    self._compiled = self._lowered.compile(compiler_options=compiler_options(self.variant))
    return time.perf_counter() - start

  def run(self, inputs):
    return self._compiled(self.variables, inputs)[0]


class Anchor:
  """The harness's Flax examples/wmt decoder with the same interface."""

  def __init__(self, h, flax_wmt_dir: str, config: str, preset: dict, beam_size: int):
    self.bench = h.AnchorAdapter(flax_wmt_dir, None).make_decode(config, preset, 0, beam_size)
    self.variant = dict(name="flax examples/wmt")

  def make_inputs(self, i: int):
    return self.bench.make_inputs(i)

  def lower(self):
    pass

  def compile(self) -> float:
    return self.bench.compile()["compile_total_s"]

  def run(self, inputs):
    return self.bench.run(inputs)


def _attempt(fn):
  """fn, returning the exception it raises instead of raising it."""

  def attempted(*args):
    try:
      return fn(*args)
    except Exception as error:  # Reported by the caller.
      return error

  return attempted


def _timed(h, bench, inputs) -> float:
  start = time.perf_counter()
  h.jax_block(bench.run(inputs))
  return time.perf_counter() - start


def measure(h, args, config: str, method: str) -> list[dict[str, Any]]:
  """Compiles every variant (and the anchor), then times them in alternating rounds."""
  preset = h.PRESETS[config]
  beam_size = 4 if method == "beam" else 1
  specs = args.variants if method == "beam" else (args.greedy_variants or args.variants)
  benches = [OursVariant(h, preset, beam_size, parse_variant(v)) for v in specs]
  if args.flax_wmt_dir:
    benches.append(Anchor(h, args.flax_wmt_dir, config, preset, beam_size))
  for bench in benches:
    bench.lower()
  with concurrent.futures.ThreadPoolExecutor(args.compile_threads) as pool:
    compile_s = list(pool.map(_attempt(lambda b: b.compile()), benches))
  outputs = [_attempt(lambda b: np.asarray(b.run(h.jax_materialize(b.make_inputs(0)))))(bench)
             for bench in benches]
  failed = [i for i, result in enumerate(zip(compile_s, outputs, strict=True))
            if any(isinstance(r, Exception) for r in result)]
  for i in failed:  # Reported, then left out: a variant XLA cannot build must not stop the rest.
    error = next(r for r in (compile_s[i], outputs[i]) if isinstance(r, Exception))
    print(json.dumps(dict(config=config, method=method, variant=benches[i].variant["name"],
                          error=str(error)[:300])), flush=True)
  keep = [i for i in range(len(benches)) if i not in failed]
  benches, compile_s, outputs = ([x[i] for i in keep] for x in (benches, compile_s, outputs))
  times = [[] for _ in benches]
  for round_index in range(args.rounds):
    for i, bench in enumerate(benches):
      inputs = h.jax_materialize(bench.make_inputs(1 + round_index))
      times[i].append(_timed(h, bench, inputs))
  anchor_s = statistics.median(times[-1]) if isinstance(benches[-1], Anchor) else None
  records = []
  for bench, seconds, compiled_s, output in zip(benches, times, compile_s, outputs, strict=True):
    median = statistics.median(seconds)
    record = dict(config=config, method=method, variant=bench.variant["name"],
                  median_ms=round(1000 * median, 3), min_ms=round(1000 * min(seconds), 3),
                  sentences_per_s=round(h.DECODE_BATCH / median, 1),
                  compile_s=round(compiled_s, 2))
    if anchor_s is not None:
      record["x_anchor"] = round(anchor_s / median, 3)
    if isinstance(bench, OursVariant):
      record["same_output_as_first"] = bool(np.array_equal(output, outputs[0]))
    records.append(record)
  return records


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--bench-dir", required=True, help="folder of anchor_flax_wmt.py")
  parser.add_argument("--flax-wmt-dir", default=None, help="Flax examples/wmt: adds the anchor")
  parser.add_argument("--configs", nargs="+", default=["small", "base"])
  parser.add_argument("--methods", nargs="+", default=["beam", "greedy"])
  parser.add_argument("--variants", nargs="+", default=["k=2", "k=8"])
  parser.add_argument("--greedy-variants", nargs="+", default=None,
                      help="variants for greedy decoding (default: --variants)")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--compile_threads", type=int, default=1)
  args = parser.parse_args()
  sys.path.insert(0, os.path.abspath(args.bench_dir))
  import anchor_flax_wmt as h

  print(json.dumps(dict(jax=jax.__version__, backend=jax.default_backend(),
                        device=jax.devices()[0].device_kind)), flush=True)
  for config in args.configs:
    for method in args.methods:
      for record in measure(h, args, config, method):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
  main()
