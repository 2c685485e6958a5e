"""Decoding throughput: beam search (K = 4) and greedy with the cached Transformer.

Workload (the one Flax examples/wmt was measured on): 32 sentences of 32 source tokens, 64
output steps forced (EOS forbidden by min_length, so no early exit), random parameters, float32
compute (or --dtype bfloat16).
Configs: small (vocab 8000, D 256, 3+3 layers, 4 heads, F 1024) and base (vocab 32000, D 512,
6+6, 8 heads, F 2048). Prints one JSON line per (config, method) with compile time separate
from run time; tokens/s counts the output tokens of the returned hypothesis (sentences x steps).
Flax examples/wmt beam-4 on the 2-core CPU: small 12.7 sentences/s, base 2.7; the bar is 2x.

  python benchmarks/speed/decode_throughput.py [--configs small base] [--methods beam greedy]
      [--dtype float32|bfloat16] [--cache auto|fixed|growing ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import ModelConfig, SearchConfig, Transformer
from flax_transformer.serving.translator import search_batch

CONFIGS = {
    "small": lambda: ModelConfig.small(8000),
    "base": lambda: ModelConfig.base(32000),
}
WMT_BEAM4_SENTENCES_PER_S = {"small": 12.7, "base": 2.7}  # Flax examples/wmt, same CPU.
EOS_ID = 1


def _inputs(vocab_size: int, sentences: int, source_len: int, seed: int = 0) -> jax.Array:
  """int32 [B, S]: random ids >= 3, EOS last."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab_size, size=(sentences, source_len), dtype=np.int32)
  ids[:, -1] = EOS_ID
  return jnp.asarray(ids)


GROW_CACHE = {"auto": "auto", "fixed": "no", "growing": "yes"}


def jit_search(model: Transformer, *, method: str = "beam", beam_size: int = 4,
               max_decode_len: int, min_length: int = 0, length_penalty: float = 0.6,
               length_normalization: str = "gnmt", grow_cache: str = "auto"):
  """The Translator's batched search, jitted: fn(variables, inputs [B, S], shortlist=None) ->
  (sequences [B, K, L], scores [B, K]); no length cap below `max_decode_len`; `shortlist`:
  int32 [V'], a vocabulary shortlist (`serving.shortlist`)."""
  settings = SearchConfig(method=method, beam_size=beam_size, length_penalty=length_penalty,
                          length_normalization=length_normalization, min_length=min_length,
                          max_len_a=0.0, max_len_b=max_decode_len, grow_cache=grow_cache)

  def run(variables, inputs, shortlist=None):
    return search_batch(model, variables["params"], inputs, jax.random.key(0),
                        shortlist=shortlist, settings=settings, max_decode_len=max_decode_len)

  return jax.jit(run)


def _measure(name: str, method: str, args: argparse.Namespace) -> list[dict]:
  """One JSON record per cache variant; the variants alternate round by round."""
  config = CONFIGS[name]().replace(
      dropout_rate=0.0, attention_dropout_rate=0.0, dtype=args.dtype)
  model = Transformer(config)
  inputs = _inputs(config.vocab_size, args.sentences, args.source_len)
  variables = jax.jit(model.init)(jax.random.key(0), inputs, inputs)
  compiled, compile_s = {}, {}
  for cache in args.cache:
    translate = jit_search(
        model, method=method, beam_size=args.beam_size, max_decode_len=args.steps,
        min_length=args.steps, length_penalty=0.6, grow_cache=GROW_CACHE[cache])
    start = time.perf_counter()
    compiled[cache] = translate.lower(variables, inputs).compile()
    compile_s[cache] = time.perf_counter() - start
    sequences, _ = jax.block_until_ready(compiled[cache](variables, inputs))  # Warm-up run.
    if not (np.asarray(sequences) != 0).all():
      raise RuntimeError("an output stopped before the forced number of steps")
  times = {cache: [] for cache in args.cache}
  for _ in range(args.repeats):
    for cache in args.cache:
      start = time.perf_counter()
      jax.block_until_ready(compiled[cache](variables, inputs))
      times[cache].append(time.perf_counter() - start)
  results = []
  for cache in args.cache:
    run_s = statistics.median(times[cache])
    result = dict(
        benchmark="decode_throughput", config=name, method=method,
        beam_size=args.beam_size if method == "beam" else 1, dtype=args.dtype, cache=cache,
        sentences=args.sentences, source_len=args.source_len, steps=args.steps,
        vocab_size=config.vocab_size, compile_s=round(compile_s[cache], 2),
        run_s=round(run_s, 4), run_s_min=round(min(times[cache]), 4),
        sentences_per_s=round(args.sentences / run_s, 2),
        tokens_per_s=round(args.sentences * args.steps / run_s, 1),
        backend=jax.default_backend(), devices=jax.device_count(), jax=jax.__version__,
        load_average_1min=round(os.getloadavg()[0], 2))  # Other processes share the CPU.
    if method == "beam" and args.beam_size == 4 and jax.default_backend() == "cpu":
      result["x_flax_wmt"] = round(result["sentences_per_s"] / WMT_BEAM4_SENTENCES_PER_S[name], 2)
    results.append(result)
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", nargs="+", default=["small", "base"], choices=list(CONFIGS))
  parser.add_argument("--methods", nargs="+", default=["beam", "greedy"],
                      choices=["beam", "greedy"])
  parser.add_argument("--sentences", type=int, default=32)
  parser.add_argument("--source_len", type=int, default=32)
  parser.add_argument("--steps", type=int, default=64)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                      help="compute dtype (parameters stay float32)")
  parser.add_argument("--cache", nargs="+", default=["auto"], choices=list(GROW_CACHE),
                      help="self-attention cache: fixed (L positions from the start), growing "
                           "(16, 32, 48, 64, then doubling), or auto (growing for beam search "
                           "on CPU); several alternate")
  args = parser.parse_args()
  for name in args.configs:
    for method in args.methods:
      for result in _measure(name, method, args):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
