"""Translating token ids with a Transformer: the glue between `model.apply` and `decode`.

`translate_ids` encodes the batch once, computes every decoder layer's cross-attention
keys/values once (they become `shared_state`, read by all K beams of a sentence without
copies), builds an empty self-attention cache (the per-beam state) and runs beam search, greedy
decoding or sampling. It is a pure function of (variables, inputs, rng): bind the model and the
options and jit it, e.g. with `jit_translate_ids(model, beam_size=4, max_decode_len=64)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from flax_transformer import decode
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.model.transformer import DECODER_START_ID, Transformer, resize_cache

Array = jax.Array
Method = Literal["beam", "greedy", "sample"]
METHODS = ("beam", "greedy", "sample")
# The words configs and the CLI use for `translate_ids(grow_cache=...)`.
GROW_CACHE_SETTINGS = {"auto": None, "yes": True, "no": False}


def make_tokens_to_logits(model: Transformer, variables: Any
                          ) -> decode.TokensToLogitsWithShared:
  """The decoding step for `decode`: (ids [B*K, 1], cache, cross) -> (logits [B*K, V], cache).

  `variables` is what `model.apply` takes ({"params": ...}). The cache leaves lead with B*K and
  its `index` is 0-d; `cross` (from `Transformer.precompute_cross_attention`) leads with B.
  """

  def tokens_to_logits(ids: Array, cache: Any, cross: Any) -> tuple[Array, Any]:
    return model.apply(variables, ids, cache, cross, method=Transformer.decode_step)

  return tokens_to_logits


def output_length_caps(inputs: Array, max_len_a: float, max_len_b: int | None) -> Array | None:
  """int32 [B]: floor(max_len_a * source length + max_len_b) tokens before EOS, or None.

  The source length counts the non-padding tokens of each row of `inputs` [B, S] (its EOS
  included). None (no per-sentence cap) when max_len_a is 0 and max_len_b is None.
  """
  if max_len_a == 0 and max_len_b is None:
    return None
  source_lengths = jnp.sum(inputs != PAD_ID, axis=1).astype(jnp.float32)  # [B]
  caps = jnp.floor(max_len_a * source_lengths + (max_len_b or 0))
  return jnp.maximum(caps, 0).astype(jnp.int32)


def translate_ids(
    model: Transformer,
    variables: Any,
    inputs: Array,
    *,
    beam_size: int = 4,
    max_decode_len: int,
    length_penalty: float = 0.6,
    eos_id: int = EOS_ID,
    max_len_a: float = 0.0,
    max_len_b: int | None = None,
    min_length: int = 0,
    method: Method = "beam",
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: Array | None = None,
    return_all: bool = False,
    grow_cache: bool | None = None,
    segment_length: int = decode.DEFAULT_SEGMENT_LENGTH,
    steps_per_iteration: int | None = None,
) -> tuple[Array, Array]:
  """Translates a batch of source ids.

  Args:
    model: the Transformer. variables: its variables ({"params": ...}).
    inputs: int32 [B, S] source ids ending with EOS, padded with 0.
    beam_size: K (method "beam" only). max_decode_len: L, output tokens including EOS.
    length_penalty: GNMT alpha (method "beam" only).
    eos_id: the end-of-sentence id.
    max_len_a, max_len_b: at most floor(a * source length + b) tokens before EOS per sentence
      (the paper used source length + 50); defaults: no cap beyond L.
    min_length: fewest tokens before EOS.
    method: "beam", "greedy" or "sample" (temperature, top_k, top_p and rng apply).
    return_all: beam search's K hypotheses ([B, K, L], [B, K]) instead of the best ([B, L], [B]);
      greedy and sampling then give K = 1.
    grow_cache: grow the self-attention cache in segments of the loop (`decode`'s "Growing
      state") instead of holding L positions from the first step. None: for beam search on
      CPU only (see `_grow_cache_by_default`). segment_length: the step of `decode.growth_schedule`.
    steps_per_iteration: decoding steps per while-loop iteration (`decode`'s "Steps per loop
      iteration"); None: the backend's default, `decode.default_steps_per_iteration`. The
      outputs do not depend on it.

  Returns:
    (sequences int32, scores float32), as `decode.beam_search` / `greedy_search` / `sample`
    define them: EOS included, zeros after; beam scores length-normalized, the others summed
    log-probabilities.
  """
  if method not in METHODS:
    raise ValueError(f"translate_ids: method must be one of {METHODS}, got {method!r}.")
  if method == "sample" and rng is None:
    raise ValueError("translate_ids: method='sample' needs rng (a jax.random key).")
  if jnp.ndim(inputs) != 2 or not jnp.issubdtype(jnp.result_type(inputs), jnp.integer):
    raise ValueError(f"translate_ids: inputs must be int [B, S], got {jnp.shape(inputs)} "
                     f"{jnp.result_type(inputs)}.")
  batch_size = inputs.shape[0]
  encoded = model.apply(variables, inputs, method=Transformer.encode)  # [B, S, D]
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  cache = model.apply(variables, batch_size, max_decode_len, method=Transformer.init_cache)
  common = dict(
      batch_size=batch_size, max_decode_len=max_decode_len, eos_id=eos_id, bos_id=DECODER_START_ID,
      shared_state=cross, max_lengths=output_length_caps(inputs, max_len_a, max_len_b),
      min_length=min_length, steps_per_iteration=steps_per_iteration)
  if grow_cache is None:
    grow_cache = _grow_cache_by_default(method)
  if grow_cache:
    common.update(resize_state=resize_cache, segment_length=segment_length)
  step = make_tokens_to_logits(model, variables)
  if method == "beam":
    return decode.beam_search(step, cache, beam_size=beam_size, length_penalty=length_penalty,
                              return_all=return_all, **common)
  if method == "greedy":
    sequences, scores = decode.greedy_search(step, cache, **common)
  else:
    sequences, scores = decode.sample(step, cache, rng, temperature=temperature, top_k=top_k,
                                      top_p=top_p, **common)
  if return_all:
    return sequences[:, None], scores[:, None]
  return sequences, scores


def _grow_cache_by_default(method: Method) -> bool:
  """Whether `translate_ids` grows the cache when not told: beam search on CPU, at trace time.

  On the 2-core CPU a beam step is bound by memory traffic, mostly the reorder of the whole
  cache by parent beam, so a cache grown by `decode.growth_schedule` (16, 32, 48, 64, then
  doubling) makes a 64-step beam search 14-25% faster, for 2.2-2.3x its compile time (one
  loop body per segment; BENCHMARKS.md).
  Greedy decoding and sampling reorder nothing and gain 2-4%, too little for the compile time.
  On a GPU the step is bound by kernel launches rather than bytes, and compiles take longer;
  that trade is not measured, so the cache stays fixed there.
  """
  return method == "beam" and jax.default_backend() == "cpu"


def jit_translate_ids(model: Transformer, **options: Any) -> Callable[..., tuple[Array, Array]]:
  """`translate_ids` with the model and `options` bound, jitted: fn(variables, inputs, rng=None).

  Compiles once per input shape; keep the number of distinct [B, S] shapes small (buckets).
  """
  return jax.jit(functools.partial(translate_ids, model, **options))
