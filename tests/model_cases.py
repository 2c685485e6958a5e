"""The model tests' shapes, option sets and helpers, shared by test_model, test_model_t5 and
test_model_quantization (a plain module: test modules import from it, never from each other).
Every dimension has its own size so that a transposed axis breaks a shape: B=2 batch, S=7
source, T=5 target, D=24 model, N=3 heads, H=8 head, F=40 FFN, V=29 vocab.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import ModelConfig, Transformer
from flax_transformer.model.config import T5_OPTIONS
from flax_transformer.model.transformer import DecoderCache

from random_workdir import perturbed

B, S, T, D, N, F, V = 2, 7, 5, 24, 3, 40, 29
RTOL = 1e-5  # Relative error bar for float32 against the float64 reference.
# Every option a Hugging Face Marian (OPUS-MT) checkpoint needs, at once.
MARIAN_OPTIONS = dict(attention_bias=True, activation="swish", sinusoid_layout="halves",
                      logits_bias=True, layer_norm_epsilon=1e-5)
# What import-hf makes of NLLB-200 / M2M-100 and of mBART-50 (interop/hf.py).
NLLB_OPTIONS = dict(norm_placement="pre", sinusoid_layout="fairseq", position_offset=2,
                    attention_bias=True, layer_norm_epsilon=1e-5, decoder_start_id=1)
MBART_OPTIONS = dict(norm_placement="pre", positional_encoding="learned", position_offset=2,
                     embedding_norm=True, attention_bias=True, activation="gelu",
                     logits_bias=True, layer_norm_epsilon=1e-5, decoder_start_id=1)
# T5 v1.1 (mT5, MADLAD-400), and T5 v1.0: ReLU, a tied output read at D^-0.5. With 6 buckets
# and max distance 5 the short rows here reach the logarithmic buckets and the last one (32
# buckets give one per offset up to 8 or 16); mT5-small's heads are not D / N wide.
T5_V10_OPTIONS = dict(T5_OPTIONS, activation="relu", tie_output_projection=True,
                      scale_tied_logits=True)
FEW_BUCKETS = dict(relative_attention_num_buckets=6, relative_attention_max_distance=5)
WIDE_HEADS = dict(attention_head_dim=12)  # N * H = 36 != D = 24.


def make_config(**overrides) -> ModelConfig:
  settings = dict(vocab_size=V, emb_dim=D, num_heads=N, mlp_dim=F, num_encoder_layers=2,
                  num_decoder_layers=3, max_len=16, dropout_rate=0.1,
                  attention_dropout_rate=0.1)
  settings.update(overrides)
  return ModelConfig(**settings)


def make_batch(seed: int = 0, source_lengths=(7, 4), target_lengths=(5, 3)):
  rng = np.random.default_rng(seed)
  inputs = np.zeros((B, S), np.int32)
  targets = np.zeros((B, T), np.int32)
  for row, (ls, lt) in enumerate(zip(source_lengths, target_lengths, strict=True)):
    inputs[row, :ls] = rng.integers(1, V, ls)
    targets[row, :lt] = rng.integers(1, V, lt)
  return jnp.asarray(inputs), jnp.asarray(targets)


def init(config: ModelConfig, inputs, targets, seed: int = 0):
  variables = Transformer(config).init(jax.random.key(seed), inputs, targets)
  # Random, non-trivial LayerNorm and bias values, so the reference checks they are used.
  return {"params": perturbed(nn.unbox(variables)["params"], seed + 1)}


def relative_error(actual, expected) -> float:
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def assert_cached_decoding_matches_the_full_forward_pass(config: ModelConfig, variables,
                                                         tolerance: float = 1e-5) -> None:
  """`decode_step` position by position gives the teacher-forced logits of make_batch()."""
  inputs, targets = make_batch()
  model = Transformer(config)
  full = model.apply(variables, inputs, targets)
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  cache = model.apply(variables, B, T, method=Transformer.init_cache)
  ids = jnp.full((B, 1), config.decoder_start_id, jnp.int32)  # The decoder's first token.
  step = jax.jit(lambda ids, cache: model.apply(variables, ids, cache, cross,
                                                method=Transformer.decode_step))
  real = np.asarray(targets) > 0
  for t in range(T):
    logits, cache = step(ids, cache)
    assert isinstance(cache, DecoderCache) and int(cache.index) == t + 1
    np.testing.assert_allclose(np.asarray(logits)[real[:, t]], np.asarray(full[:, t])[real[:, t]],
                               rtol=tolerance, atol=tolerance)
    ids = targets[:, t:t + 1]
