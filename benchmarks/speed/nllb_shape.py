"""A random model of a checkpoint's shape (--shape): load time, weight memory per precision,
beam-4 speed against CTranslate2 on the same weights, and the output projection's share.

Each shape is the `ModelConfig` that `import-hf` makes of the checkpoint's config.json, with
random weights (no download):

  nllb-600m     facebook/nllb-200-distilled-600M: D 1024, 16 heads, F 4096, 12+12 layers, a
                shared vocabulary of 256,206 rows, pre-norm with final LayerNorms, fairseq
                sinusoids from row 2, ReLU, the decoder started from EOS (the default)
  t5-base       google-t5/t5-base (T5 v1.0): D 768, 12 heads of 64, F 3072 ReLU, 12+12 layers,
                vocabulary 32,128, RMS pre-norm, relative buckets, the head tied and scaled
  t5-v1_1-base  google/t5-v1_1-base: as t5-base with F 2048 gated-GELU and an untied head
  madlad-3b     google/madlad400-3b-mt: D 1024, 16 heads of 128, F 8192 gated-GELU, 32+32
                layers, vocabulary 256,000, an untied head (2.94B parameters: 11.8 GB at
                float32; see --no_load)

(T5 shapes through `interop.t5.model_config_from_t5` of the config.json fields above.) The
weights are drawn leaf by leaf into .npy files under a temporary folder ($TMPDIR) and read
back memory-mapped (copy-on-write), so a 3B model is never held twice in memory: CTranslate2
runs first, its model freed before ours is built, one precision at a time. CTranslate2 gets the
same weights through our exporter (the family's `ctranslate2_spec`: `interop.ctranslate2.
build_spec`, or `interop.t5.ctranslate2_spec` for T5); a random model never chooses EOS, so
both sides decode exactly --steps tokens (min length = max length).

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

--small swaps the shape for a tiny one of the same kind (vocabulary 8,192, D 64, 2+2 layers)
that only checks that the script runs. --no_load skips the orbax save and restore (load_s).
CTranslate2 runs at the --precisions it has (float32, int8).

  python benchmarks/speed/nllb_shape.py [--shape nllb-600m|t5-base|t5-v1_1-base|madlad-3b]
      [--sentences 4] [--source_len 16] [--steps 16] [--repeats 2] [--precisions float32 int8]
      [--ct2_threads 2] [--shortlist_size 20000] [--no_load]
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
from ctranslate2_throughput import _inputs, _source, vocabulary
from decode_throughput import jit_search

from flax_transformer import ModelConfig, Transformer
from flax_transformer import workdir as workdir_lib
from flax_transformer.files import to_path
from flax_transformer.interop import ctranslate2 as ctranslate2_export
from flax_transformer.interop import t5
from flax_transformer.model import int8_kernel, precision
from flax_transformer.serving import shortlist as shortlist_lib

# facebook/nllb-200-distilled-600M as import-hf reads it.
NLLB_600M = dict(vocab_size=256206, emb_dim=1024, num_heads=16, mlp_dim=4096,
                 num_encoder_layers=12, num_decoder_layers=12, max_len=1024,
                 norm_placement="pre", sinusoid_layout="fairseq", position_offset=2,
                 layer_norm_epsilon=1e-5, attention_bias=True, activation="relu",
                 decoder_start_id=1, dropout_rate=0.0, attention_dropout_rate=0.0)
# config.json's fields of the T5 checkpoints (the rest: T5Config's defaults, `t5.DEFAULTS`).
T5_BASE = dict(model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=32128,
               d_model=768, d_kv=64, num_heads=12, d_ff=3072, num_layers=12,
               feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.0)
T5_V1_1_BASE = dict(T5_BASE, d_ff=2048, feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False)
MADLAD_3B = dict(T5_BASE, vocab_size=256000, d_model=1024, d_kv=128, num_heads=16, d_ff=8192,
                 num_layers=32, num_decoder_layers=32, feed_forward_proj="gated-gelu",
                 tie_word_embeddings=False)
T5_SHAPES = {"t5-base": T5_BASE, "t5-v1_1-base": T5_V1_1_BASE, "madlad-3b": MADLAD_3B}
SHAPES = ("nllb-600m", *T5_SHAPES)
SMALL_NLLB = dict(NLLB_600M, vocab_size=8192, emb_dim=64, num_heads=4, mlp_dim=128,
                  num_encoder_layers=2, num_decoder_layers=2, max_len=64)  # --small.
SMALL_T5 = dict(vocab_size=8192, d_model=64, num_heads=4, d_ff=128, num_layers=2,
                num_decoder_layers=2)  # --small; MADLAD's keeps d_kv 128 (heads wider than D/N).
CT2_TYPES = {"float32": "float32", "int8": "int8"}


def shape_config(shape: str, small: bool = False) -> ModelConfig:
  """The `ModelConfig` import-hf makes of `shape`'s checkpoint (a tiny one with `small`)."""
  if shape == "nllb-600m":
    return ModelConfig(**(SMALL_NLLB if small else NLLB_600M))
  fields = dict(T5_SHAPES[shape], **(SMALL_T5 if small else {}))
  return t5.model_config_from_t5(fields, tied=fields["tie_word_embeddings"])


def _nbytes(tree: Any) -> int:
  return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(tree)))


def _median_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def write_random_params(config: ModelConfig, folder: str, seed: int = 0) -> int:
  """Draws `config`'s parameters leaf by leaf into `folder`/<path>.npy: kernels and tables
  N(0, 1/fan_in) (fan_in: the first axis, or the leading axes of an output kernel), norm scales
  1, biases 0, float32. Returns the parameter count."""
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  shapes = nn.unbox(jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens,
                                   tokens)["params"])
  rng, count = np.random.default_rng(seed), 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    names = [key.key for key in path]
    array = np.lib.format.open_memmap(os.path.join(folder, "/".join(names).replace("/", "~")
                                                   + ".npy"), "w+", np.float32, leaf.shape)
    if names[-1] == "scale":
      array[...] = 1.0
    elif names[-1] == "bias":
      array[...] = 0.0
    else:  # Row by row: a [V, D] table is drawn without a second float64 copy.
      fan_in = leaf.shape[-1] if names[-1] == "embedding" else (
          int(np.prod(leaf.shape[:-1])) if names[-2] == "output" else leaf.shape[0])
      for i in range(leaf.shape[0]):
        array[i] = rng.standard_normal(leaf.shape[1:], np.float32) * fan_in**-0.5
    array.flush()
    count += leaf.size
    del array
  return count


def read_params(folder: str) -> Any:
  """The parameters `write_random_params` wrote: copy-on-write memory maps, a fresh tree each
  call (CTranslate2 may rewrite what its spec is given; the files stay as drawn)."""
  params: dict[str, Any] = {}
  for name in sorted(os.listdir(folder)):
    *parents, leaf = name.removesuffix(".npy").split("~")
    node = params
    for parent in parents:
      node = node.setdefault(parent, {})
    node[leaf] = np.load(os.path.join(folder, name), mmap_mode="c")
  return params


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
  head = params["decoder"].get("output_projection")
  table = jnp.asarray(params["embedder"]["embedding"] if head is None  # [V, D], tied
                      else np.asarray(head["kernel"]).T)  # untied: [D, V] as [V, D]
  if shortlist is not None:
    table = table[jnp.asarray(shortlist)]  # [V', D]

  @jax.jit
  def project(x):
    return jax.nn.log_softmax(jnp.einsum("rd,vd->rv", x, table), axis=-1)

  x = jax.random.normal(jax.random.key(1), (rows, config.emb_dim), jnp.float32)
  jax.block_until_ready(project(x))
  return _median_time(lambda: jax.block_until_ready(project(x)), max(3, repeats))


def ctranslate2_spec(config: ModelConfig, params: Any, tokens: list[str]) -> Any:
  """The exporter's spec of `params` (the family's: T5's for relative-position buckets)."""
  if config.relative_attention_num_buckets:
    return t5.ctranslate2_spec(config, params, tokens)
  return ctranslate2_export.build_spec(config, params, tokens)


def _ct2(config: ModelConfig, folder: str, kind: str, source: list[list[str]],
         options: dict[str, Any], args: argparse.Namespace, vmap: list[str] | None = None
         ) -> tuple[int, float, float, float | None]:
  """(model.bin bytes, load seconds, sentences/s, sentences/s with `use_vmap` over the target
  tokens `vmap`, None without) of CTranslate2 at `kind` on the weights in `folder`."""
  spec = ctranslate2_spec(config, read_params(folder), vocabulary(config.vocab_size))
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


def _ours(config: ModelConfig, folder: str, name: str, inputs: jax.Array,
          args: argparse.Namespace, shortlist: np.ndarray | None = None) -> tuple[int, float]:
  """(weight bytes, median seconds of one beam-4 search) of ours at precision `name` (over
  the vocabulary `shortlist` when given), on the weights in `folder`."""
  served = precision.precision_config(config, name)
  params = read_params(folder)  # Leaf by leaf onto the device, never copied twice:
  params = (jax.tree.map(jnp.asarray, precision.convert_params(params, served))
            if served.quantization == "int8"
            else jax.tree.map(lambda p: jnp.asarray(p, served.parameter_dtype), params))
  variables = {"params": params}
  search = jit_search(Transformer(served), beam_size=4, max_decode_len=args.steps,
                      min_length=args.steps, length_penalty=1.0, length_normalization="fairseq")
  kept = None if shortlist is None else jnp.asarray(shortlist)
  compiled = search.lower(variables, inputs, kept).compile()
  run = lambda: jax.block_until_ready(compiled(variables, inputs, kept))
  sequences, _ = run()  # Warm-up.
  if shortlist is not None and not np.isin(np.asarray(sequences), shortlist).all():
    raise RuntimeError("ours wrote an id outside the shortlist")
  return _nbytes(variables["params"]), _median_time(run, args.repeats)


def _measure_ct2(config: ModelConfig, folder: str, inputs: jax.Array, record: dict,
                 args: argparse.Namespace, shortlist: np.ndarray | None) -> None:
  """CTranslate2 at each of --precisions it has: record's weight_bytes, sentences_per_s."""
  tokens = vocabulary(config.vocab_size)
  source = [_source(row, tokens) for row in np.asarray(inputs)]
  options = dict(max_batch_size=args.sentences, beam_size=4, length_penalty=1.0,
                 min_decoding_length=args.steps, max_decoding_length=args.steps,
                 suppress_sequences=[[tokens[0]]])
  vmap = None if shortlist is None else [tokens[i] for i in np.unique(shortlist)]
  speed, weight_bytes = record["sentences_per_s"], record["weight_bytes"]
  for kind in [kind for kind in CT2_TYPES if kind in args.precisions]:
    weight_bytes[f"ct2_{kind}"], load_s, speed[f"ct2_{kind}"], vmap_speed = _ct2(
        config, folder, kind, source, options, args, vmap)
    if vmap_speed is not None:
      speed[f"ct2_{kind}_vmap"] = vmap_speed
    if kind == "float32":
      record.setdefault("load_s", {})["ct2_float32"] = load_s


def _measure_ours(config: ModelConfig, folder: str, inputs: jax.Array, record: dict,
                  args: argparse.Namespace, shortlist: np.ndarray | None) -> float | None:
  """Ours at each of --precisions (int8 once per --int8_kernels product); returns the float32
  seconds per beam step (None without float32)."""
  speed, weight_bytes, step_s = record["sentences_per_s"], record["weight_bytes"], None
  for name in args.precisions:
    # int8 once per --int8_kernels product (model/int8_kernel.py: the same bits, side by side).
    for kernel in (args.int8_kernels if name == "int8" else ["auto"]):
      os.environ["FLAX_TRANSFORMER_INT8_KERNEL"] = kernel
      key = f"ours_{name}" + ("" if kernel == "auto" else f"[{kernel}]")
      weight_bytes[f"ours_{name}"], seconds = _ours(config, folder, name, inputs, args)
      speed[key] = round(args.sentences / seconds, 3)
      if name == "float32":
        step_s = seconds / args.steps
      if shortlist is not None:
        _, seconds = _ours(config, folder, name, inputs, args, shortlist)
        speed[f"{key}_shortlist"] = round(args.sentences / seconds, 3)
    os.environ["FLAX_TRANSFORMER_INT8_KERNEL"] = "auto"
    if name == "int8":
      record["int8_products_auto"] = int8_kernel.choices()
      record["onednn"] = int8_kernel.load().onednn_version or int8_kernel.load().reason
  return step_s


def _ratios(record: dict, shortlist: np.ndarray | None) -> None:
  """record's ours_over_ct2: each of our speeds over CTranslate2's at its precision."""
  speed = record["sentences_per_s"]
  for key in [key for key in speed if key.startswith("ours_") and not key.endswith("_shortlist")]:
    name = key.removeprefix("ours_").split("[")[0]
    if f"ct2_{name}" in speed:
      ratio = key.removeprefix("ours_")
      record.setdefault("ours_over_ct2", {})[ratio] = round(speed[key] / speed[f"ct2_{name}"], 3)
      if shortlist is not None:
        record["ours_over_ct2"][f"{ratio}_shortlist_vmap"] = round(
            speed[f"{key}_shortlist"] / speed[f"ct2_{name}_vmap"], 3)


def _projection(config: ModelConfig, folder: str, step_s: float, record: dict,
                args: argparse.Namespace, shortlist: np.ndarray | None) -> None:
  """record's projection_share[_shortlist] of a float32 step of `step_s` seconds."""
  params, rows = read_params(folder), 4 * args.sentences
  record["projection_share"] = round(_projection_s(config, params, rows, args.repeats) / step_s,
                                     3)
  record["step_s_float32"] = round(step_s, 4)
  if shortlist is not None:
    projection = _projection_s(config, params, rows, args.repeats, shortlist)
    record["projection_share_shortlist"] = round(projection / step_s, 3)


def measure(args: argparse.Namespace) -> dict:
  """One record of the whole benchmark (module docstring)."""
  config = shape_config(args.shape, args.small).replace(dropout_rate=0.0,
                                                       attention_dropout_rate=0.0)
  inputs = _inputs(config.vocab_size, args.sentences, args.source_len)
  record: dict[str, Any] = {"benchmark": "nllb_shape",
                            "shape": f"{args.shape} (small)" if args.small else args.shape,
                            "weight_bytes": {}, "sentences_per_s": {}}
  shortlist = (_shortlist(config.vocab_size, args.shortlist_size) if args.shortlist_size
               else None)
  with tempfile.TemporaryDirectory(prefix="shape_params_") as folder:
    record["parameters"] = write_random_params(config, folder)
    if not args.no_load:
      with tempfile.TemporaryDirectory(prefix="shape_workdir_") as workdir:
        workdir_lib.save_params(to_path(workdir), 0, read_params(folder))
        start = time.perf_counter()
        workdir_lib.restore_params(workdir, 0)
        record["load_s"] = {"ours_float32": round(time.perf_counter() - start, 2)}
    _measure_ct2(config, folder, inputs, record, args, shortlist)
    step_s = _measure_ours(config, folder, inputs, record, args, shortlist)
    _ratios(record, shortlist)
    if step_s:
      _projection(config, folder, step_s, record, args, shortlist)
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
  parser.add_argument("--shape", default="nllb-600m", choices=SHAPES)
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
  parser.add_argument("--no_load", action="store_true",
                      help="skip the orbax save and restore of the float32 weights (load_s)")
  parser.add_argument("--small", action="store_true",
                      help="a tiny model of the same kind: checks that the script runs")
  print(json.dumps(measure(parser.parse_args())), flush=True)


if __name__ == "__main__":
  main()
