"""A random model of NLLB-200-distilled-600M's shape: load time, weight memory per precision,
beam-4 speed against CTranslate2 on the same weights, and the output projection's share.

The shape is the checkpoint's (config.json of facebook/nllb-200-distilled-600M): D 1024, 16
heads, F 4096, 12+12 layers, a shared vocabulary of 256,206 rows, pre-norm with final
LayerNorms, fairseq sinusoids from row 2, ReLU, the decoder started from EOS: the
`ModelConfig` that `import-hf` makes of it, with random weights (no download). CTranslate2
gets the same weights through our exporter (`interop.ctranslate2.build_spec`), as
benchmarks/speed/ctranslate2_throughput.py does; a random model never chooses EOS, so both
sides decode exactly --steps tokens (min length = max length).

Prints one JSON line:
  load_s             restoring the float32 params from a workdir checkpoint (orbax), and
                     CTranslate2 loading its float32 model.bin
  weight_bytes       our params at float32 / bfloat16 / int8 (`model.precision`), and
                     CTranslate2's model.bin at float32 / int8
  sentences_per_s    beam 4, --sentences sentences of --source_len tokens, --steps output
                     tokens: ours at each precision, CTranslate2 float32 and int8
  projection_share   the output projection ([B*K, D] x [D, V] and the log-softmax over V) over
                     one beam step (a whole search's time / steps), float32

With --shortlist_size N, a vocabulary shortlist of N ids (random, sorted, with the special ids;
`serving.shortlist`, padded to a multiple of 128 as the Translator pads it) restricts both
sides' output vocabulary to the same set: ours with the shortlist at each precision
(`sentences_per_s` ours_<precision>_shortlist), CTranslate2 with `use_vmap=True` on a
vocabulary map of one line, an empty source side and the N target tokens (its
always-included candidates), ct2_<precision>_vmap; `projection_share_shortlist` is the
projection over the shortlist's rows against the full float32 step. About 20,000 ids is what
one language's text makes of NLLB-200's vocabulary.

--int8_kernels xla onednn_matmul onednn_gemm times int8 once per product
(`model.int8_kernel`, FLAX_TRANSFORMER_INT8_KERNEL; `auto` is the default's measured choice),
keyed ours_int8[KERNEL]; the products give the same bits, so only the speed differs.

--small swaps the 615M shape for a tiny one of the same kind (vocabulary 8,192, D 64, 2+2
layers) that only checks that the script runs.

  python benchmarks/speed/nllb_shape.py [--sentences 4] [--source_len 16] [--steps 16]
      [--repeats 2] [--precisions float32 int8] [--ct2_threads 2] [--shortlist_size 20000]
      [--int8_kernels auto xla onednn_matmul onednn_gemm] [--small]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from typing import Any

import ctranslate2
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from ctranslate2_throughput import _inputs, _source, build_spec, vocabulary
from decode_throughput import jit_search

from flax_transformer import ModelConfig, Transformer
from flax_transformer import workdir as workdir_lib
from flax_transformer.files import to_path
from flax_transformer.model import int8_kernel, precision
from flax_transformer.serving import shortlist as shortlist_lib

# facebook/nllb-200-distilled-600M as import-hf reads it.
NLLB_600M = dict(vocab_size=256206, emb_dim=1024, num_heads=16, mlp_dim=4096,
                 num_encoder_layers=12, num_decoder_layers=12, max_len=1024,
                 norm_placement="pre", sinusoid_layout="fairseq", position_offset=2,
                 layer_norm_epsilon=1e-5, attention_bias=True, activation="relu",
                 decoder_start_id=1, dropout_rate=0.0, attention_dropout_rate=0.0)
SMALL = dict(NLLB_600M, vocab_size=8192, emb_dim=64, num_heads=4, mlp_dim=128,
             num_encoder_layers=2, num_decoder_layers=2, max_len=64)  # --small: a script check.
CT2_TYPES = {"float32": "float32", "int8": "int8"}


def _nbytes(tree: Any) -> int:
  return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(tree)))


def _median_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _shortlist(vocab_size: int, size: int, seed: int = 0) -> np.ndarray:
  """int32 [V']: `size` random ids, the special ids 0, 1, 2 among them, ascending, padded to a
  multiple of 128 by repeating the last (as `Translator.shortlist_ids`)."""
  rng = np.random.default_rng(seed)
  others = rng.choice(np.arange(3, vocab_size), size - 3, replace=False)
  return shortlist_lib.padded(np.unique(np.concatenate([[0, 1, 2], others]).astype(np.int32)))


def _projection_s(config: ModelConfig, params: Any, rows: int, repeats: int,
                  shortlist: np.ndarray | None = None) -> float:
  """One step's output projection and log-softmax over V (or the shortlist's V' rows, gathered
  beforehand as the search gathers them once per batch) for `rows` beams, float32."""
  table = jnp.asarray(params["embedder"]["embedding"])  # [V, D], tied
  if shortlist is not None:
    table = table[jnp.asarray(shortlist)]  # [V', D]

  @jax.jit
  def project(x):
    return jax.nn.log_softmax(jnp.einsum("rd,vd->rv", x, table), axis=-1)

  x = jax.random.normal(jax.random.key(1), (rows, config.emb_dim), jnp.float32)
  jax.block_until_ready(project(x))
  return _median_time(lambda: jax.block_until_ready(project(x)), max(3, repeats))


def _ct2(config: ModelConfig, params: Any, kind: str, source: list[list[str]],
         options: dict[str, Any], args: argparse.Namespace, vmap: list[str] | None = None
         ) -> tuple[int, float, float, float | None]:
  """(model.bin bytes, load seconds, sentences/s, sentences/s with `use_vmap` over the target
  tokens `vmap`, None without) of CTranslate2 at `kind` on our weights."""
  # A copy: the spec holds some of the arrays it is given, and quantizing rewrites them.
  spec = build_spec(config, {"params": jax.tree.map(np.array, params)})
  spec.validate()
  spec.optimize(quantization=CT2_TYPES[kind])
  with tempfile.TemporaryDirectory(prefix="ct2_") as directory:
    spec.save(directory)
    del spec
    size = os.path.getsize(os.path.join(directory, "model.bin"))
    if vmap is not None:  # Read when the model loads; used only by calls with use_vmap.
      with open(os.path.join(directory, "vmap.txt"), "w", encoding="utf-8") as file:
        file.write("\t" + " ".join(vmap) + "\n")  # Empty source side: always candidates.
    start = time.perf_counter()
    translator = ctranslate2.Translator(directory, device="cpu", compute_type=CT2_TYPES[kind],
                                        intra_threads=args.ct2_threads, inter_threads=1)
    load_s = round(time.perf_counter() - start, 2)
  translator.translate_batch(source, **options)  # Warm-up.
  seconds = _median_time(lambda: translator.translate_batch(source, **options), args.repeats)
  vmap_speed = None
  if vmap is not None:
    results = translator.translate_batch(source, use_vmap=True, **options)  # Warm-up.
    if not {t for r in results for t in r.hypotheses[0]} <= set(vmap):
      raise RuntimeError("CTranslate2 wrote a token outside its vocabulary map")
    vmap_s = _median_time(lambda: translator.translate_batch(source, use_vmap=True, **options),
                          args.repeats)
    vmap_speed = round(args.sentences / vmap_s, 3)
  return size, load_s, round(args.sentences / seconds, 3), vmap_speed


def _ours(config: ModelConfig, params: Any, name: str, inputs: jax.Array,
          args: argparse.Namespace, shortlist: np.ndarray | None = None) -> tuple[int, float]:
  """(weight bytes, median seconds of one beam-4 search) of ours at precision `name` (over
  the vocabulary `shortlist` when given)."""
  served = precision.precision_config(config, name)
  variables = {"params": precision.convert_params(params, served)}
  search = jit_search(Transformer(served), beam_size=4, max_decode_len=args.steps,
                      min_length=args.steps, length_penalty=1.0, length_normalization="fairseq")
  kept = None if shortlist is None else jnp.asarray(shortlist)
  compiled = search.lower(variables, inputs, kept).compile()
  run = lambda: jax.block_until_ready(compiled(variables, inputs, kept))
  sequences, _ = run()  # Warm-up.
  if shortlist is not None and not np.isin(np.asarray(sequences), shortlist).all():
    raise RuntimeError("ours wrote an id outside the shortlist")
  return _nbytes(variables["params"]), _median_time(run, args.repeats)


def measure(args: argparse.Namespace) -> dict:
  config = ModelConfig(**(SMALL if args.small else NLLB_600M))
  inputs = _inputs(config.vocab_size, args.sentences, args.source_len)
  variables = jax.jit(Transformer(config).init)(jax.random.key(0), inputs[:, :4], inputs[:, :4])
  params = jax.tree.map(np.asarray, nn.unbox(variables["params"]))
  del variables
  record: dict[str, Any] = {"benchmark": "nllb_shape",
                            "shape": "small" if args.small else "nllb-200-distilled-600M",
                            "parameters": int(sum(p.size for p in jax.tree.leaves(params)))}
  with tempfile.TemporaryDirectory(prefix="nllb_") as folder:
    workdir_lib.save_params(to_path(folder), 0, params)
    start = time.perf_counter()
    workdir_lib.restore_params(folder, 0)
    record["load_s"] = {"ours_float32": round(time.perf_counter() - start, 2)}
  tokens = vocabulary(config.vocab_size)
  source = [_source(row, tokens) for row in np.asarray(inputs)]
  options = dict(max_batch_size=args.sentences, beam_size=4, length_penalty=1.0,
                 min_decoding_length=args.steps, max_decoding_length=args.steps,
                 suppress_sequences=[[tokens[0]]])
  shortlist = (_shortlist(config.vocab_size, args.shortlist_size) if args.shortlist_size
               else None)
  vmap = None if shortlist is None else [tokens[i] for i in np.unique(shortlist)]
  speed, weight_bytes = {}, {}
  for kind in CT2_TYPES:
    weight_bytes[f"ct2_{kind}"], load_s, speed[f"ct2_{kind}"], vmap_speed = _ct2(
        config, params, kind, source, options, args, vmap)
    if vmap_speed is not None:
      speed[f"ct2_{kind}_vmap"] = vmap_speed
    if kind == "float32":
      record["load_s"]["ct2_float32"] = load_s
  step_s = None
  for name in args.precisions:
    # int8 once per --int8_kernels product (model/int8_kernel.py: the same bits, side by side).
    for kernel in (args.int8_kernels if name == "int8" else ["auto"]):
      os.environ["FLAX_TRANSFORMER_INT8_KERNEL"] = kernel
      key = f"ours_{name}" + ("" if kernel == "auto" else f"[{kernel}]")
      weight_bytes[f"ours_{name}"], seconds = _ours(config, params, name, inputs, args)
      speed[key] = round(args.sentences / seconds, 3)
      if name == "float32":
        step_s = seconds / args.steps
      if shortlist is not None:
        _, seconds = _ours(config, params, name, inputs, args, shortlist)
        speed[f"{key}_shortlist"] = round(args.sentences / seconds, 3)
    os.environ["FLAX_TRANSFORMER_INT8_KERNEL"] = "auto"
    if name == "int8":
      record["int8_products_auto"] = int8_kernel.choices()
      record["onednn"] = int8_kernel.load().onednn_version or int8_kernel.load().reason
  record.update(weight_bytes=weight_bytes, sentences_per_s=speed)
  for key in [key for key in speed if key.startswith("ours_") and not key.endswith("_shortlist")]:
    name = key.removeprefix("ours_").split("[")[0]
    if name in CT2_TYPES:
      ratio = key.removeprefix("ours_")
      record.setdefault("ours_over_ct2", {})[ratio] = round(speed[key] / speed[f"ct2_{name}"], 3)
      if shortlist is not None:
        record["ours_over_ct2"][f"{ratio}_shortlist_vmap"] = round(
            speed[f"{key}_shortlist"] / speed[f"ct2_{name}_vmap"], 3)
  if step_s:
    projection = _projection_s(config, params, 4 * args.sentences, args.repeats)
    record["projection_share"] = round(projection / step_s, 3)
    record["step_s_float32"] = round(step_s, 4)
    if shortlist is not None:
      projection = _projection_s(config, params, 4 * args.sentences, args.repeats, shortlist)
      record["projection_share_shortlist"] = round(projection / step_s, 3)
  if shortlist is not None:
    record.update(shortlist_size=args.shortlist_size, shortlist_padded=len(shortlist))
  record.update(sentences=args.sentences, source_len=args.source_len, steps=args.steps,
                repeats=args.repeats, ct2_intra_threads=args.ct2_threads,
                cpu_count=os.cpu_count(), jax=jax.__version__,
                ctranslate2=ctranslate2.__version__,
                load_average_1min=round(os.getloadavg()[0], 2),
                date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
  return record


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sentences", type=int, default=4)
  parser.add_argument("--source_len", type=int, default=16)
  parser.add_argument("--steps", type=int, default=16, help="output tokens, both sides")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16", "int8"],
                      choices=precision.PRECISIONS)
  parser.add_argument("--ct2_threads", type=int, default=os.cpu_count())
  parser.add_argument("--int8_kernels", nargs="+", default=["auto"], choices=int8_kernel.KERNELS,
                      help="int8's product, each timed (FLAX_TRANSFORMER_INT8_KERNEL)")
  parser.add_argument("--shortlist_size", type=int, default=0,
                      help="also measure both sides over a vocabulary shortlist of this many "
                      "ids (ours: vocab_shortlist; CTranslate2: use_vmap); 0: none")
  parser.add_argument("--small", action="store_true",
                      help="a tiny model of the same kind: checks that the script runs")
  print(json.dumps(measure(parser.parse_args())), flush=True)


if __name__ == "__main__":
  main()
