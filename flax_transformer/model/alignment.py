"""Cross-attention as alignment: the attention of the decoder layer and heads that the model
config names (`ModelConfig.alignment_layer`, `alignment_heads`), from a teacher-forced pass.

Row t of the alignment is the attention of the query at target position t, the position that
predicts targets[t] (it reads targets[t - 1]): the attention of the step that emitted token t
in a search, as fairseq's `--print-alignment`, Marian's `--alignment` and CTranslate2's
`return_attention` take it. Decoding reads it for the chosen hypotheses
(`decoding.bridge.hypothesis_alignments`); guided alignment training puts a loss on it.

The weights are the ones `MultiHeadAttention` sows into the "intermediates" collection (the
attention pictures' mechanism): under `jax.jit` the weights of the other layers are never
computed, since nothing reads them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from flax_transformer.model.config import ModelConfig

Array = jax.Array


def alignment_layer_index(config: ModelConfig) -> int:
  """The decoder layer of the alignment, 0-based from the bottom."""
  return config.alignment_layer % config.num_decoder_layers


def select_heads(weights: Array, config: ModelConfig) -> Array:
  """f32 [B, N, T, S] attention weights -> [B, T, S], the mean of the alignment heads (the first
  `alignment_heads`, or all when 0)."""
  heads = config.alignment_heads or config.num_heads
  return jnp.mean(weights[:, :heads].astype(jnp.float32), axis=1)


def cross_attention_weights(intermediates: Any, config: ModelConfig) -> Array:
  """The alignment layer's sown cross-attention weights [B, N, T, S] from a model call's
  "intermediates" collection. With `share_layer_weights` one layer module runs at every depth
  and holds one entry per depth."""
  depth = alignment_layer_index(config)
  decoder = intermediates["decoder"]
  if config.share_layer_weights:
    return decoder["layers_0"]["cross_attention"]["attention_weights"][depth]
  return decoder[f"layers_{depth}"]["cross_attention"]["attention_weights"][0]


def logits_and_alignment(model: Any, variables: Any, inputs: Array, targets: Array,
                         **kwargs: Any) -> tuple[Array, Array]:
  """One teacher-forced pass: (logits f32 [B, T, V], alignment f32 [B, T, S]).

  `model` is the `Transformer`; `kwargs` go to its call (packing's segment ids and positions,
  `train`, and `rngs` for dropout). Alignment rows of padding positions are the attention of
  a masked query (uniform); callers mask them.
  """
  logits, state = model.apply(variables, inputs, targets, mutable=["intermediates"], **kwargs)
  weights = cross_attention_weights(state["intermediates"], model.config)  # [B, N, T, S]
  return logits, select_heads(weights, model.config)
