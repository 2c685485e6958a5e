"""Hugging Face Marian weights <-> this package's parameter tree, both directions from one table.

Shape letters as in `flax_transformer.model.attention` (D model dim, N heads, H head dim, F FFN
dim, V vocabulary). Hugging Face stores `nn.Linear` weights as [out, in] and splits heads off
the output axis (`view(..., N, H)`); ours are kernels [in, out] with the heads as their own axes:

  q/k/v_proj.weight [N*H, D]  <->  query/key/value kernel [D, N, H]   (transpose, reshape)
  q/k/v_proj.bias   [N*H]     <->  query/key/value bias   [N, H]
  out_proj.weight   [D, N*H]  <->  output kernel          [N, H, D]
  fc1/fc2.weight    [out, in] <->  wi/wo kernel           [in, out]
  *_layer_norm.weight, .bias  <->  *_norm scale, bias
  shared.weight (or encoder/decoder.embed_tokens.weight) [V, D]  <->  embedding [V, D], rows in
                                                                     our id order
  lm_head.weight [V, D]       <->  decoder output_projection kernel [D, V] (untied models only)
  final_logits_bias [1, V]    <->  decoder logits_bias [V]

The rest of the BART family (M2M-100, NLLB, mBART; `interop.bart`) adds, where its config has them:

  {encoder,decoder}.layer_norm          <->  {encoder,decoder}/final_norm (pre-norm)
  {encoder,decoder}.layernorm_embedding <->  {encoder,decoder}/embedding_norm
  {encoder,decoder}.embed_positions.weight [max_len + offset, D]
                                        <->  {encoder,decoder}/positional_encoding/
                                             position_embedding (learned positions)

Rows (and logits-bias entries) are reordered by the vocabulary's permutation
(`MarianTokenizer.marian_ids`: row i of ours is Marian's row marian_ids[i]).
`permute_model_dim` reorders every D axis of a parameter tree, which maps a model with
interleaved sinusoids onto the same function with halves sinusoids (Marian's only layout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from flax_transformer.errors import InputError
from flax_transformer.model.config import ModelConfig

Params = dict[str, Any]
# (our path, Hugging Face key, kind); kinds name the conversion in _TO_OURS / _TO_MARIAN.
Entry = tuple[tuple[str, ...], str, str]

_ATTENTIONS = {"self_attention": "self_attn", "cross_attention": "encoder_attn"}
_NORMS = {"self_attention_norm": "self_attn_layer_norm",
          "cross_attention_norm": "encoder_attn_layer_norm",
          "feed_forward_norm": "final_layer_norm"}
_PROJECTIONS = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "out_proj"}


def _layer_entries(ours: tuple[str, ...], theirs: str, decoder: bool) -> Iterator[Entry]:
  """The entries of one encoder or decoder layer."""
  for attention, hf_attention in _ATTENTIONS.items():
    if attention == "cross_attention" and not decoder:
      continue
    for projection, hf_projection in _PROJECTIONS.items():
      kind = "output" if projection == "output" else "heads"
      key = f"{theirs}.{hf_attention}.{hf_projection}"
      yield (*ours, attention, projection, "kernel"), f"{key}.weight", f"{kind}_kernel"
      yield (*ours, attention, projection, "bias"), f"{key}.bias", f"{kind}_bias"
  for norm, hf_norm in _NORMS.items():
    if norm == "cross_attention_norm" and not decoder:
      continue
    yield (*ours, norm, "scale"), f"{theirs}.{hf_norm}.weight", "vector"
    yield (*ours, norm, "bias"), f"{theirs}.{hf_norm}.bias", "vector"
  for dense, hf_dense in (("wi", "fc1"), ("wo", "fc2")):
    yield (*ours, "feed_forward", dense, "kernel"), f"{theirs}.{hf_dense}.weight", "dense"
    yield (*ours, "feed_forward", dense, "bias"), f"{theirs}.{hf_dense}.bias", "vector"


def _norm_entries(ours: tuple[str, ...], theirs: str) -> list[Entry]:
  return [((*ours, "scale"), f"{theirs}.weight", "vector"),
          ((*ours, "bias"), f"{theirs}.bias", "vector")]


def entries(config: ModelConfig) -> list[Entry]:
  """Every parameter of a Marian-compatible `config`, with its Hugging Face key and kind."""
  table: list[Entry] = []
  if config.share_embeddings:
    table.append((("embedder", "embedding"), "model.shared.weight", "embedding"))
  else:
    table.append((("embedder", "embedding"), "model.encoder.embed_tokens.weight", "embedding"))
    table.append((("target_embedder", "embedding"), "model.decoder.embed_tokens.weight",
                  "embedding"))
  for stack, count in (("encoder", config.num_encoder_layers),
                       ("decoder", config.num_decoder_layers)):
    for i in range(count):
      table += _layer_entries((stack, f"layers_{i}"), f"model.{stack}.layers.{i}",
                              stack == "decoder")
  for stack in ("encoder", "decoder"):
    if config.pre_norm:
      table += _norm_entries((stack, "final_norm"), f"model.{stack}.layer_norm")
    if config.embedding_norm:
      table += _norm_entries((stack, "embedding_norm"), f"model.{stack}.layernorm_embedding")
    if config.positional_encoding == "learned":
      table.append(((stack, "positional_encoding", "position_embedding"),
                    f"model.{stack}.embed_positions.weight", "vector"))
  if not config.tie_output_projection:
    table.append((("decoder", "output_projection", "kernel"), "lm_head.weight", "lm_head"))
  if config.logits_bias:
    table.append((("decoder", "logits_bias"), "final_logits_bias", "logits_bias"))
  return table


def unmapped_keys(state: dict[str, np.ndarray], config: ModelConfig,
                  also_known: set[str]) -> list[str]:
  """The checkpoint's weight names (sorted) that neither `entries(config)`, Hugging Face's
  copies of the shared table and tied head, nor `also_known` (a family's buffers) map."""
  known = {key for _, key, _ in entries(config)} | also_known
  known |= {"model.shared.weight", "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight"}
  if config.tie_output_projection:
    known.add("lm_head.weight")
  return sorted(set(state) - known)


def _heads(config: ModelConfig) -> tuple[int, int]:
  return config.num_heads, config.head_dim


# kind -> (Hugging Face array, config, vocabulary order) -> our array.
_TO_OURS: dict[str, Callable[[np.ndarray, ModelConfig, np.ndarray], np.ndarray]] = {
    "heads_kernel": lambda w, c, _: w.T.reshape(c.emb_dim, *_heads(c)),  # [D, N, H]
    "heads_bias": lambda b, c, _: b.reshape(*_heads(c)),  # [N, H]
    "output_kernel": lambda w, c, _: w.T.reshape(*_heads(c), c.emb_dim),  # [N, H, D]
    "output_bias": lambda b, c, _: b,
    "dense": lambda w, c, _: w.T,
    "vector": lambda v, c, _: v,
    "embedding": lambda e, c, order: e[order],  # [V, D], our id order
    "lm_head": lambda w, c, order: w[order].T,  # [D, V]
    "logits_bias": lambda b, c, order: b.reshape(-1)[order],  # [V]
}
# kind -> (our array, config, inverse order) -> Hugging Face array.
_TO_MARIAN: dict[str, Callable[[np.ndarray, ModelConfig, np.ndarray], np.ndarray]] = {
    "heads_kernel": lambda k, c, _: k.reshape(c.emb_dim, -1).T,  # [N*H, D]
    "heads_bias": lambda b, c, _: b.reshape(-1),  # [N*H]
    "output_kernel": lambda k, c, _: k.reshape(-1, c.emb_dim).T,  # [D, N*H]
    "output_bias": lambda b, c, _: b,
    "dense": lambda k, c, _: k.T,
    "vector": lambda v, c, _: v,
    "embedding": lambda e, c, inverse: e[inverse],  # [V, D], Marian's id order
    "lm_head": lambda k, c, inverse: k.T[inverse],  # [V, D]
    "logits_bias": lambda b, c, inverse: b[inverse][None],  # [1, V]
}


def params_from_marian(state: dict[str, np.ndarray], config: ModelConfig,
                       marian_ids: np.ndarray) -> Params:
  """Our params (nested dicts of float32 arrays) from a Hugging Face Marian state dict.

  Args:
    state: {key: array} as in model.safetensors.
    config: the architecture (`marian.model_config_from_marian`).
    marian_ids: int [V], the Marian id of each of our ids.
  Raises:
    ValueError: naming keys the architecture needs but `state` lacks, or wrong shapes.
  """
  params: Params = {}
  missing = [key for _, key, _ in entries(config) if key not in state]
  if missing:
    raise InputError(f"The checkpoint lacks {len(missing)} weight(s) of the model its "
                     f"config.json describes: {', '.join(missing[:8])}.")
  for path, key, kind in entries(config):
    value = _TO_OURS[kind](np.asarray(state[key], np.float32), config, marian_ids)
    node = params
    for name in path[:-1]:
      node = node.setdefault(name, {})
    node[path[-1]] = np.ascontiguousarray(value)
  return params


def marian_from_params(params: Params, config: ModelConfig,
                       marian_ids: np.ndarray) -> dict[str, np.ndarray]:
  """The Hugging Face Marian state dict of our `params` (all biases present: zeros where our
  model has none, which computes the same function). A shared table with an untied output
  projection is also written as each side's table: transformers 5 ties nothing when
  tie_word_embeddings is false."""
  state = state_from_params(_with_zero_biases(params, config), full_config(config),
                            marian_ids)
  if config.share_embeddings and not config.tie_output_projection:
    for side in ("encoder", "decoder"):
      state[f"model.{side}.embed_tokens.weight"] = state["model.shared.weight"].copy()
  return state


def state_from_params(params: Params, config: ModelConfig,
                      marian_ids: np.ndarray) -> dict[str, np.ndarray]:
  """The Hugging Face state dict of every entry of `config` (`entries`), float32, rows in
  Hugging Face's id order; the inverse of `params_from_marian`."""
  inverse = np.argsort(marian_ids)  # Our id of each Hugging Face id.
  state = {}
  for path, key, kind in entries(config):
    value = params
    for name in path:
      value = value[name]
    state[key] = np.ascontiguousarray(_TO_MARIAN[kind](np.asarray(value, np.float32), config,
                                                       inverse), dtype=np.float32)
  return state


def full_config(config: ModelConfig) -> ModelConfig:
  """`config` with the parameters every Marian model has: attention biases and a logits bias."""
  return config.replace(attention_bias=True, logits_bias=True)


def _with_zero_biases(params: Params, config: ModelConfig) -> Params:
  """`params` plus zero attention biases and a zero logits bias where the model has none."""
  params = _copy(params)
  if not config.attention_bias:
    for path, _, kind in entries(full_config(config)):
      if kind in ("heads_bias", "output_bias"):
        shape = _heads(config) if kind == "heads_bias" else (config.emb_dim,)
        node = params
        for name in path[:-1]:
          node = node[name]
        node[path[-1]] = np.zeros(shape, np.float32)
  if not config.logits_bias:
    params["decoder"]["logits_bias"] = np.zeros(config.vocab_size, np.float32)
  return params


def _copy(tree: Any) -> Any:
  return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


# Which axis of each parameter is the model dim D (None: no D axis), by the last path names.
_MODEL_DIM_AXES = {
    ("embedder", "embedding"): 1, ("target_embedder", "embedding"): 1,
    ("query", "kernel"): 0, ("key", "kernel"): 0, ("value", "kernel"): 0,
    ("query", "bias"): None, ("key", "bias"): None, ("value", "bias"): None,
    ("output", "kernel"): 2, ("output", "bias"): 0,
    ("wi", "kernel"): 0, ("wi", "bias"): None, ("wo", "kernel"): 1, ("wo", "bias"): 0,
    ("output_projection", "kernel"): 0, ("decoder", "logits_bias"): None,
    ("positional_encoding", "position_embedding"): 1,
}


def permute_model_dim(params: Params, permutation: np.ndarray) -> Params:
  """Every D axis of every parameter reordered by `permutation` [D].

  All hidden states of the permuted model are the original's, permuted the same way: LayerNorm
  takes its statistics over all of D, and every product over D pairs two permuted axes. With
  `layers.sinusoid_permutation(D)` it turns a model with interleaved sinusoids into the same
  function with halves sinusoids. A parameter this table does not know raises KeyError, so a
  new kind of parameter cannot be left unpermuted.
  """
  def walk(tree: Any, path: tuple[str, ...]) -> Any:
    if isinstance(tree, dict):
      return {k: walk(v, (*path, k)) for k, v in tree.items()}
    key = path[-2:]
    axis = 0 if path[-2].endswith("norm") else _MODEL_DIM_AXES[key]
    array = np.asarray(tree)
    return array if axis is None else np.take(array, permutation, axis=axis)

  return walk(params, ())
