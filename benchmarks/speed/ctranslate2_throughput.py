"""Beam search (K = 4) against CTranslate2's float32 beam search, same weights, one process.

The design bar: our beam search no slower than CTranslate2's float32 beam search on the same
workload. Each config's random parameters are converted to a CTranslate2 `TransformerSpec` by
the product's converter (`flax_transformer.interop.ctranslate2.build_spec`: our position table
set explicitly, our LayerNorm epsilon, decoding started from id 0 and ended at id 1, EOS
appended to sources by CTranslate2), and the conversion is checked before any timing:
teacher-forced token log-probabilities must agree within --tolerance, and greedy decoding must
give the same ids. Any failure raises.
Workload (as benchmarks/speed/decode_throughput.py): 32 sentences of 32 source tokens, beam 4, 64
output tokens forced (EOS forbidden until then, so no early exit), all sentences in one batch.
The two decoders alternate round by round after a warm-up call each; prints one JSON line per
config with the median times, sentences/s of each and ours_over_ct2 (> 1: ours faster), the
ratio of the medians. The machine's speed drifts by up to 20% over minutes on a shared VM, so it
also gives the ratio within each round (the two calls of a round run back to back) and their
median, ours_over_ct2_paired, which drift moves less.

  python benchmarks/speed/ctranslate2_throughput.py [--configs small base] [--repeats 5]
      [--ct2_threads 2]
  python benchmarks/speed/ctranslate2_throughput.py --our_precision int8 --ct2_compute_type int8 \
      --report_checks                           # like with like: int8 on both sides
  python benchmarks/speed/ctranslate2_throughput.py --ct2_device cuda --ct2_compute_type float16 \
      --our_dtype bfloat16 --report_checks      # on a GPU: fp16/bf16 rounding, checks reported
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ctranslate2
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from ctranslate2.specs import transformer_spec
from decode_throughput import jit_search  # benchmarks/speed/decode_throughput.py, beside this file

from flax_transformer import ModelConfig, Transformer
from flax_transformer.interop import ctranslate2 as ctranslate2_export
from flax_transformer.model import int8_kernel, precision

CONFIGS = {
    "small": lambda: ModelConfig.small(8000),
    "base": lambda: ModelConfig.base(32000),
}
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2  # Id 0 is also our decoder's start (BOS) input.
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
LENGTH_PENALTY = 0.6

Params = dict[str, Any]


def _inputs(vocab_size: int, sentences: int, source_len: int, seed: int = 0) -> jax.Array:
  """int32 [B, S]: random ids >= 3, EOS last."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab_size, size=(sentences, source_len), dtype=np.int32)
  ids[:, -1] = EOS_ID
  return jnp.asarray(ids)


def vocabulary(vocab_size: int) -> list[str]:
  """The CTranslate2 vocabulary: token i is our id i ("<pad>", "</s>", "<unk>", "w3", ...)."""
  return [*SPECIAL_TOKENS, *(f"w{i}" for i in range(len(SPECIAL_TOKENS), vocab_size))]


# --------------------------------------------------------------------------------------------
# Conversion: the product's converter (flax_transformer.interop.ctranslate2)
# --------------------------------------------------------------------------------------------
def build_spec(config: ModelConfig, variables: Any) -> transformer_spec.TransformerSpec:
  """Our parameters as a CTranslate2 TransformerSpec over the fake vocabulary."""
  params = jax.tree.map(np.asarray, nn.unbox(variables["params"]))
  return ctranslate2_export.build_spec(config, params, vocabulary(config.vocab_size))


def load_translator(spec: transformer_spec.TransformerSpec, directory: str, threads: int,
                    device: str = "cpu", compute_type: str = "float32"
                    ) -> ctranslate2.Translator:
  """Validates, saves (float32) and loads the model on `device`, computing in `compute_type`."""
  spec.validate()
  spec.optimize(quantization="float32")  # Also aliases the shared embedding/projection.
  spec.save(directory)
  return ctranslate2.Translator(directory, device=device, compute_type=compute_type,
                                intra_threads=threads, inter_threads=1)


# --------------------------------------------------------------------------------------------
# Faithfulness checks
# --------------------------------------------------------------------------------------------
def _strings(ids: np.ndarray, tokens: list[str]) -> list[str]:
  return [tokens[i] for i in ids]


def _source(ids: np.ndarray, tokens: list[str]) -> list[str]:
  """A source row (ids, EOS, padding) as CTranslate2 takes it: the pieces before EOS, since
  the exported model appends EOS itself (`add_source_eos`)."""
  ids = [int(i) for i in ids if i != PAD_ID]
  return _strings(ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids, tokens)


def check_scores(model: Transformer, variables: Any, translator: ctranslate2.Translator,
                 vocab_size: int, tolerance: float, seed: int = 1, strict: bool = True
                 ) -> float:
  """Teacher-forced log-probabilities of random targets, ours vs CTranslate2's `score_batch`.

  Sources and targets of different lengths (so both sides pad and mask), EOS scored too.
  Returns the largest absolute difference per token; raises if it exceeds `tolerance` (when
  `strict`).
  """
  rng = np.random.default_rng(seed)
  tokens = vocabulary(vocab_size)
  source_lengths, target_lengths = (32, 20, 11, 7), (16, 5, 12, 9)  # Tokens before EOS.
  batch = len(source_lengths)
  inputs = np.zeros((batch, max(source_lengths) + 1), np.int32)
  targets = np.zeros((batch, max(target_lengths) + 1), np.int32)
  for b, (s, t) in enumerate(zip(source_lengths, target_lengths, strict=True)):
    inputs[b, :s] = rng.integers(3, vocab_size, size=s)
    inputs[b, s] = EOS_ID
    targets[b, :t] = rng.integers(3, vocab_size, size=t)
    targets[b, t] = EOS_ID
  logits = model.apply(variables, jnp.asarray(inputs), jnp.asarray(targets))
  ours = np.asarray(jnp.take_along_axis(
      jax.nn.log_softmax(logits, axis=-1), jnp.asarray(targets)[..., None], axis=-1)[..., 0])
  results = translator.score_batch(
      [_source(inputs[b], tokens) for b in range(batch)],
      [_strings(targets[b, :t], tokens) for b, t in enumerate(target_lengths)])  # EOS added.
  worst = 0.0
  for b, (t, result) in enumerate(zip(target_lengths, results, strict=True)):
    theirs = np.asarray(result.log_probs, np.float32)
    if theirs.shape != (t + 1,):
      raise RuntimeError(f"score_batch returned {theirs.shape[0]} scores for {t} tokens + EOS")
    worst = max(worst, float(np.max(np.abs(theirs - ours[b, :t + 1]))))
  if strict and not worst <= tolerance:
    raise RuntimeError(f"teacher-forced log-probabilities differ by {worst:.2e} > {tolerance}")
  return worst


def _ids(hypothesis: list[str], token_ids: dict[str, int]) -> list[int]:
  return [token_ids[token] for token in hypothesis]


def check_greedy(model: Transformer, variables: Any, translator: ctranslate2.Translator,
                 inputs: jax.Array, vocab_size: int, max_len: int = 20, strict: bool = True
                 ) -> int:
  """Greedy decoding of `inputs`, ours vs CTranslate2's (beam 1): the ids must be equal.

  Both emit at most `max_len` tokens, EOS included, EOS allowed from the first step, padding
  never emitted. Returns the number of equal sentences; raises on any difference (when
  `strict`).
  """
  tokens = vocabulary(vocab_size)
  token_ids = {token: i for i, token in enumerate(tokens)}
  sequences, _ = jit_search(model, method="greedy", max_decode_len=max_len)(variables, inputs)
  sequences = sequences[:, 0]  # [B, L]
  results = translator.translate_batch(
      [_source(row, tokens) for row in np.asarray(inputs)], beam_size=1,
      max_decoding_length=max_len, min_decoding_length=0, return_end_token=True,
      suppress_sequences=[[SPECIAL_TOKENS[PAD_ID]]])
  mismatches = []
  for b, (row, result) in enumerate(zip(np.asarray(sequences), results, strict=True)):
    ours = [int(i) for i in row if i != PAD_ID]
    theirs = _ids(result.hypotheses[0], token_ids)
    if ours != theirs:
      mismatches.append(f"sentence {b}: ours {ours} vs CTranslate2 {theirs}")
  if strict and mismatches:
    raise RuntimeError("greedy decoding differs:\n" + "\n".join(mismatches))
  return len(results) - len(mismatches)


# --------------------------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
  start = time.perf_counter()
  result = fn()
  return time.perf_counter() - start, result


def _measure(name: str, args: argparse.Namespace) -> dict:
  """Converts, checks, then times both beam searches alternately; one JSON record."""
  trained = CONFIGS[name]().replace(dropout_rate=0.0, attention_dropout_rate=0.0,
                                    dtype=args.our_dtype)
  inputs = _inputs(trained.vocab_size, args.sentences, args.source_len)
  variables = jax.jit(Transformer(trained).init)(jax.random.key(0), inputs, inputs)
  tokens = vocabulary(trained.vocab_size)
  token_ids = {token: i for i, token in enumerate(tokens)}
  with tempfile.TemporaryDirectory(prefix="ct2_") as directory:
    translator = load_translator(build_spec(trained, variables), directory, args.ct2_threads,
                                 args.ct2_device, args.ct2_compute_type)
  # Ours at --our_precision, converted from the same weights as a Translator would convert them.
  config = precision.precision_config(trained, args.our_precision)
  variables = {"params": precision.convert_params(nn.unbox(variables["params"]), config)}
  model = Transformer(config)
  strict = not args.report_checks
  score_diff = check_scores(model, variables, translator, config.vocab_size, args.tolerance,
                            strict=strict)
  greedy_equal = check_greedy(model, variables, translator, inputs[:args.greedy_sentences],
                              config.vocab_size, strict=strict)

  translate = jit_search(
      model, beam_size=args.beam_size, max_decode_len=args.steps, min_length=args.steps,
      length_penalty=LENGTH_PENALTY, length_normalization="fairseq")  # CTranslate2's formula
  compile_s, compiled = _timed(lambda: translate.lower(variables, inputs).compile())
  source = [_source(row, tokens) for row in np.asarray(inputs)]
  ct2_options = dict(
      max_batch_size=args.sentences, beam_size=args.beam_size, length_penalty=LENGTH_PENALTY,
      min_decoding_length=args.steps, max_decoding_length=args.steps, return_scores=True,
      suppress_sequences=[[SPECIAL_TOKENS[PAD_ID]]])  # Ours never emits padding either.
  run = {
      "ours": lambda: jax.block_until_ready(compiled(variables, inputs)),
      "ct2": lambda: translator.translate_batch(source, **ct2_options),
  }
  outputs = {decoder: fn() for decoder, fn in run.items()}  # Warm-up calls.
  ours_sequences = np.asarray(outputs["ours"][0])[:, 0]  # The best of K: [B, L].
  if not (ours_sequences != PAD_ID).all():
    raise RuntimeError("ours: an output stopped before the forced number of steps")
  ct2_sequences = [_ids(result.hypotheses[0], token_ids) for result in outputs["ct2"]]
  if any(len(ids) != args.steps for ids in ct2_sequences):
    raise RuntimeError(f"CTranslate2: an output does not have {args.steps} tokens")
  same_output = sum(ours_sequences[b].tolist() == ids for b, ids in enumerate(ct2_sequences))

  times = {decoder: [] for decoder in run}
  for round_index in range(args.repeats):
    order = list(run) if round_index % 2 == 0 else list(reversed(run))
    for decoder in order:
      time.sleep(args.pause_s)  # Let the other runtime's worker threads stop spinning.
      times[decoder].append(_timed(run[decoder])[0])
  median = {decoder: statistics.median(times[decoder]) for decoder in run}
  speed = {decoder: args.sentences / median[decoder] for decoder in run}
  paired = [ct2 / ours for ours, ct2 in zip(times["ours"], times["ct2"], strict=True)]
  return dict(
      benchmark="ctranslate2_throughput", config=name, beam_size=args.beam_size,
      dtype=args.our_dtype, precision=args.our_precision, sentences=args.sentences,
      source_len=args.source_len, steps=args.steps,
      vocab_size=config.vocab_size, repeats=args.repeats,
      ours_sentences_per_s=round(speed["ours"], 2), ct2_sentences_per_s=round(speed["ct2"], 2),
      ours_over_ct2=round(speed["ours"] / speed["ct2"], 3),
      ours_over_ct2_paired=round(statistics.median(paired), 3),
      ours_over_ct2_rounds=[round(r, 3) for r in paired],
      ours_run_s=round(median["ours"], 4), ct2_run_s=round(median["ct2"], 4),
      ours_run_s_all=[round(t, 4) for t in times["ours"]],
      ct2_run_s_all=[round(t, 4) for t in times["ct2"]],
      ours_compile_s=round(compile_s, 2),
      same_beam_output=f"{same_output}/{args.sentences}",
      check_max_abs_logprob_diff=float(f"{score_diff:.3g}"),
      check_greedy_equal=f"{greedy_equal}/{len(inputs[:args.greedy_sentences])}",
      ct2_device=args.ct2_device, ct2_compute_type=args.ct2_compute_type,
      ct2_intra_threads=args.ct2_threads, ct2_inter_threads=1,
      backend=jax.default_backend(), cpu_count=os.cpu_count(), jax=jax.__version__,
      int8_kernel=int8_kernel.kernel() if args.our_precision == "int8" else None,
      int8_products=int8_kernel.choices() if args.our_precision == "int8" else None,
      ctranslate2=ctranslate2.__version__,
      load_average_1min=round(os.getloadavg()[0], 2),  # Other processes share the CPU.
      date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", nargs="+", default=["small", "base"], choices=list(CONFIGS))
  parser.add_argument("--sentences", type=int, default=32)
  parser.add_argument("--source_len", type=int, default=32)
  parser.add_argument("--steps", type=int, default=64)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--ct2_threads", type=int, default=2,
                      help="CTranslate2 intra_threads (the machine has 2 cores)")
  parser.add_argument("--pause_s", type=float, default=0.2,
                      help="sleep before each timed call")
  parser.add_argument("--tolerance", type=float, default=1e-4,
                      help="largest allowed teacher-forced log-probability difference")
  parser.add_argument("--greedy_sentences", type=int, default=8)
  parser.add_argument("--ct2_device", default="cpu", choices=("cpu", "cuda"))
  parser.add_argument("--ct2_compute_type", default="float32",
                      help="CTranslate2 compute type, e.g. float32, float16, bfloat16")
  parser.add_argument("--our_dtype", default="float32", choices=("float32", "bfloat16"),
                      help="our compute dtype (parameters stay float32)")
  parser.add_argument("--our_precision", default="float32", choices=precision.PRECISIONS,
                      help="our serving precision (model.precision): float32 as trained, "
                           "bfloat16 weights and compute, int8 w8a8 projections")
  parser.add_argument("--report_checks", action="store_true",
                      help="report the faithfulness checks instead of raising (reduced "
                           "precision on a GPU rounds differently)")
  args = parser.parse_args()
  for name in args.configs:
    print(json.dumps(_measure(name, args)), flush=True)


if __name__ == "__main__":
  main()
