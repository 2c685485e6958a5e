"""Attention masks, multi-head scaled dot-product attention, and its explicit key/value cache.

The shape letters of the whole model package (`layers.py` and `transformer.py` use them too),
lower-case in einsum strings:
  B  batch rows; B*K rows during beam search
  S  source length; in the attention functions, the keys' length (source, target or cache)
  T  target length; in the attention functions, the queries' length
  L  cache length: the positions a decoding cache has room for
  D  model dim (`emb_dim`)      N  heads      H  head dim (D / N)
  F  feed-forward dim (`mlp_dim`)      V  vocabulary      K  beams per sentence
Masks are boolean, True where attention is allowed, shaped [B, 1, T, S] (broadcast over heads).
"""

from __future__ import annotations

from typing import Literal

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from flax_transformer.model.layers import keep_mask
from flax_transformer.model.quantization import Int8DenseGeneral
from flax_transformer.runtime import accelerators

Array = jax.Array
# Keys and values [B, S, N, H] as projected, heads-major [B, N, S, H] (the cross-attention
# cache), or heads-major and transposed, [B, N, H, S] (the self-attention cache's keys).
KVLayout = Literal["bsnh", "bnsh", "bnhs"]


# --------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------
def padding_mask(query_valid: Array, key_valid: Array) -> Array:
  """Allows attention between real (non-padding) positions only.

  Args:
    query_valid: bool [B, T], True at real query positions.
    key_valid: bool [B, S], True at real key positions.
  Returns:
    bool [B, 1, T, S].
  """
  return query_valid[:, None, :, None] & key_valid[:, None, None, :]


def causal_mask(length: int) -> Array:
  """bool [1, 1, T, T]: query t may look at keys 0..t (never ahead)."""
  return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
  """Keeps packed examples apart: attention only within the same segment id.

  Example: one packed row with segments [1, 1, 2, 2, 0] lets positions 0-1 see each other and
  positions 2-3 see each other; position 4 (padding, segment 0) matches only other padding,
  which the padding mask removes.

  Args:
    query_segments: int [B, T]; key_segments: int [B, S].
  Returns:
    bool [B, 1, T, S].
  """
  return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None (None when all are None)."""
  present = [m for m in masks if m is not None]
  if not present:
    return None
  combined = present[0]
  for mask in present[1:]:
    combined = combined & mask
  return combined


# --------------------------------------------------------------------------------------------
# Scaled dot-product attention
# --------------------------------------------------------------------------------------------
def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    *,
    bias: Array | None = None,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    implementation: str | None = None,
) -> Array:
  """softmax(Q K^T / sqrt(H) + bias + mask) V, per head.

  Without attention dropout this is `jax.nn.dot_product_attention`, except on CPU with no
  implementation requested, where two einsums are faster (see `_use_fused_attention`). With no
  implementation requested on a GPU, cuDNN's flash-attention kernel runs wherever it computes
  this same function (`_cudnn_applies`: bfloat16/float16, supported head and mask sizes), else
  XLA's. With dropout on the attention weights (training only) the weights are materialised,
  since the fused kernels do not drop them with our masks.

  Args:
    query: [B, T, N, H]; key, value: [B, S, N, H].
    mask: bool, broadcastable to [B, N, T, S]; True where attention is allowed.
    bias: float32, broadcastable to [B, N, T, S], added to the logits (T5's relative-position
      bias), or None.
    scale: the logits' factor; None is 1/sqrt(H), the paper's (T5's is 1).
    dropout_rate: probability of dropping an attention weight; needs `dropout_rng` when > 0.
    implementation: None (chosen as above), "xla" or "cudnn".
  Returns:
    [B, T, N, H] in the query's dtype.
  """
  if dropout_rate == 0.0 and _use_fused_attention(implementation):
    if implementation is None and bias is None and _cudnn_applies(query, key, value, mask):
      implementation = "cudnn"
    if bias is not None:
      bias = bias.astype(query.dtype)
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=scale, implementation=implementation)
  return attend(query, key, value, mask, bias=bias, scale=scale, dropout_rate=dropout_rate,
                dropout_rng=dropout_rng)


def _use_fused_attention(implementation: str | None) -> bool:
  """Whether to call `jax.nn.dot_product_attention` rather than the two einsums.

  Always when an implementation is named, and on GPU/TPU. On CPU its XLA path transposes Q, K,
  V to heads-major [B, N, T, H] and back on every call, while the einsums let XLA pick the
  layouts, which is faster (a layer's forward and backward: 40 ms against 54 ms;
  docs/performance.md, "Measured design choices"). Decided at trace time from the
  platform traced for (`accelerators.traced_platform`).
  """
  return implementation is not None or accelerators.traced_platform() != "cpu"


def _cudnn_applies(query: Array, key: Array, value: Array, mask: Array | None) -> bool:
  """Whether cuDNN's flash attention computes this call exactly as the XLA path does.

  Its conditions (jax's `jax._src.cudnn.fused_attention_stablehlo` checks, cuDNN's support
  matrix): an NVIDIA GPU of compute capability 8.0 or more; Q, K, V all bfloat16 or all float16
  (no float32 kernel); head dim a multiple of 8, at most 128 (256 from Hopper, 9.0, on); a mask
  of full [T, S] size, which jax turns into an additive bias of a large negative number, and
  then even T and S (needed for the backward pass with a bias). Decided at trace time.
  """
  capability = _cuda_compute_capability()
  if capability is None or capability < 8.0:
    return False
  dtypes = {jnp.dtype(x.dtype) for x in (query, key, value)}
  if len(dtypes) != 1 or dtypes.pop() not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return False
  head_dim = query.shape[-1]
  if head_dim % 8 or head_dim > (256 if capability >= 9.0 else 128):
    return False
  if mask is None:
    return True
  length, source_length = query.shape[1], key.shape[1]
  return (mask.shape[-2:] == (length, source_length) and length % 2 == 0
          and source_length % 2 == 0)


def _cuda_compute_capability() -> float | None:
  """The default device's CUDA compute capability (e.g. 9.0), or None off NVIDIA GPUs."""
  if accelerators.traced_platform() != "gpu":
    return None
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return float(capability)
  except (TypeError, ValueError):  # A ROCm device, or none reported.
    return None


def attend(query: Array, key: Array, value: Array, mask: Array | None, *,
           kv_layout: KVLayout = "bsnh", bias: Array | None = None, scale: float | None = None,
           dropout_rate: float = 0.0, dropout_rng: Array | None = None) -> Array:
  """softmax(Q K^T / sqrt(H) + bias + mask) V as two einsums, with the weights materialised.

  The attention core of the model: training's path on CPU and with attention dropout, and
  decoding's cross-attention. (Decoding's self-attention, `attend_cached`, shares
  `attention_weights` and stores its keys transposed.) A decoding cache is heads-major,
  [B, N, S, H]; attending over it in that layout (`kv_layout="bnsh"`) avoids what
  `jax.nn.dot_product_attention` would do on CPU, a transpose, that is a copy, of the whole
  cache at every step.

  Args:
    query: [B, T, N, H]; key, value: [B, S, N, H], [B, N, S, H] with `kv_layout="bnsh"`, or
      [B, N, H, S] with `kv_layout="bnhs"`.
    mask: bool, broadcastable to [B, N, T, S]; True where attention is allowed.
    bias, scale: as in `scaled_dot_product_attention`.
    dropout_rate: probability of dropping an attention weight; needs `dropout_rng` when > 0.
  Returns:
    [B, T, N, H] in the value's dtype.
  """
  weights = attention_weights(query, key, mask, kv_layout=kv_layout, bias=bias,
                              scale=scale)  # f32 [B, N, T, S]
  if dropout_rate > 0.0:
    keep, keep_prob = keep_mask(dropout_rng, weights.shape, 1.0 - dropout_rate)
    weights = jnp.where(keep, weights / keep_prob, 0.0)
  # [B, N, T, H], the dot's own output order: asking the einsum for [B, T, N, H] makes XLA:CPU
  # swap the operands (values first, contracting over their rows), a dot its YNNPACK path
  # rejects and its fallback runs on one thread (decoding's cross-attention, T = K beams).
  attended = jnp.einsum(f"bnts,{kv_layout}->bnth", weights.astype(value.dtype), value)
  return attended.transpose(0, 2, 1, 3)  # [B, T, N, H]


def attention_weights(query: Array, key: Array, mask: Array | None, *,
                      kv_layout: KVLayout = "bsnh", bias: Array | None = None,
                      scale: float | None = None) -> Array:
  """softmax(Q K^T / sqrt(H) + bias + mask): query [B, T, N, H], key as in `attend` -> f32
  [B, N, T, S]; `bias` (broadcastable to [B, N, T, S]) and `scale` (None: 1/sqrt(H)) as in
  `scaled_dot_product_attention`.

  Logits, masking and softmax in float32 whatever the compute dtype; masked logits become the
  lowest float32 rather than -inf, so a row with no allowed key gives uniform weights, not NaN.
  """
  logits = jnp.einsum(f"btnh,{kv_layout}->bnts", query, key).astype(jnp.float32)
  if scale is None:
    logits = logits / jnp.sqrt(jnp.float32(query.shape[-1]))
  elif scale != 1.0:
    logits = logits * jnp.float32(scale)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------
@flax.struct.dataclass
class KeyValues:
  """Projected keys and values of one attention layer, heads-major for decoding."""

  keys: Array  # [B, N, L or S, H]
  values: Array  # [B, N, L or S, H]


# --------------------------------------------------------------------------------------------
# Multi-head attention
# --------------------------------------------------------------------------------------------
class MultiHeadAttention(nn.Module):
  """Multi-head attention: heads of Q = X W_Q, K = X W_K, V = X W_V, concatenated, then W_O.

  The projections carry no bias, as in the paper's equations, unless `use_bias` (Marian's and
  fairseq's: Q = X W_Q + b_Q, ..., biases [N, H] and, on the output, [D]). Kernels are stored
  per head ([D, N, H] and [N, H, D]) with logical axis names for sharding.
  """

  num_heads: int
  head_dim: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  implementation: str | None = None
  use_bias: bool = False
  qkv_init_gain: float = 1.0  # Xavier-uniform gain of the Q, K, V kernels (fairseq: 1/sqrt(2)).
  quantized: bool = False  # int8 projections (serving, `model.quantization`).
  # False: logits Q K^T without 1/sqrt(H) (T5's), which the query's init takes instead.
  scale_logits: bool = True
  output_dim: int | None = None  # D, the output's features; None: N * H.

  @property
  def logits_scale(self) -> float | None:
    """The logits' factor for `scaled_dot_product_attention`: None (1/sqrt(H)) or 1."""
    return None if self.scale_logits else 1.0

  def setup(self):
    if self.quantized:
      projection = dict(features=(self.num_heads, self.head_dim), use_bias=self.use_bias,
                        dtype=self.dtype, kernel_axes=("embed", "heads", "kv"))
      self.query = Int8DenseGeneral(**projection)
      self.key = Int8DenseGeneral(**projection)
      self.value = Int8DenseGeneral(**projection)
      self.output = Int8DenseGeneral(
          features=self._output_dim, axis=(-2, -1), use_bias=self.use_bias,
          dtype=self.dtype, kernel_axes=("heads", "kv", "embed"))
      return
    init = nn.initializers.xavier_uniform()  # Over (D, N*H): DenseGeneral flattens first.
    qkv_init = nn.initializers.variance_scaling(self.qkv_init_gain**2, "fan_avg", "uniform")
    zeros = nn.initializers.zeros
    projection = dict(
        features=(self.num_heads, self.head_dim), use_bias=self.use_bias, dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=nn.with_logical_partitioning(qkv_init, ("embed", "heads", "kv")),
        bias_init=nn.with_logical_partitioning(zeros, ("heads", "kv")))
    if self.scale_logits:
      self.query = nn.DenseGeneral(**projection)
    else:  # 1/sqrt(H) in the init instead: the same logits at the start (T5's init does so).
      query_init = nn.initializers.variance_scaling(self.qkv_init_gain**2 / self.head_dim,
                                                    "fan_avg", "uniform")
      self.query = nn.DenseGeneral(**{**projection, "kernel_init": nn.with_logical_partitioning(
          query_init, ("embed", "heads", "kv"))})
    self.key = nn.DenseGeneral(**projection)
    self.value = nn.DenseGeneral(**projection)
    self.output = nn.DenseGeneral(
        features=self._output_dim, axis=(-2, -1), use_bias=self.use_bias,
        dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=nn.with_logical_partitioning(init, ("heads", "kv", "embed")),
        bias_init=nn.with_logical_partitioning(zeros, ("embed",)))

  @property
  def _output_dim(self) -> int:
    return self.output_dim or self.num_heads * self.head_dim

  def __call__(self, queries_from: Array, keys_from: Array, mask: Array | None, *,
               train: bool = False, bias: Array | None = None) -> Array:
    """Attends from `queries_from` [B, T, D] to `keys_from` [B, S, D]; returns [B, T, D].
    `bias`: float32 [B or 1, N, T, S] added to the logits (T5's relative-position bias)."""
    query = self.query(queries_from)  # [B, T, N, H]
    key, value = self.key(keys_from), self.value(keys_from)  # [B, S, N, H]
    scale = self.logits_scale
    if self.is_mutable_collection("intermediates"):  # For attention pictures only.
      self.sow("intermediates", "attention_weights",
               attention_weights(query, key, mask, bias=bias, scale=scale))
    dropout_rate = self.dropout_rate if train else 0.0
    rng = self.make_rng("dropout") if dropout_rate > 0 else None
    attended = scaled_dot_product_attention(
        query, key, value, mask, bias=bias, scale=scale, dropout_rate=dropout_rate,
        dropout_rng=rng, implementation=self.implementation)
    return self.output(attended)  # [B, T, D]

  def cache_key_values(self, keys_from: Array) -> KeyValues:
    """[B, S, D] -> keys and values heads-major [B, N, S, H], for a decoding cache."""
    return KeyValues(keys=jnp.swapaxes(self.key(keys_from), 1, 2),
                     values=jnp.swapaxes(self.value(keys_from), 1, 2))

  def attend_grouped(self, queries_from: Array, key_values: KeyValues,
                     key_mask: Array) -> Array:
    """Cross-attention for decoding, with keys/values shared by groups of query rows.

    Query row r belongs to key row r // K, with K = query rows / key rows: the K beams of one
    sentence attend to that sentence's keys/values, which are never copied per beam.

    Args:
      queries_from: [B*K, 1, D], one decoding step for every beam.
      key_values: keys/values [B, N, S, H].
      key_mask: bool [B, S], True at real source positions.
    Returns:
      [B*K, 1, D].
    """
    rows = queries_from.shape[0]
    batch = key_values.keys.shape[0]
    beams = rows // batch
    query = self.query(queries_from)  # [B*K, 1, N, H]
    # The K beams of a sentence become K query positions of that sentence: [B, K, N, H].
    query = query.reshape(batch, beams, self.num_heads, self.head_dim)
    mask = key_mask[:, None, None, :]  # [B, 1, 1, S]
    keys, values = key_values.keys.astype(query.dtype), key_values.values.astype(query.dtype)
    attended = attend(query, keys, values, mask, kv_layout="bnsh",
                      scale=self.logits_scale)  # [B, K, N, H]
    attended = attended.reshape(rows, 1, self.num_heads, self.head_dim)
    return self.output(attended)  # [B*K, 1, D]

  def attend_cached(self, queries_from: Array, cache: KeyValues, index: Array,
                    mask: Array, bias: Array | None = None) -> tuple[Array, KeyValues]:
    """Causal self-attention for one decoding step, writing this step into the cache in place.

    The cache holds K slots per sentence (`transformer`'s module docstring, "Beam search and
    the self-attention cache"), position-major: entry l*K + j is position l of slot j. Row
    b*K + k writes its keys/values into slot k at `index` (the K slots of a position are one
    contiguous write), and attends, as query k of sentence b, over the L*K entries that `mask`
    allows. Keys are stored transposed, so that both products are plain batched matmuls,
    [K, H] x [H, L*K] and [K, L*K] x [L*K, H], that read the cache where it lies.

    Args:
      queries_from: [B*K, 1, D], the current position of every row.
      cache: keys [B, N, H, L*K], values [B, N, L*K, H]; positions >= `index` are not yet
        written.
      index: int32 scalar, the position being decoded (the same for all rows).
      mask: bool [B, 1, K, L*K], True at the entries on each row's prefix up to and including
        `index`.
      bias: float32 [B or 1, N, 1, L*K], added to the logits (T5's relative-position bias of
        query position `index` over the cache's entries), or None.
    Returns:
      ([B*K, 1, D], the cache with position `index` written).
    """
    batch, heads, head_dim, _ = cache.keys.shape
    rows = queries_from.shape[0]
    beams = rows // batch
    new = self.cache_key_values(queries_from)  # [B*K, N, 1, H]
    # Row b*K + k -> slot k of sentence b: [B*K, N, 1, H] -> [B, K, N, H].
    by_slot = lambda x: x.reshape(batch, beams, heads, head_dim)
    new_keys = by_slot(new.keys).transpose(0, 2, 3, 1)  # [B, N, H, K]
    new_values = by_slot(new.values).transpose(0, 2, 1, 3)  # [B, N, K, H]
    start = index * beams
    cache = KeyValues(
        keys=jax.lax.dynamic_update_slice(
            cache.keys, new_keys.astype(cache.keys.dtype), (0, 0, 0, start)),
        values=jax.lax.dynamic_update_slice(
            cache.values, new_values.astype(cache.values.dtype), (0, 0, start, 0)))
    # The K beams of a sentence become K query positions of that sentence: [B, K, N, H].
    query = self.query(queries_from).reshape(batch, beams, heads, head_dim)
    weights = attention_weights(query, cache.keys.astype(query.dtype), mask, kv_layout="bnhs",
                                bias=bias, scale=self.logits_scale)  # f32 [B, N, K, L*K]
    attended = jnp.einsum("bnts,bnsh->bnth", weights.astype(query.dtype),
                          cache.values.astype(query.dtype))  # [B, N, K, H]
    attended = attended.transpose(0, 2, 1, 3).reshape(rows, 1, heads, head_dim)
    return self.output(attended), cache  # [B*K, 1, D]
