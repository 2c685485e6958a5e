"""Building blocks around attention: embeddings, positional encodings, the feed-forward network,
and the sub-layer connection (LayerNorm, dropout and the residual). Shape letters as in
`attention.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.model import quantization
from flax_transformer.model.config import ModelConfig
from flax_transformer.runtime.sharding import batch_split

Array = jax.Array


def sinusoidal_positions(max_len: int, dim: int, layout: str = "interleaved") -> np.ndarray:
  """The paper's encodings: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same).

  Positions start at 0. `layout` "interleaved" is the paper's (sines at even features, cosines
  at odd ones); "halves" puts the same values as [sin..., cos...], the ceil(D/2) sines first:
  tensor2tensor's and Marian's layout (Hugging Face's `MarianSinusoidalPositionalEmbedding`).
  The two are one fixed permutation of the features apart (`sinusoid_permutation`).
  "fairseq" is [sin(p w_i)..., cos(p w_i)...] with w_i = 10000^(-i / (D/2 - 1)), i < D/2, and a
  zero feature last for odd D: fairseq's table (Hugging Face's
  `M2M100SinusoidalPositionalEmbedding`, computed in float32 as there).

  Returns:
    float32 [max_len, D].
  """
  if layout == "fairseq":
    return _fairseq_sinusoids(max_len, dim)
  positions = np.arange(max_len, dtype=np.float64)[:, None]  # [max_len, 1]
  even_features = np.arange(0, dim, 2, dtype=np.float64)  # 2i
  angles = positions / np.power(10000.0, even_features / dim)  # [max_len, ceil(D/2)]
  table = np.zeros((max_len, dim), dtype=np.float64)
  table[:, 0::2] = np.sin(angles)
  table[:, 1::2] = np.cos(angles[:, : dim // 2])
  if layout == "halves":
    table = table[:, sinusoid_permutation(dim)]
  elif layout != "interleaved":
    raise ValueError(f"sinusoid layout must be 'interleaved', 'halves' or 'fairseq', got "
                     f"{layout!r}.")
  return table.astype(np.float32)


def _fairseq_sinusoids(max_len: int, dim: int) -> np.ndarray:
  half = dim // 2
  step = np.float32(math.log(10000) / (half - 1))
  frequencies = np.exp(np.arange(half, dtype=np.float32) * -step)  # [D/2]
  angles = np.arange(max_len, dtype=np.float32)[:, None] * frequencies[None]  # [max_len, D/2]
  table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
  if dim % 2:
    table = np.concatenate([table, np.zeros((max_len, 1), np.float32)], axis=1)
  return table.astype(np.float32)


def sinusoid_permutation(dim: int) -> np.ndarray:
  """int [D]: feature j of the "halves" layout is feature perm[j] of the "interleaved" one
  (the even features, then the odd ones): halves = interleaved[:, perm]."""
  return np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])


def keep_mask(rng: Array, shape: tuple[int, ...], keep_prob: float) -> tuple[Array, float]:
  """A Bernoulli(keep_prob) dropout mask from a counter hash keyed by two threefry words.

  `jax.random.bernoulli` runs threefry (20 rounds) for every element, about a tenth of a CPU
  train step, where this costs about as much as `x * 2` (8.4M elements: 10 ms against 80-98 ms;
  docs/performance.md, "Measured design choices").
  Here threefry draws two 32-bit seeds per call, and each element hashes its flat index with
  them through Wellons' `lowbias32` integer hash (a bijection of uint32 with full avalanche),
  applied twice: masks of different calls use independent seeds, elements of one call use
  distinct counters. Plenty for dropout; not a general-purpose PRNG.

  Args:
    rng: a PRNG key.
    shape: the mask's shape, at most 2^32 elements.
    keep_prob: in (0, 1].
  Returns:
    (bool mask of `shape`, the exact keep probability: keep_prob rounded to a multiple of
    2^-32, by which kept values are divided so that the expectation is unchanged).
  """
  size = math.prod(shape)
  if size >= 2**32:
    raise ValueError(f"keep_mask: {shape} has {size} elements; at most 2^32 - 1 are supported.")
  threshold = min(max(1, round(keep_prob * 2**32)), 2**32 - 1)
  seeds = jax.random.bits(rng, (2,), jnp.uint32)
  counters = jax.lax.iota(jnp.uint32, size).reshape(shape)
  hashed = _lowbias32(_lowbias32(counters ^ seeds[0]) + seeds[1])
  return hashed < jnp.uint32(threshold), threshold / 2**32


def _lowbias32(x: Array) -> Array:
  """Chris Wellons' lowbias32 integer hash of uint32 values (a bijection)."""
  x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
  x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


class Dropout(nn.Module):
  """Dropout with `keep_mask`'s cheap mask; called like `flax.linen.Dropout`."""

  rate: float

  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    """x [...] -> x with each element zeroed with probability `rate` (scaled up when kept)."""
    if deterministic or self.rate == 0.0:
      return x
    keep, keep_prob = keep_mask(self.make_rng("dropout"), x.shape, 1.0 - self.rate)
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))


class Embedder(nn.Module):
  """Token embeddings scaled by sqrt(D) (or not, with `scale=False`), and (tied) logits from the
  same table.

  `quantized` (serving in int8, `model.quantization`): the table is int8, stored as the logits'
  kernel `embedding_kernel` [D, V] with one scale per token `embedding_scale` [V]; the logits
  are a w8a8 product and a lookup dequantizes the token's column. The logits read
  `embedding_packed` instead where `model.precision.convert_params` packed the table for oneDNN.
  """

  vocab_size: int
  emb_dim: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  scale: bool = True
  quantized: bool = False

  def setup(self):
    if self.quantized:
      self.kernel = self.param(
          "embedding_kernel", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           ("embed", "vocab")),
          (self.emb_dim, self.vocab_size), jnp.int8)
      self.kernel_scale = self.param(
          "embedding_scale", nn.with_logical_partitioning(nn.initializers.ones, ("vocab",)),
          (self.vocab_size,), jnp.float32)
      return
    # stddev D^-0.5 makes the scaled embedding sqrt(D) * E[id] unit-variance.
    init = nn.initializers.normal(stddev=self.emb_dim**-0.5)
    self.table = self.param(
        "embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
        (self.vocab_size, self.emb_dim), self.param_dtype)

  def __call__(self, ids: Array) -> Array:
    """int [B, T] -> [B, T, D], multiplied by sqrt(D) as in the paper (when `scale`)."""
    if self.quantized:
      columns = jnp.take(self.kernel, ids, axis=1).astype(jnp.float32)  # [D, B, T]
      columns = columns * jnp.take(self.kernel_scale, ids, axis=0)[None]
      embedded = jnp.moveaxis(columns, 0, -1).astype(self.dtype)  # [B, T, D]
    else:
      embedded = jnp.take(self.table, ids, axis=0).astype(self.dtype)
    if not self.scale:
      return embedded
    return embedded * jnp.sqrt(jnp.asarray(self.emb_dim, self.dtype))

  def logit_weights(self, ids: Array) -> tuple[Array, Array | None]:
    """The tied projection's weights of tokens `ids` int [V'] (a vocabulary shortlist,
    `transformer.OutputShortlist`), in the layout `logits` reads them: (the table's rows
    [V', D] in the compute dtype, None), or int8 (kernel columns [D, V'], their scales [V'])."""
    if self.quantized:
      return jnp.take(self.kernel, ids, axis=1), jnp.take(self.kernel_scale, ids, axis=0)
    return jnp.take(self.table, ids, axis=0).astype(self.dtype), None

  def logits(self, x: Array) -> Array:
    """[B, T, D] -> [B, T, V], the output projection tied to this table (no scaling, no bias)."""
    if self.quantized:
      rows = x.shape[:-1]
      packed = self.has_variable("params", "embedding_packed")  # `int8_kernel.pack`'s layout
      logits = quantization.int8_matmul(
          x.reshape(-1, self.emb_dim),
          self.get_variable("params", "embedding_packed") if packed else self.kernel,
          self.kernel_scale, packed_features=self.vocab_size if packed else None)  # [B*T, V]
      return logits.reshape(*rows, self.vocab_size)
    return jnp.einsum("btd,vd->btv", x, self.table.astype(self.dtype))


class PositionalEncoding(nn.Module):
  """Adds position information: fixed sinusoids (the paper) or a learned table."""

  kind: str
  max_len: int
  emb_dim: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  sinusoid_layout: str = "interleaved"  # See `sinusoidal_positions`.
  offset: int = 0  # Position p reads row p + offset of a table of max_len + offset rows.

  @nn.compact
  def __call__(self, positions: Array) -> Array:
    """int [B, T] positions -> [B, T, D] encodings."""
    rows = self.max_len + self.offset
    if self.kind == "sinusoidal":
      table = jnp.asarray(sinusoidal_positions(rows, self.emb_dim, self.sinusoid_layout))
    else:
      table = self.param(
          "position_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
          (rows, self.emb_dim), self.param_dtype)
    if self.offset:
      positions = positions + self.offset
    return jnp.take(table, positions, axis=0).astype(self.dtype)


def relative_position_bucket(relative_position: Array, *, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> Array:
  """T5's bucket of each relative position (key position - query position), as Hugging Face's
  `T5Attention._relative_position_bucket` (and Mesh TensorFlow's) computes it.

  Bidirectional (the encoder): half of the buckets for keys after the query, half for the rest.
  Causal (the decoder): keys after the query (masked anyway) share bucket 0 with the query's own
  position. Of a side's buckets, the first half are one offset each (0, 1, ...); the rest cover
  offsets up to `max_distance` logarithmically, everything beyond in the last one. The
  logarithm is float32's, as there, so the buckets are the same at every boundary.

  Args:
    relative_position: int [...]; num_buckets >= 4 (>= 2 causal); max_distance > the exact
      offsets (num_buckets / 4 bidirectional, / 2 causal).
  Returns:
    int32 [...] in [0, num_buckets).
  """
  relative_position = relative_position.astype(jnp.int32)
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets = buckets + (relative_position > 0).astype(jnp.int32) * num_buckets
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  scaled = (jnp.log(distance.astype(jnp.float32) / max_exact)
            / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  large = max_exact + scaled.astype(jnp.int32)  # Truncated toward 0 (log(0) is -inf: unused).
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
  """T5's learned relative-position bias of one stack: a table `embedding` [buckets, N] of one
  logit per bucket (`relative_position_bucket`) and head, added to the self-attention logits of
  every layer of the stack. Computed once per stack (Hugging Face's T5 keeps the table in its
  first layer, `relative_attention_bias`, and passes the bias on to the others)."""

  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool  # True in the encoder, False (causal) in the decoder.
  param_dtype: jnp.dtype = jnp.float32
  init_stddev: float = 1.0  # Of the table's normal init (Hugging Face's T5: D^-0.5).

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array) -> Array:
    """query_positions int [B, T], key_positions int [B, S] -> float32 bias [B, N, T, S]."""
    table = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=self.init_stddev),
                                     (None, "heads")),
        (self.num_buckets, self.num_heads), self.param_dtype)
    relative = key_positions[:, None, :] - query_positions[:, :, None]  # [B, T, S]
    buckets = relative_position_bucket(relative, bidirectional=self.bidirectional,
                                       num_buckets=self.num_buckets,
                                       max_distance=self.max_distance)
    bias = jnp.take(table.astype(jnp.float32), buckets, axis=0)  # [B, T, S, N]
    return bias.transpose(0, 3, 1, 2)  # [B, N, T, S]


# The FFN's activations by config name. "gelu" is the exact x * Phi(x) (erf), as PyTorch's and
# Hugging Face's "gelu", not the tanh approximation; "swish" is x * sigmoid(x) (SiLU), Marian's.
# A gated FFN's act: "gated-gelu" is T5's, the tanh approximation (Hugging Face's gelu_new).
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": nn.relu,
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "swish": nn.swish,
    "gated-gelu": lambda x: nn.gelu(x, approximate=True),
    "gated-relu": nn.relu,
}


class FeedForward(nn.Module):
  """Position-wise FFN(x) = act(x W1 + b1) W2 + b2; act is max(0, .) in the paper.

  Parameters `wi` (W1, b1) and `wo` (W2, b2). Gated (`activation` "gated-gelu" or
  "gated-relu", T5 v1.1's): FFN(x) = (act(x W_0) * (x W_1)) W_o with `wi_0` (W_0, the activated
  one), `wi_1` (W_1, the linear one) and `wo`, the names of T5's checkpoints. `use_bias=False`
  drops every bias (T5's).
  """

  mlp_dim: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  activation: str = "relu"  # A key of ACTIVATIONS.
  quantized: bool = False  # int8 kernels (serving, `model.quantization`).
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """[B, T, D] -> [B, T, D]."""
    emb_dim = x.shape[-1]
    act = ACTIVATIONS[self.activation]
    if self.activation.startswith("gated-"):
      gate = self._dense(self.mlp_dim, ("embed", "mlp"), "wi_0")(x)  # [B, T, F]
      linear = self._dense(self.mlp_dim, ("embed", "mlp"), "wi_1")(x)  # [B, T, F]
      hidden = batch_split(act(gate) * linear)
    else:
      hidden = batch_split(act(self._dense(self.mlp_dim, ("embed", "mlp"), "wi")(x)))
    return self._dense(emb_dim, ("mlp", "embed"), "wo")(hidden)

  def _dense(self, features: int, axes: tuple[str, str], name: str) -> nn.Module:
    """One of the FFN's layers: [..., in] -> [..., features], int8 when `quantized`."""
    if self.quantized:
      return quantization.Int8DenseGeneral(features, use_bias=self.use_bias, dtype=self.dtype,
                                           kernel_axes=axes, name=name)
    return nn.Dense(
        features, use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
        name=name,
        kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]))


def layer_norm(config: ModelConfig, name: str | None = None) -> nn.LayerNorm | nn.RMSNorm:
  """The model's norm over D (`ModelConfig.norm_type`), statistics in float32: LayerNorm with a
  learned scale and bias, or T5's RMS norm x / sqrt(mean(x^2) + eps) * scale (no bias)."""
  if config.norm_type == "rms":
    return nn.RMSNorm(
        epsilon=config.layer_norm_epsilon, dtype=config.compute_dtype,
        param_dtype=config.parameter_dtype, name=name,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))
  return nn.LayerNorm(
      epsilon=config.layer_norm_epsilon, dtype=config.compute_dtype,
      param_dtype=config.parameter_dtype, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


class SubLayer(nn.Module):
  """One sub-layer f (attention or the FFN) with its LayerNorm, dropout and residual connection.

    post-norm (the paper): LayerNorm(x + Dropout(f(x)))
    pre-norm:              x + Dropout(f(LayerNorm(x)))

  The LayerNorm shares this module's scope, so its parameters sit at `<name>/{scale,bias}`: name
  the sub-layer after its norm (e.g. "self_attention_norm"), the layout of every checkpoint.
  `dropout` is the enclosing layer's `Dropout`, shared by all its sub-layers rather than owned by
  each: Flax derives the masks from the module's path, so one module per layer keeps the masks
  (and a run resumed from a checkpoint) as they have always been.
  """

  config: ModelConfig
  dropout: Dropout

  def setup(self):
    self.norm = layer_norm(self.config)
    nn.share_scope(self, self.norm)

  def __call__(self, x: Array, sublayer: Callable[[Array], Any], *, train: bool = False,
               has_aux: bool = False) -> Array | tuple[Array, Any]:
    """x [B, T, D] -> [B, T, D].

    Args:
      x: the residual stream [B, T, D].
      sublayer: f, [B, T, D] -> [B, T, D]; with `has_aux`, -> ([B, T, D], aux).
      train: whether dropout is on.
      has_aux: as in `jax.grad`: f also returns aux (e.g. an updated cache), which comes back
        untouched with the output: ([B, T, D], aux).
    """
    f = sublayer if has_aux else lambda h: (sublayer(h), None)
    if self.config.pre_norm:
      y, aux = f(self.norm(x))
      x = x + self.dropout(y, deterministic=not train)
    else:
      y, aux = f(x)
      x = self.norm(x + self.dropout(y, deterministic=not train))
    return (x, aux) if has_aux else x
