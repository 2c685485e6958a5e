"""An independent float64 NumPy implementation of the paper's equations, for the model tests.

It shares no code with `flax_transformer`; it only reads the weights out of a Flax parameter
tree. Letters: b batch, s source length, t target length, d model dim, n heads, h head dim.

`transformer(..., int8=True)` is the int8 serving scheme (w8a8) from its definition: every
projection's float weights quantized here, one scale per output channel (max |w| / 127 over the
contracted axes), its input one scale per row (max |x| / 127 over the contracted features), the
integer product exact (float64 holds it) and scaled back; each embedding table one scale per
token, a lookup reading the dequantized row, the tied output projection that quantized table.

The T5 family's options (`ModelConfig`'s norm_type "rms", relative_attention_num_buckets,
attention_scale False, the gated activations, mlp_bias False, scale_tied_logits,
positional_encoding "none") from their definitions: `rms_norm`, `relative_bucket` (Hugging
Face's `T5Attention._relative_position_bucket` in Python floats), `relative_bias`.

`bleu` is corpus BLEU written out from its paper, for the scoring and serving tests.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

NEG_INF = -1e30


def f64(tree: Any) -> Any:
  """Every leaf of a (nested dict) parameter tree as a float64 NumPy array."""
  if isinstance(tree, dict):
    return {k: f64(v) for k, v in tree.items()}
  return np.asarray(tree, dtype=np.float64)


def sinusoids(max_len: int, dim: int, layout: str = "interleaved") -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

  "halves": Marian's layout as Hugging Face's MarianSinusoidalPositionalEmbedding writes it:
  angle(pos, j) = pos / 10000^(2 (j // 2) / d) for j < d; the sines of the even j fill the first
  ceil(d/2) features, the cosines of the odd j the rest.
  """
  table = np.zeros((max_len, dim))
  for pos in range(max_len):
    if layout == "fairseq":  # fairseq / M2M-100: w_i = 10000^(-i / (d/2 - 1)), i < d/2.
      half = dim // 2
      angles = [pos * math.exp(-i * math.log(10000) / (half - 1)) for i in range(half)]
      table[pos, :2 * half] = [math.sin(a) for a in angles] + [math.cos(a) for a in angles]
      continue
    if layout == "halves":
      angles = [pos / 10000 ** (2 * (j // 2) / dim) for j in range(dim)]
      table[pos] = [math.sin(a) for a in angles[0::2]] + [math.cos(a) for a in angles[1::2]]
      continue
    for feature in range(dim):
      i2 = feature - feature % 2
      angle = pos / 10000 ** (i2 / dim)
      table[pos, feature] = math.sin(angle) if feature % 2 == 0 else math.cos(angle)
  return table


def activation(name: str, x: np.ndarray) -> np.ndarray:
  """relu max(0, x); gelu x * Phi(x) with the exact normal CDF; swish x * sigmoid(x); the gated
  FFNs' act: "gated-gelu" 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (T5's gelu_new),
  "gated-relu" max(0, x)."""
  if name in ("relu", "gated-relu"):
    return np.maximum(0.0, x)
  if name == "gated-gelu":
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
  if name == "gelu":
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
  if name == "swish":
    return x / (1.0 + np.exp(-x))
  raise ValueError(name)


def softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(axis=-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(axis=-1, keepdims=True)


def attention_weights(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None,
                      bias: np.ndarray | None = None, scaled: bool = True) -> np.ndarray:
  """`attention`'s softmax weights [b,n,t,s], before dropout."""
  scores = np.einsum("btnh,bsnh->bnts", q, k)
  if scaled:
    scores = scores / math.sqrt(q.shape[-1])
  if bias is not None:
    scores = scores + bias
  if mask is not None:
    scores = np.where(mask, scores, NEG_INF)
  return softmax(scores)


def recording_attention(recorded: list) -> Any:
  """`attention` that also appends each call's weights [b,n,t,s] to `recorded`: patched over
  `attention` (monkeypatch), it gives a forward pass's attention weights, in call order."""
  plain = attention

  def recording(q, k, v, mask, keep=None, rate=0.0, bias=None, scaled=True):
    recorded.append(attention_weights(q, k, mask, bias, scaled))
    return plain(q, k, v, mask, keep, rate, bias, scaled)

  return recording


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
              keep: np.ndarray | None = None, rate: float = 0.0, bias: np.ndarray | None = None,
              scaled: bool = True) -> np.ndarray:
  """softmax(q k^T / sqrt(h) + bias + mask) v with q [b,t,n,h], k/v [b,s,n,h], mask and bias
  [b|1,1|n,t,s]; `scaled=False`: q k^T without 1/sqrt(h) (T5)."""
  weights = attention_weights(q, k, mask, bias, scaled)
  if keep is not None:
    weights = np.where(keep, weights / (1 - rate), 0.0)
  return np.einsum("bnts,bsnh->btnh", weights, v)


def quantize(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
  """Symmetric int8 levels (float64 integers in [-127, 127]) and scales, one per slice over
  `axes` (kept as size-1 axes): scale = max |x| / 127, 1 for an all-zero slice."""
  scale = np.abs(x).max(axis=axes, keepdims=True) / 127.0
  scale = np.where(scale > 0, scale, 1.0)
  return np.clip(np.rint(x / scale), -127, 127), scale


def float_product(x: np.ndarray, w: np.ndarray, contracted: int = 1) -> np.ndarray:
  """x [..., *C] . w [*C, *F] over the `contracted` trailing axes of x (leading of w)."""
  return np.tensordot(x, w, axes=contracted)


def int8_product(x: np.ndarray, w: np.ndarray, contracted: int = 1) -> np.ndarray:
  """`float_product` in the w8a8 scheme: x per row, w per output channel, the integers'
  product exact, scaled back."""
  x_q, x_scale = quantize(x, tuple(range(x.ndim - contracted, x.ndim)))
  w_q, w_scale = quantize(w, tuple(range(contracted)))
  x_scale = x_scale.reshape(x.shape[:x.ndim - contracted] + (1,) * (w.ndim - contracted))
  return np.tensordot(x_q, w_q, axes=contracted) * x_scale * w_scale.reshape(
      w.shape[contracted:])


def multi_head(p: dict, x_query: np.ndarray, x_key: np.ndarray,
               mask: np.ndarray | None, dot=float_product, logits_bias: np.ndarray | None = None,
               scaled: bool = True) -> np.ndarray:
  """Concat(head_1..head_n) W_O (+ b_O) with head_i = attention(x W_Q^i (+ b_Q^i), ...).

  The biases are used where the parameters hold them (config.model.attention_bias). `dot`:
  the projections' product (`float_product` or `int8_product`); `logits_bias`, `scaled`: the
  logits' (`attention`'s bias and scaled).
  """
  def bias(name: str) -> np.ndarray | float:
    return p[name].get("bias", 0.0)

  q = dot(x_query, p["query"]["kernel"]) + bias("query")  # [b, t, n, h]
  k = dot(x_key, p["key"]["kernel"]) + bias("key")  # [b, s, n, h]
  v = dot(x_key, p["value"]["kernel"]) + bias("value")
  heads = attention(q, k, v, mask, bias=logits_bias, scaled=scaled)
  return dot(heads, p["output"]["kernel"], contracted=2) + bias("output")


def layer_norm(p: dict, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def rms_norm(p: dict, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """T5's LayerNorm: x / sqrt(mean(x^2) + eps) * scale; no mean subtracted, no bias."""
  return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * p["scale"]


def norm(p: dict, x: np.ndarray, eps: float = 1e-6, kind: str = "layer") -> np.ndarray:
  """`layer_norm` or (kind "rms") `rms_norm`."""
  return rms_norm(p, x, eps) if kind == "rms" else layer_norm(p, x, eps)


def feed_forward(p: dict, x: np.ndarray, act: str = "relu", dot=float_product) -> np.ndarray:
  """act(x W1 + b1) W2 + b2; gated ("gated-gelu", "gated-relu"): (act(x W_0) * x W_1) W_o.
  Biases where the parameters hold them (config.model.mlp_bias)."""
  def layer(name: str, h: np.ndarray) -> np.ndarray:
    return dot(h, p[name]["kernel"]) + p[name].get("bias", 0.0)

  if act.startswith("gated-"):
    hidden = activation(act, layer("wi_0", x)) * layer("wi_1", x)
  else:
    hidden = activation(act, layer("wi", x))
  return layer("wo", hidden)


def sublayer(x: np.ndarray, norm_params: dict, fn, pre_norm: bool, eps: float = 1e-6,
             kind: str = "layer") -> np.ndarray:
  if pre_norm:
    return x + fn(norm(norm_params, x, eps, kind))
  return norm(norm_params, x + fn(x), eps, kind)


def encoder_layer(p: dict, x: np.ndarray, mask: np.ndarray, pre_norm: bool,
                  act: str = "relu", eps: float = 1e-6, dot=float_product, kind: str = "layer",
                  bias: np.ndarray | None = None, scaled: bool = True) -> np.ndarray:
  """One encoder layer; `kind` the norm's, `bias` and `scaled` the self-attention logits'."""
  x = sublayer(x, p["self_attention_norm"],
               lambda h: multi_head(p["self_attention"], h, h, mask, dot, bias, scaled),
               pre_norm, eps, kind)
  return sublayer(x, p["feed_forward_norm"],
                  lambda h: feed_forward(p["feed_forward"], h, act, dot), pre_norm, eps, kind)


def decoder_layer(p: dict, y: np.ndarray, memory: np.ndarray, self_mask: np.ndarray,
                  cross_mask: np.ndarray, pre_norm: bool, act: str = "relu",
                  eps: float = 1e-6, dot=float_product, kind: str = "layer",
                  bias: np.ndarray | None = None, scaled: bool = True) -> np.ndarray:
  """One decoder layer; `bias` is the self-attention's alone (none in cross-attention)."""
  y = sublayer(y, p["self_attention_norm"],
               lambda h: multi_head(p["self_attention"], h, h, self_mask, dot, bias, scaled),
               pre_norm, eps, kind)
  y = sublayer(y, p["cross_attention_norm"],
               lambda h: multi_head(p["cross_attention"], h, memory, cross_mask, dot, None,
                                    scaled), pre_norm, eps, kind)
  return sublayer(y, p["feed_forward_norm"],
                  lambda h: feed_forward(p["feed_forward"], h, act, dot), pre_norm, eps, kind)


def relative_bucket(relative_position: int, bidirectional: bool, num_buckets: int,
                    max_distance: int) -> int:
  """T5's bucket of key position - query position (Hugging Face's
  `T5Attention._relative_position_bucket`), one Python integer at a time: bidirectional, half
  of the buckets for keys after the query; of a side's n buckets, offsets below n / 2 one each,
  then n/2 + floor(log(offset / (n/2)) / log(max_distance / (n/2)) * (n - n/2)), at most n - 1.
  Causal: keys after the query count as offset 0."""
  bucket = 0
  if bidirectional:
    num_buckets //= 2
    bucket = num_buckets if relative_position > 0 else 0
    offset = abs(relative_position)
  else:
    offset = max(-relative_position, 0)
  exact = num_buckets // 2
  if offset < exact:
    return bucket + offset
  large = exact + int(math.log(offset / exact) / math.log(max_distance / exact)
                      * (num_buckets - exact))
  return bucket + min(large, num_buckets - 1)


def relative_bias(table: np.ndarray, query_positions: np.ndarray, key_positions: np.ndarray,
                  bidirectional: bool, max_distance: int) -> np.ndarray:
  """T5's relative-position bias [1, n, t, s] from its table [buckets, n]: entry (i, j) is
  table[bucket(key_positions[j] - query_positions[i])]."""
  buckets = np.array([[relative_bucket(int(k - q), bidirectional, table.shape[0], max_distance)
                       for k in key_positions] for q in query_positions])  # [t, s]
  return table[buckets].transpose(2, 0, 1)[None]


def transformer(params: dict, cfg: Any, inputs: np.ndarray, targets: np.ndarray,
                int8: bool = False) -> np.ndarray:
  """Logits [b, t, v] of the whole model for unpacked, 0-padded inputs [b, s] and targets [b, t];
  `int8`: served in the int8 scheme (the module's docstring), from the float parameters."""
  p = f64(params)
  dot = int8_product if int8 else float_product
  pre_norm = cfg.norm_placement == "pre"
  act, eps, kind = cfg.activation, cfg.layer_norm_epsilon, cfg.norm_type
  scaled = cfg.attention_scale
  d = cfg.emb_dim
  scale = math.sqrt(d) if cfg.scale_embeddings else 1.0
  source_table = p["embedder"]["embedding"]
  target_table = source_table if cfg.share_embeddings else p["target_embedder"]["embedding"]
  if int8:  # One scale per token: a lookup, and the tied projection, read the levels x scale.
    dequantized = lambda table: np.multiply(*quantize(table, (1,)))
    source_table, target_table = dequantized(source_table), dequantized(target_table)

  offset = cfg.position_offset  # Position p reads table row p + offset.

  def positions(module: dict, length: int) -> np.ndarray | float:
    if cfg.positional_encoding == "none":
      return 0.0
    if cfg.positional_encoding == "learned":
      return module["positional_encoding"]["position_embedding"][offset:offset + length]
    return sinusoids(offset + length, d, cfg.sinusoid_layout)[offset:]

  def embed(module: dict, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    x = table[ids] * scale + positions(module, ids.shape[1])
    return norm(module["embedding_norm"], x, eps, kind) if cfg.embedding_norm else x

  def stack(module: dict, count: int, fn, x):
    for depth in range(count):
      name = "layers_0" if cfg.share_layer_weights else f"layers_{depth}"
      x = fn(module[name], x)
    return norm(module["final_norm"], x, eps, kind) if pre_norm else x

  def stack_bias(module: dict, length: int, bidirectional: bool) -> np.ndarray | None:
    if not cfg.relative_attention_num_buckets:
      return None
    where = np.arange(length)
    return relative_bias(module["relative_attention_bias"]["embedding"], where, where,
                         bidirectional, cfg.relative_attention_max_distance)

  src_valid, tgt_valid = inputs > 0, targets > 0
  enc_mask = (src_valid[:, None, :, None] & src_valid[:, None, None, :])
  x = embed(p["encoder"], source_table, inputs)
  enc_bias = stack_bias(p["encoder"], inputs.shape[1], bidirectional=True)
  memory = stack(p["encoder"], cfg.num_encoder_layers,
                 lambda lp, h: encoder_layer(lp, h, enc_mask, pre_norm, act, eps, dot, kind,
                                             enc_bias, scaled), x)

  t = targets.shape[1]
  start = np.full_like(targets[:, :1], cfg.decoder_start_id)  # The decoder's first token.
  decoder_in = np.concatenate([start, targets[:, :-1]], axis=1)
  causal = np.tril(np.ones((t, t), bool))[None, None]
  self_mask = tgt_valid[:, None, :, None] & tgt_valid[:, None, None, :] & causal
  cross_mask = tgt_valid[:, None, :, None] & src_valid[:, None, None, :]
  y = embed(p["decoder"], target_table, decoder_in)
  dec_bias = stack_bias(p["decoder"], t, bidirectional=False)
  y = stack(p["decoder"], cfg.num_decoder_layers,
            lambda lp, h: decoder_layer(lp, h, memory, self_mask, cross_mask, pre_norm, act, eps,
                                        dot, kind, dec_bias, scaled), y)
  if cfg.scale_tied_logits:  # T5 v1.0: the tied projection reads y * d^-0.5.
    y = y * d**-0.5
  if cfg.tie_output_projection:  # int8: the table's levels are already its own (per token).
    logits = dot(y, target_table.T)
  else:
    logits = dot(y, p["decoder"]["output_projection"]["kernel"])
  return logits + p["decoder"]["logits_bias"] if cfg.logits_bias else logits


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Corpus BLEU-4 (Papineni et al. 2002; multi-bleu.perl) on whitespace tokens, one reference
  each, no smoothing: the geometric mean of the clipped 1- to 4-gram precisions summed over the
  corpus, times the brevity penalty exp(min(0, 1 - reference length / hypothesis length)).
  sacreBLEU gives the same on text its 13a tokenizer leaves as it is (lowercase words without
  punctuation) where every order has a match. Every order needs one (log 0 otherwise)."""
  matches, totals, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
  for hypothesis, reference in zip(hypotheses, references, strict=True):
    h, r = hypothesis.split(), reference.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      hyp_ngrams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      ref_ngrams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum((hyp_ngrams & ref_ngrams).values())
      totals[n - 1] += max(len(h) - n + 1, 0)
  log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
  return 100.0 * math.exp(log_precision + min(0.0, 1.0 - ref_len / hyp_len))
