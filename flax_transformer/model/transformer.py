"""The encoder-decoder Transformer: encoder and decoder stacks, teacher-forced logits, and the
explicit cache for step-by-step decoding. Shape letters as in `attention.py`.

Training and scoring call the model itself, `encode` then `teacher_forced_logits`. Decoding uses
four calls, each a method of `Transformer` run through `model.apply`:
  encoded = encode(inputs)                                  # once per batch
  cross = precompute_cross_attention(encoded, inputs)       # cross-attention K/V, once per batch
  cache = init_cache(batch_size, max_decode_len)            # empty self-attention K/V
  logits, cache = decode_step(ids, cache, cross)            # once per output position
`cross` leads with B and is shared by all K beams of a sentence. The module-level `resize_cache`
changes the number of positions the cache has room for. A vocabulary shortlist (the search's
output restricted to a kept set of target ids) gathers its output-projection columns once per
batch, `shortlist = shortlist_output(ids)`, and `decode_step(ids, cache, cross, shortlist)`
then computes logits [B*K, V'] for those ids alone (`OutputShortlist`).

Beam search and the self-attention cache. Every decoded position's keys/values are written
once, into the cache slot of the beam that decoded it, and never move: K slots per sentence,
position-major (entry l*K + j holds position l of slot j), keys transposed [B, N, H, L*K] and
values [B, N, L*K, H]; `DecoderCache.slots` [B, K, L] says which slot holds position l of beam
k's prefix. When the search reorders its beams (beam k now extends beam parent[k]),
`reorder_cache` reorders that small table, not the keys/values: the cache indirection of
FasterTransformer's beam search, where other engines copy the whole cache by parent beam at
every step. Each beam then attends over the L*K entries of its sentence with a mask that
allows, at every position, the one slot on its own prefix: K times the attention's
multiply-adds, in batched matmuls that read the cache in place. `init_cache` gives one slot per
row (K = 1: greedy decoding, sampling, or beams as independent rows); `expand_cache` gives K
slots per sentence.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from flax_transformer.conventions import PAD_ID
from flax_transformer.model import quantization
from flax_transformer.model.attention import (
  KeyValues,
  MultiHeadAttention,
  causal_mask,
  combine_masks,
  padding_mask,
  segment_mask,
)
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.layers import (
  Dropout,
  Embedder,
  FeedForward,
  PositionalEncoding,
  RelativePositionBias,
  SubLayer,
  layer_norm,
)
from flax_transformer.model.quantization import Int8DenseGeneral
from flax_transformer.runtime.sharding import batch_split

Array = jax.Array



@flax.struct.dataclass
class DecoderCache:
  """Self-attention keys/values of the tokens decoded so far, K slots per sentence (module
  docstring): row b*K + k of the decoder's input is beam k of sentence b."""

  # One per decoder layer: keys [B, N, H, L*K] (transposed), values [B, N, L*K, H].
  self_attention: tuple[KeyValues, ...]
  slots: Array  # int32 [B, K, L]: the slot that holds position l of beam k's prefix
  index: Array  # int32 []: the next position to decode, the same for all rows


@flax.struct.dataclass
class CrossAttentionCache:
  """Cross-attention keys/values, computed once from the encoder output."""

  layers: tuple[KeyValues, ...]  # one per decoder layer, [B, N, S, H]
  source_mask: Array  # bool [B, S], True at real source tokens


@flax.struct.dataclass
class OutputShortlist:
  """The output projection restricted to a vocabulary shortlist, gathered once per batch
  (`Transformer.shortlist_output`), so that each decode step multiplies by V' columns, not V.

  `ids` are full vocabulary ids in ascending order; an entry equal to the one before it is
  padding (the list is padded to a size that few programs share by repeating its last id),
  and its logit is -inf: a padding entry never holds probability, so the step's distribution
  is the full one renormalized over the kept ids, exactly the logits the full step gives them.
  """

  ids: Array  # int32 [V']: kept ids, ascending; a repeat of the entry before it is padding
  # The projection's weights at `ids`, in the layout the full projection reads them: the tied
  # table's rows [V', D] (compute dtype), or kernel columns [D, V'] (untied, or int8).
  kernel: Array
  kernel_scale: Array | None  # float32 [V'] (int8), else None
  bias: Array | None  # [V']: the model's logits bias at `ids` (`ModelConfig.logits_bias`)

  @property
  def kept(self) -> Array:
    """bool [V']: the entries that are not padding (the first of each run of equal ids)."""
    return jnp.concatenate([jnp.ones((1,), bool), self.ids[1:] != self.ids[:-1]])


def shift_right(targets: Array, segment_ids: Array | None = None,
                start_id: int = PAD_ID) -> Array:
  """The decoder's inputs: targets moved one step right, `start_id` first (`PAD_ID`, or
  `ModelConfig.decoder_start_id`).

  With packed rows every example restarts: targets [a b c d] with segments [1 1 2 2] become
  [0 a 0 c].

  Args:
    targets: int [B, T]; segment_ids: int [B, T] or None; start_id: the first input token.
  Returns:
    int [B, T].
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=start_id)[:, :-1]
  if segment_ids is not None:
    previous = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segment_ids != previous, start_id, shifted)
  return shifted


def init_cache(config: ModelConfig, batch_size: int, max_decode_len: int) -> DecoderCache:
  """An empty decoder cache for `batch_size` rows of one slot each, up to `max_decode_len`
  positions."""
  if max_decode_len > config.max_len:
    raise ValueError(
        f"max_decode_len ({max_decode_len}) exceeds the model's max_len ({config.max_len}).")
  heads, head_dim = config.num_heads, config.head_dim
  empty = KeyValues(
      keys=jnp.zeros((batch_size, heads, head_dim, max_decode_len),  # [B, N, H, L*1]
                     config.compute_dtype),
      values=jnp.zeros((batch_size, heads, max_decode_len, head_dim),  # [B, N, L*1, H]
                       config.compute_dtype))
  return DecoderCache(
      self_attention=tuple(empty for _ in range(config.num_decoder_layers)),
      slots=jnp.zeros((batch_size, 1, max_decode_len), jnp.int32),
      index=jnp.zeros((), jnp.int32))


def resize_cache(cache: DecoderCache, capacity: int) -> DecoderCache:
  """The cache with room for `capacity` positions: slots [B, K, L] -> [B, K, capacity], keys
  [B, N, H, L*K] -> [B, N, H, capacity*K], values [B, N, L*K, H] -> [B, N, capacity*K, H].

  Growing appends zeros; shrinking drops the last positions, which must not be written yet
  (capacity >= `cache.index`). Beam search calls this between loop segments so that early
  steps attend over a short cache (the docs' design page, "Decoding": the growing state). The
  axes count from the end, so keys/values with leading axes of their own (an ensemble's
  [M, B, ...]) resize too.
  """
  beams = cache.slots.shape[1]

  def resize(x: Array, axis: int, size: int) -> Array:
    axis %= x.ndim
    length = x.shape[axis]
    if size <= length:
      return lax.slice_in_dim(x, 0, size, axis=axis)
    padding = [(0, 0)] * x.ndim
    padding[axis] = (0, size - length)
    return jnp.pad(x, padding)

  return DecoderCache(
      self_attention=tuple(KeyValues(keys=resize(kv.keys, -1, capacity * beams),
                                     values=resize(kv.values, -2, capacity * beams))
                           for kv in cache.self_attention),
      slots=resize(cache.slots, 2, capacity), index=cache.index)


def expand_cache(cache: DecoderCache, beams: int) -> DecoderCache:
  """A cache of one slot per sentence as K = `beams` slots, every beam's prefix in slot 0
  (`beam_search`'s `expand_state`): every position's entry repeated K times (axes from the end,
  as `resize_cache`)."""
  if cache.slots.shape[1] != 1:
    raise ValueError(f"expand_cache: the cache already has {cache.slots.shape[1]} slots per "
                     "sentence; expand a cache of one slot (init_cache).")
  return DecoderCache(
      self_attention=tuple(KeyValues(keys=jnp.repeat(kv.keys, beams, axis=-1),
                                     values=jnp.repeat(kv.values, beams, axis=-2))
                           for kv in cache.self_attention),
      slots=jnp.repeat(cache.slots, beams, axis=1), index=cache.index)


def reorder_cache(cache: DecoderCache, parent: Array) -> DecoderCache:
  """Beam k now extends beam parent[b, k] (int [B, K]): only the slot table moves, [B, K, L];
  the keys/values stay where they were written (`beam_search`'s `reorder_state`)."""
  slots = jnp.take_along_axis(cache.slots, parent[:, :, None].astype(jnp.int32), axis=1)
  return cache.replace(slots=slots)


def _self_attention_mask(slots: Array, index: Array) -> Array:
  """bool [B, 1, K, L*K]: beam k may attend to entry l*K + j (position l of slot j) when
  l <= index and slot j holds position l of its prefix, so exactly one slot per position."""
  batch, beams, length = slots.shape
  own = slots[..., None] == jnp.arange(beams, dtype=jnp.int32)  # [B, K, L, K]
  mask = own & (jnp.arange(length) <= index)[:, None]
  return mask.reshape(batch, 1, beams, length * beams)


def _attention(config: ModelConfig) -> MultiHeadAttention:
  return MultiHeadAttention(
      num_heads=config.num_heads, head_dim=config.head_dim,
      dropout_rate=config.attention_dropout_rate, dtype=config.compute_dtype,
      param_dtype=config.parameter_dtype, implementation=config.attention_implementation,
      use_bias=config.attention_bias, qkv_init_gain=config.qkv_init_gain,
      quantized=config.quantization == "int8", scale_logits=config.attention_scale,
      output_dim=config.emb_dim)


def _feed_forward(config: ModelConfig) -> FeedForward:
  return FeedForward(config.mlp_dim, config.compute_dtype, config.parameter_dtype,
                     activation=config.activation, quantized=config.quantization == "int8",
                     use_bias=config.mlp_bias)


def _default_positions(ids: Array) -> Array:
  return jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)


class EncoderLayer(nn.Module):
  """Self-attention, then the feed-forward network, each a `SubLayer` (norm, dropout, residual)."""

  config: ModelConfig

  def setup(self):
    c = self.config
    self.dropout = Dropout(c.dropout_rate)  # Shared by the sub-layers (see `SubLayer`).
    self.self_attention = _attention(c)
    self.self_attention_block = SubLayer(c, self.dropout, name="self_attention_norm")
    self.feed_forward = _feed_forward(c)
    self.feed_forward_block = SubLayer(c, self.dropout, name="feed_forward_norm")

  def __call__(self, x: Array, mask: Array | None, *, train: bool = False,
               bias: Array | None = None) -> Array:
    """x [B, S, D], mask bool [B, 1, S, S] (bias float32 [B, N, S, S] or None) -> [B, S, D]."""
    x = self.self_attention_block(
        x, lambda h: self.self_attention(h, h, mask, train=train, bias=bias), train=train)
    return self.feed_forward_block(x, self.feed_forward, train=train)


class DecoderLayer(nn.Module):
  """Causal self-attention, cross-attention to the encoder output, then the FFN."""

  config: ModelConfig

  def setup(self):
    c = self.config
    self.dropout = Dropout(c.dropout_rate)  # Shared by the sub-layers (see `SubLayer`).
    self.self_attention = _attention(c)
    self.self_attention_block = SubLayer(c, self.dropout, name="self_attention_norm")
    self.cross_attention = _attention(c)
    self.cross_attention_block = SubLayer(c, self.dropout, name="cross_attention_norm")
    self.feed_forward = _feed_forward(c)
    self.feed_forward_block = SubLayer(c, self.dropout, name="feed_forward_norm")

  def __call__(self, x: Array, encoded: Array, self_mask: Array | None,
               cross_mask: Array | None, *, train: bool = False,
               self_bias: Array | None = None) -> Array:
    """x [B, T, D], encoded [B, S, D], masks [B, 1, T, T] and [B, 1, T, S] (self_bias float32
    [B, N, T, T] or None) -> [B, T, D]."""
    x = self.self_attention_block(
        x, lambda h: self.self_attention(h, h, self_mask, train=train, bias=self_bias),
        train=train)
    x = self.cross_attention_block(
        x, lambda h: self.cross_attention(h, encoded, cross_mask, train=train), train=train)
    return self.feed_forward_block(x, self.feed_forward, train=train)

  def cross_key_values(self, encoded: Array) -> KeyValues:
    """Projects the encoder output [B, S, D] to this layer's cross-attention K/V [B, N, S, H]."""
    return self.cross_attention.cache_key_values(encoded)

  def decode_step(self, x: Array, cache: KeyValues, index: Array, self_mask: Array,
                  cross: KeyValues, source_mask: Array,
                  self_bias: Array | None = None) -> tuple[Array, KeyValues]:
    """One position: x [B*K, 1, D], cache (`DecoderCache`), self_mask [B, 1, K, L*K],
    cross [B', N, S, H] (B*K a multiple of B'), self_bias float32 [1, N, 1, L*K] or None
    -> [B*K, 1, D]."""
    x, cache = self.self_attention_block(
        x, lambda h: self.self_attention.attend_cached(h, cache, index, self_mask, self_bias),
        has_aux=True)
    x = self.cross_attention_block(
        x, lambda h: self.cross_attention.attend_grouped(h, cross, source_mask))
    return self.feed_forward_block(x, self.feed_forward), cache


class _Stack(nn.Module):
  """What the encoder and the decoder share: the embedding, the layers and the final norm.

  Scaled token embeddings + positions (then a LayerNorm with `embedding_norm`), dropout;
  `depth` layers of `layer_type` (one module reused at every depth with
  `share_layer_weights`); for pre-norm a final LayerNorm, since the
  last residual sum is not normalised otherwise. Parameters sit under the subclass's name, e.g.
  `encoder/layers_0/...` and `decoder/final_norm/...`. With relative-position buckets
  (`ModelConfig.relative_attention_num_buckets`, T5's), one bias table for the whole stack,
  `<stack>/relative_attention_bias/embedding` [buckets, N], whose bias is computed once per call
  and added to the self-attention of every layer.
  """

  config: ModelConfig
  embedder: Embedder
  layer_type: ClassVar[type[EncoderLayer | DecoderLayer]]
  bidirectional: ClassVar[bool]  # Relative positions after the query: the encoder's.

  @property
  def depth(self) -> int:
    """The number of layers."""
    raise NotImplementedError

  def setup(self):
    c = self.config
    self.positional_encoding = None if c.positional_encoding == "none" else PositionalEncoding(
        c.positional_encoding, c.max_len, c.emb_dim, c.compute_dtype, c.parameter_dtype,
        sinusoid_layout=c.sinusoid_layout, offset=c.position_offset)
    self.relative_attention_bias = None
    if c.relative_attention_num_buckets:
      self.relative_attention_bias = RelativePositionBias(
          c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads,
          self.bidirectional, c.parameter_dtype, init_stddev=c.emb_dim**-0.5)
    self.embedding_norm = layer_norm(c) if c.embedding_norm else None
    self.dropout = Dropout(c.dropout_rate)
    self.layers = [self.layer_type(c) for _ in range(1 if c.share_layer_weights else self.depth)]
    self.final_norm = layer_norm(c) if c.pre_norm else None

  def embed(self, ids: Array, positions: Array, *, train: bool = False) -> Array:
    """ids int [B, T], positions int [B, T] -> [B, T, D]."""
    x = self.embedder(ids)
    if self.positional_encoding is not None:
      x = x + self.positional_encoding(positions)
    if self.embedding_norm is not None:  # mBART's layernorm_embedding.
      x = self.embedding_norm(x)
    return batch_split(self.dropout(x, deterministic=not train))

  def self_attention_bias(self, query_positions: Array, key_positions: Array) -> Array | None:
    """The stack's relative-position bias float32 [B, N, T, S] of query_positions int [B, T]
    over key_positions int [B, S], or None without relative-position buckets."""
    if self.relative_attention_bias is None:
      return None
    return self.relative_attention_bias(query_positions, key_positions)

  def layer(self, depth: int) -> EncoderLayer | DecoderLayer:
    """The layer at `depth` (0 is next to the embeddings)."""
    return self.layers[depth % len(self.layers)]

  def normalize_output(self, x: Array) -> Array:
    """The stack's output [B, T, D]: LayerNorm(x) for pre-norm, x as it is for post-norm."""
    return x if self.final_norm is None else self.final_norm(x)


class Encoder(_Stack):
  """Source embeddings + positions, dropout, then the stack of encoder layers."""

  layer_type = EncoderLayer
  bidirectional = True

  @property
  def depth(self) -> int:
    return self.config.num_encoder_layers

  def __call__(self, inputs: Array, positions: Array, mask: Array | None, *,
               train: bool = False) -> Array:
    """inputs int [B, S], positions int [B, S], mask [B, 1, S, S] -> [B, S, D]."""
    x = self.embed(inputs, positions, train=train)
    bias = self.self_attention_bias(positions, positions)  # [B, N, S, S], once for all layers
    for depth in range(self.depth):
      x = batch_split(self.layer(depth)(x, mask, train=train, bias=bias))
    return self.normalize_output(x)


class Decoder(_Stack):
  """Target embeddings + positions, the decoder layers, and the output projection."""

  layer_type = DecoderLayer
  bidirectional = False

  @property
  def depth(self) -> int:
    return self.config.num_decoder_layers

  def setup(self):
    super().setup()
    c = self.config
    if not c.tie_output_projection and c.quantization == "int8":
      self.output_projection = Int8DenseGeneral(c.vocab_size, dtype=c.compute_dtype,
                                                kernel_axes=("embed", "vocab"))
    elif not c.tie_output_projection:
      self.output_projection = nn.DenseGeneral(
          c.vocab_size, use_bias=False, dtype=c.compute_dtype, param_dtype=c.parameter_dtype,
          kernel_init=nn.with_logical_partitioning(
              nn.initializers.xavier_uniform(), ("embed", "vocab")))
    if c.logits_bias:  # Marian's final_logits_bias: a learned [V] added to every row's logits.
      self.output_bias = self.param(
          "logits_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
          (c.vocab_size,), c.parameter_dtype)

  def __call__(self, decoder_inputs: Array, positions: Array, encoded: Array,
               self_mask: Array | None, cross_mask: Array | None, *,
               train: bool = False) -> Array:
    """Teacher-forced: decoder_inputs int [B, T], encoded [B, S, D] -> logits float32 [B, T, V]."""
    x = self.embed(decoder_inputs, positions, train=train)
    bias = self.self_attention_bias(positions, positions)  # [B, N, T, T], once for all layers
    for depth in range(self.depth):
      x = batch_split(self.layer(depth)(x, encoded, self_mask, cross_mask, train=train,
                                        self_bias=bias))
    return self._logits(x)

  def _logits(self, x: Array, shortlist: OutputShortlist | None = None) -> Array:
    """[B, T, D] -> float32 [B, T, V] (with `shortlist`: [B, T, V'], -inf at its padding)."""
    x = self.normalize_output(x)
    if self.config.scale_tied_logits:  # T5 v1.0's tied output reads x * D^-0.5.
      x = x * jnp.asarray(self.config.emb_dim**-0.5, x.dtype)
    if shortlist is not None:
      return self._shortlist_logits(x, shortlist)
    if self.config.tie_output_projection:
      logits = self.embedder.logits(x)
    else:
      logits = self.output_projection(x)
    if self.config.logits_bias:
      logits = logits + self.output_bias.astype(logits.dtype)
    return batch_split(logits.astype(jnp.float32))

  def _shortlist_logits(self, x: Array, shortlist: OutputShortlist) -> Array:
    """Normalized x [B, T, D] -> float32 [B, T, V']: `_logits`'s arithmetic on V' columns."""
    c = self.config
    if shortlist.kernel_scale is not None:  # int8 (w8a8), kernel [D, V'].
      rows = x.shape[:-1]
      logits = quantization.int8_matmul(x.reshape(-1, x.shape[-1]), shortlist.kernel,
                                        shortlist.kernel_scale)  # [B*T, V']
      logits = logits.reshape(*rows, -1)
      if not c.tie_output_projection:
        logits = logits.astype(c.compute_dtype)  # As Int8DenseGeneral's output.
    elif c.tie_output_projection:  # The table's rows [V', D], as `Embedder.logits`.
      logits = jnp.einsum("btd,vd->btv", x, shortlist.kernel)
    else:  # Kernel columns [D, V'], as `nn.DenseGeneral`.
      logits = jnp.einsum("btd,dv->btv", x, shortlist.kernel)
    if shortlist.bias is not None:
      logits = logits + shortlist.bias.astype(logits.dtype)
    logits = jnp.where(shortlist.kept, logits.astype(jnp.float32), -jnp.inf)
    return batch_split(logits)

  def shortlist_output(self, ids: Array) -> OutputShortlist:
    """The output projection's weights at `ids` int [V'] (ascending, repeats as padding:
    `OutputShortlist`), gathered once so that decode steps read V' columns."""
    c = self.config
    ids = jnp.asarray(ids, jnp.int32)
    if c.tie_output_projection:
      kernel, scale = self.embedder.logit_weights(ids)
    else:
      weights = nn.meta.unbox(self.variables["params"]["output_projection"])
      kernel = jnp.take(weights["kernel"], ids, axis=1)  # [D, V']
      scale = None
      if c.quantization == "int8":
        scale = jnp.take(weights["kernel_scale"], ids, axis=0)
      else:
        kernel = kernel.astype(c.compute_dtype)
    bias = jnp.take(self.output_bias, ids, axis=0) if c.logits_bias else None
    return OutputShortlist(ids=ids, kernel=kernel, kernel_scale=scale, bias=bias)

  def _cached_bias(self, cache: DecoderCache) -> Array | None:
    """The relative-position bias float32 [1, N, 1, L*K] of query position `cache.index` over
    the cache's entries (entry l*K + j holds position l), or None without buckets."""
    if self.relative_attention_bias is None:
      return None
    _, beams, length = cache.slots.shape
    query = jnp.reshape(cache.index, (1, 1)).astype(jnp.int32)  # [1, 1]
    keys = jnp.arange(length, dtype=jnp.int32)[None]  # [1, L]
    bias = self.relative_attention_bias(query, keys)  # [1, N, 1, L]
    return jnp.repeat(bias, beams, axis=-1)

  def cross_attention_cache(self, encoded: Array, source_mask: Array) -> CrossAttentionCache:
    """Cross-attention K/V of every layer from encoded [B, S, D], computed once."""
    distinct = [layer.cross_key_values(encoded) for layer in self.layers]
    return CrossAttentionCache(
        layers=tuple(distinct[d % len(distinct)] for d in range(self.depth)),
        source_mask=source_mask)

  def decode_step(self, ids: Array, cache: DecoderCache, cross: CrossAttentionCache,
                  shortlist: OutputShortlist | None = None) -> tuple[Array, DecoderCache]:
    """ids int [B*K, 1] at position `cache.index` -> (logits float32 [B*K, V], cache); with
    `shortlist`, logits [B*K, V'] of its ids alone."""
    batch, beams, _ = cache.slots.shape
    if ids.shape[0] != batch * beams:
      raise ValueError(f"decode_step: {ids.shape[0]} rows of ids for a cache of {batch} "
                       f"sentences x {beams} slots.")
    positions = jnp.full(ids.shape, cache.index, jnp.int32)  # [B*K, 1]
    x = self.embed(ids, positions)
    # Every beam writes this position into its own slot.
    own_slot = jnp.broadcast_to(jnp.arange(beams, dtype=jnp.int32)[:, None], (batch, beams, 1))
    slots = lax.dynamic_update_slice(cache.slots, own_slot, (0, 0, cache.index))  # [B, K, L]
    self_mask = _self_attention_mask(slots, cache.index)  # [B, 1, K, L*K], shared by the layers
    self_bias = self._cached_bias(cache)  # [1, N, 1, L*K] or None, shared by the layers
    new_self_attention = []
    for depth in range(self.depth):
      x, layer_cache = self.layer(depth).decode_step(
          x, cache.self_attention[depth], cache.index, self_mask, cross.layers[depth],
          cross.source_mask, self_bias)
      new_self_attention.append(layer_cache)
    logits = self._logits(x, shortlist)[:, 0]  # [B*K, V] (or [B*K, V'])
    return logits, DecoderCache(self_attention=tuple(new_self_attention), slots=slots,
                                index=cache.index + 1)


class Transformer(nn.Module):
  """The encoder-decoder Transformer of Vaswani et al. (2017).

  `apply(variables, inputs, targets)` gives logits [B, T, V] where position t is the
  distribution of targets[:, t] given the inputs and targets[:, :t]. Id 0 is padding.
  `train=True` turns dropout on (pass `rngs={"dropout": key}`).
  """

  config: ModelConfig

  def setup(self):
    c = self.config
    embedder = dict(vocab_size=c.vocab_size, emb_dim=c.emb_dim, dtype=c.compute_dtype,
                    param_dtype=c.parameter_dtype, scale=c.scale_embeddings,
                    quantized=c.quantization == "int8")
    self.embedder = Embedder(**embedder)  # Source (and, when shared, target) embeddings.
    if not c.share_embeddings:
      self.target_embedder = Embedder(**embedder)
    target_embedder = self.embedder if c.share_embeddings else self.target_embedder
    self.encoder = Encoder(c, self.embedder)
    self.decoder = Decoder(c, target_embedder)

  def __call__(self, inputs: Array, targets: Array, *, inputs_segment_ids: Array | None = None,
               targets_segment_ids: Array | None = None, inputs_positions: Array | None = None,
               targets_positions: Array | None = None, train: bool = False) -> Array:
    """inputs int [B, S], targets int [B, T] (+ packing metadata) -> logits float32 [B, T, V]."""
    encoded = self.encode(inputs, inputs_segment_ids=inputs_segment_ids,
                          inputs_positions=inputs_positions, train=train)
    return self.teacher_forced_logits(
        encoded, inputs, targets, inputs_segment_ids=inputs_segment_ids,
        targets_segment_ids=targets_segment_ids, targets_positions=targets_positions,
        train=train)

  def encode(self, inputs: Array, *, inputs_segment_ids: Array | None = None,
             inputs_positions: Array | None = None, train: bool = False) -> Array:
    """inputs int [B, S] -> encoder output [B, S, D]."""
    valid = inputs > PAD_ID  # Ids are never negative.
    mask = combine_masks(
        padding_mask(valid, valid),
        None if inputs_segment_ids is None else segment_mask(inputs_segment_ids,
                                                             inputs_segment_ids))
    positions = _default_positions(inputs) if inputs_positions is None else inputs_positions
    return self.encoder(inputs, positions, mask, train=train)

  def teacher_forced_logits(self, encoded: Array, inputs: Array, targets: Array, *,
                            inputs_segment_ids: Array | None = None,
                            targets_segment_ids: Array | None = None,
                            targets_positions: Array | None = None,
                            train: bool = False) -> Array:
    """Teacher-forced decoder: encoded [B, S, D], targets int [B, T] -> logits [B, T, V]."""
    target_valid, source_valid = targets > PAD_ID, inputs > PAD_ID
    packed = targets_segment_ids is not None and inputs_segment_ids is not None
    self_mask = combine_masks(
        padding_mask(target_valid, target_valid), causal_mask(targets.shape[1]),
        segment_mask(targets_segment_ids, targets_segment_ids) if packed else None)
    cross_mask = combine_masks(
        padding_mask(target_valid, source_valid),
        segment_mask(targets_segment_ids, inputs_segment_ids) if packed else None)
    positions = _default_positions(targets) if targets_positions is None else targets_positions
    decoder_inputs = shift_right(targets, targets_segment_ids, self.config.decoder_start_id)
    return self.decoder(decoder_inputs, positions, encoded, self_mask, cross_mask, train=train)

  def precompute_cross_attention(self, encoded: Array, inputs: Array) -> CrossAttentionCache:
    """Cross-attention K/V of every decoder layer, from encoded [B, S, D] and inputs [B, S]."""
    return self.decoder.cross_attention_cache(encoded, inputs > PAD_ID)

  def init_cache(self, batch_size: int, max_decode_len: int) -> DecoderCache:
    """An empty self-attention cache (see the module-level `init_cache`)."""
    return init_cache(self.config, batch_size, max_decode_len)

  def decode_step(self, ids: Array, cache: DecoderCache, cross: CrossAttentionCache,
                  shortlist: OutputShortlist | None = None) -> tuple[Array, DecoderCache]:
    """One decoding step for every row: ids int [B*K, 1] -> (logits [B*K, V], new cache);
    with `shortlist` (`shortlist_output`), logits [B*K, V'] of its ids alone."""
    return self.decoder.decode_step(ids, cache, cross, shortlist)

  def shortlist_output(self, ids: Array) -> OutputShortlist:
    """The output projection at the shortlist `ids` int [V'] (`OutputShortlist`), once per
    batch, for `decode_step`."""
    return self.decoder.shortlist_output(ids)
