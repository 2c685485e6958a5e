"""The model against the paper's equations (float64 NumPy), plus causality, padding, packing and
cached decoding. Every dimension has its own size so that a transposed axis breaks a shape:
B=2 batch, S=7 source, T=5 target, D=24 model, N=3 heads, H=8 head, F=40 FFN, V=29 vocab.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_cases import (
  FEW_BUCKETS,
  MARIAN_OPTIONS,
  MBART_OPTIONS,
  NLLB_OPTIONS,
  RTOL,
  T5_V10_OPTIONS,
  WIDE_HEADS,
  B,
  D,
  F,
  N,
  S,
  T,
  V,
  assert_cached_decoding_matches_the_full_forward_pass,
  init,
  make_batch,
  make_config,
  relative_error,
)

from flax_transformer import ModelConfig, Transformer
from flax_transformer.model import attention, transformer
from flax_transformer.model.config import T5_OPTIONS
from flax_transformer.model.layers import (
  ACTIVATIONS,
  Dropout,
  keep_mask,
  sinusoid_permutation,
  sinusoidal_positions,
)

import numpy_reference as ref


# ------------------------------------------------------------------------------ pieces
@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("dim", [24, 7])
def test_sinusoidal_positions_match_the_formula(layout, dim):
  np.testing.assert_allclose(sinusoidal_positions(50, dim, layout), ref.sinusoids(50, dim, layout),
                             atol=1e-6)


def test_the_two_sinusoid_layouts_are_one_permutation_apart():
  for dim in (24, 7):
    interleaved, halves = sinusoidal_positions(9, dim), sinusoidal_positions(9, dim, "halves")
    assert not np.array_equal(interleaved, halves)
    np.testing.assert_array_equal(halves, interleaved[:, sinusoid_permutation(dim)])


@pytest.mark.parametrize("name", ["relu", "gelu", "swish"])
def test_activations_match_numpy(name):
  x = np.linspace(-6.0, 6.0, 241)
  got = ACTIVATIONS[name](jnp.asarray(x, jnp.float32))
  want = ref.activation(name, x)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  if name == "gelu":  # The exact GELU, not the tanh approximation (they differ by ~1e-3).
    approximate = nn.gelu(jnp.asarray(x, jnp.float32), approximate=True)
    assert np.abs(np.asarray(approximate) - want).max() > 1e-4


@pytest.mark.parametrize("dropout_rate", [0.0, 0.3])
def test_scaled_dot_product_attention_matches_numpy(dropout_rate):
  rng = np.random.default_rng(1)
  q = rng.normal(size=(B, T, N, 8))
  k = rng.normal(size=(B, S, N, 8))
  v = rng.normal(size=(B, S, N, 8))
  valid_q = np.array([[1] * T, [1] * 3 + [0] * (T - 3)], bool)
  valid_k = np.array([[1] * S, [1] * 4 + [0] * (S - 4)], bool)
  mask = np.asarray(attention.padding_mask(jnp.asarray(valid_q), jnp.asarray(valid_k)))
  dropout_rng = jax.random.key(3)
  got = attention.scaled_dot_product_attention(
      *(jnp.asarray(a, jnp.float32) for a in (q, k, v)), jnp.asarray(mask),
      dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  keep, rate = None, 0.0
  if dropout_rate:
    keep, keep_prob = keep_mask(dropout_rng, (B, N, T, S), 1 - dropout_rate)
    keep, rate = np.asarray(keep), 1 - keep_prob
    assert 0.4 < keep.mean() < 0.95  # Some weights are really dropped.
  want = ref.attention(q, k, v, mask, keep=keep, rate=rate)
  assert relative_error(got, want) < RTOL


@pytest.mark.parametrize("keep_prob", [0.9, 0.7])
def test_dropout_masks_keep_the_right_fraction_independently(keep_prob):
  shape = (64, 8, 32, 32)  # 524,288 draws
  first, exact = keep_mask(jax.random.key(0), shape, keep_prob)
  second, _ = keep_mask(jax.random.key(1), shape, keep_prob)
  first, second = np.asarray(first, np.float64), np.asarray(second, np.float64)
  sigma = np.sqrt(keep_prob * (1 - keep_prob) / first.size)
  assert abs(exact - keep_prob) < 1e-9
  assert abs(first.mean() - keep_prob) < 5 * sigma
  # Different keys: independent masks, so P(both kept) = p^2.
  assert abs((first * second).mean() - keep_prob**2) < 5 * sigma
  # Neighbouring elements (same row, next row) are uncorrelated.
  flat = first.reshape(-1)
  for lag in (1, 32, 1024):
    assert abs(np.corrcoef(flat[:-lag], flat[lag:])[0, 1]) < 0.01
  # Dropout keeps the expectation: E[dropout(x)] = x.
  x = jnp.ones(shape)
  dropped = Dropout(rate=1 - keep_prob).apply({}, x, deterministic=False,
                                              rngs={"dropout": jax.random.key(2)})
  assert abs(float(dropped.mean()) - 1.0) < 5 * sigma / keep_prob
  assert set(np.unique(np.asarray(dropped)).tolist()) == {0.0, np.float32(1 / exact)}


def test_masks_shapes_and_values():
  assert attention.causal_mask(3)[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
  segments = jnp.array([[1, 1, 2, 2, 0]])
  mask = attention.segment_mask(segments, segments)
  assert mask.shape == (1, 1, 5, 5)
  assert bool(mask[0, 0, 0, 1]) and not bool(mask[0, 0, 1, 2]) and bool(mask[0, 0, 3, 2])


def test_multi_head_attention_matches_numpy():
  module = attention.MultiHeadAttention(num_heads=N, head_dim=D // N)
  rng = np.random.default_rng(2)
  xq, xk = rng.normal(size=(B, T, D)), rng.normal(size=(B, S, D))
  mask = jnp.asarray(rng.random((B, 1, T, S)) > 0.3)
  variables = nn.unbox(module.init(jax.random.key(0), jnp.asarray(xq, jnp.float32),
                                   jnp.asarray(xk, jnp.float32), mask))
  got = module.apply(variables, jnp.asarray(xq, jnp.float32), jnp.asarray(xk, jnp.float32), mask)
  want = ref.multi_head(ref.f64(variables["params"]), xq, xk, np.asarray(mask))
  assert got.shape == (B, T, D)
  assert relative_error(got, want) < RTOL


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_one_encoder_and_one_decoder_layer_match_numpy(norm):
  config = make_config(num_encoder_layers=1, num_decoder_layers=1, norm_placement=norm)
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  p = ref.f64(variables["params"])
  model = Transformer(config)
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  # The encoder layer alone: undo the embedding + position, then run one layer by hand.
  src_valid = np.asarray(inputs) > 0
  x = p["embedder"]["embedding"][np.asarray(inputs)] * np.sqrt(D) + ref.sinusoids(S, D)
  mask = src_valid[:, None, :, None] & src_valid[:, None, None, :]
  want = ref.encoder_layer(p["encoder"]["layers_0"], x, mask, norm == "pre")
  if norm == "pre":
    want = ref.layer_norm(p["encoder"]["final_norm"], want)
  assert relative_error(encoded, want) < RTOL
  logits = model.apply(variables, inputs, targets)
  want_logits = ref.transformer(variables["params"], config, np.asarray(inputs),
                                np.asarray(targets))
  assert relative_error(logits, want_logits) < RTOL


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("overrides", [
    dict(),
    dict(norm_placement="pre"),
    dict(share_embeddings=False, tie_output_projection=False),
    dict(share_embeddings=False, tie_output_projection=True),
    dict(positional_encoding="learned"),
    dict(share_layer_weights=True),
    dict(attention_bias=True),
    dict(activation="gelu"),
    dict(activation="swish"),
    dict(sinusoid_layout="halves"),
    dict(scale_embeddings=False),
    dict(logits_bias=True),
    dict(logits_bias=True, tie_output_projection=False),
    MARIAN_OPTIONS,
    dict(MARIAN_OPTIONS, norm_placement="pre", share_embeddings=False),
    NLLB_OPTIONS,
    MBART_OPTIONS,
    dict(norm_type="rms"),
    dict(positional_encoding="none"),
    dict(FEW_BUCKETS, share_layer_weights=True),
    dict(attention_scale=False),
    dict(activation="gated-relu", mlp_bias=False),
    dict(scale_tied_logits=True),
    WIDE_HEADS,
    T5_OPTIONS,
    dict(T5_OPTIONS, **FEW_BUCKETS, **WIDE_HEADS),
    dict(T5_V10_OPTIONS, **FEW_BUCKETS),
], ids=["paper", "pre-norm", "untied", "separate-tied", "learned-positions", "shared-layers",
        "attention-bias", "gelu", "swish", "halves", "unscaled", "logits-bias",
        "logits-bias-untied", "marian", "marian-pre-norm-separate", "nllb", "mbart", "rms-norm",
        "no-positions", "few-buckets-shared-layers", "unscaled-attention", "gated-relu-no-bias",
        "scaled-tied-logits", "wide-heads", "t5-v1.1", "t5-v1.1-few-buckets-wide",
        "t5-v1.0-few-buckets"])
def test_full_model_matches_numpy(overrides):
  config = make_config(**overrides)
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  logits = Transformer(config).apply(variables, inputs, targets)
  assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
  want = ref.transformer(variables["params"], config, np.asarray(inputs), np.asarray(targets))
  assert relative_error(logits, want) < RTOL


# ------------------------------------------------------------------------------ properties
def test_changing_a_target_token_leaves_earlier_logits_unchanged():
  config = make_config()
  inputs, targets = make_batch(source_lengths=(7, 7), target_lengths=(5, 5))
  variables = init(config, inputs, targets)
  model = Transformer(config)
  base = model.apply(variables, inputs, targets)
  for j in range(T):
    changed = targets.at[:, j].set((targets[:, j] % (V - 1)) + 1)
    logits = model.apply(variables, inputs, changed)
    np.testing.assert_array_equal(logits[:, : j + 1], base[:, : j + 1])
    if j + 1 < T:  # Later positions do see the change.
      assert np.abs(logits[:, j + 1:] - base[:, j + 1:]).max() > 1e-4


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_gradient_of_logits_wrt_future_decoder_inputs_is_zero():
  config = make_config(norm_placement="pre")
  inputs, targets = make_batch(source_lengths=(7, 7), target_lengths=(5, 5))
  variables = init(config, inputs, targets)
  model = Transformer(config)

  def logits_with_offset(offset, t):
    # Adds `offset` [B, T, D] to the decoder's input (embedding + position) sum.
    def interceptor(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      is_decoder_positions = (context.method_name == "__call__"
                              and context.module.name == "positional_encoding"
                              and context.module.parent.name == "decoder")
      return out + offset if is_decoder_positions else out
    with nn.intercept_methods(interceptor):
      return model.apply(variables, inputs, targets)[:, t].sum()

  offset = jnp.zeros((B, T, D))
  for t in range(T):
    grad = jax.grad(logits_with_offset)(offset, t)  # [B, T, D]
    assert np.abs(grad[:, t + 1:]).max(initial=0.0) == 0.0
    assert np.abs(grad[:, : t + 1]).max() > 0.0


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_appending_padding_changes_no_real_logit():
  config = make_config()
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  model = Transformer(config)
  base = model.apply(variables, inputs, targets)
  padded = model.apply(variables, jnp.pad(inputs, ((0, 0), (0, 4))),
                       jnp.pad(targets, ((0, 0), (0, 3))))
  real = np.asarray(targets) > 0
  np.testing.assert_allclose(np.asarray(padded)[:, :T][real], np.asarray(base)[real],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_packed_rows_equal_examples_run_separately():
  config = make_config(norm_placement="pre")
  inputs, targets = make_batch(source_lengths=(4, 3), target_lengths=(3, 2))
  variables = init(config, inputs, targets)
  model = Transformer(config)
  separate = model.apply(variables, inputs, targets)
  # One row: example 0 then example 1, then padding.
  packed_inputs = jnp.concatenate([inputs[0, :4], inputs[1, :3], jnp.zeros(2, jnp.int32)])[None]
  packed_targets = jnp.concatenate([targets[0, :3], targets[1, :2], jnp.zeros(1, jnp.int32)])[None]
  logits = model.apply(
      variables, packed_inputs, packed_targets,
      inputs_segment_ids=jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]]),
      targets_segment_ids=jnp.array([[1, 1, 1, 2, 2, 0]]),
      inputs_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]]),
      targets_positions=jnp.array([[0, 1, 2, 0, 1, 0]]))
  np.testing.assert_allclose(logits[0, :3], separate[0, :3], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits[0, 3:5], separate[1, :2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [dict(), dict(norm_placement="pre"),
                                       dict(share_layer_weights=True, tie_output_projection=False,
                                            share_embeddings=False),
                                       dict(MARIAN_OPTIONS, scale_embeddings=False),
                                       MBART_OPTIONS, T5_OPTIONS,
                                       dict(T5_V10_OPTIONS, **FEW_BUCKETS, **WIDE_HEADS)],
                         ids=["post-norm", "pre-norm", "shared-layers-untied", "marian",
                              "mbart", "t5-v1.1", "t5-v1.0-few-buckets-wide"])
def test_cached_decoding_matches_the_full_forward_pass(overrides):
  config = make_config(**overrides)
  inputs, targets = make_batch()
  assert_cached_decoding_matches_the_full_forward_pass(config, init(config, inputs, targets))


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_beams_share_cross_attention_without_copies():
  """K=3 beam rows per sentence against one cross-attention cache of B rows."""
  config = make_config()
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  model = Transformer(config)
  full = model.apply(variables, inputs, targets)
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  beams = 3
  cache = model.apply(variables, B * beams, T, method=Transformer.init_cache)
  rows_targets = jnp.repeat(targets, beams, axis=0)  # row r is sentence r // K
  ids = jnp.zeros((B * beams, 1), jnp.int32)
  for t in range(3):
    logits, cache = model.apply(variables, ids, cache, cross, method=Transformer.decode_step)
    np.testing.assert_allclose(logits, jnp.repeat(full[:, t], beams, axis=0), rtol=1e-5,
                               atol=1e-5)
    ids = rows_targets[:, t:t + 1]


@pytest.mark.parametrize("overrides", [dict(), dict(T5_OPTIONS, **FEW_BUCKETS)],
                         ids=["paper", "t5-few-buckets"])
def test_slot_cache_follows_reordered_beams_like_copied_rows(overrides):
  """Beam search's cache moves only its slot table (`reorder_cache`); the reference copies every
  beam's own cache row from its parent's. Same ids and random parents at every step: same
  logits, including positions written before a reorder and read after several (with T5's
  relative-position bias: each entry's bias follows its position, whatever slot holds it)."""
  config = make_config(**overrides)
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  model = Transformer(config)
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  beams = 3
  step = jax.jit(lambda ids, cache: model.apply(variables, ids, cache, cross,
                                                method=Transformer.decode_step))
  slot_cache = transformer.expand_cache(
      model.apply(variables, B, T, method=Transformer.init_cache), beams)
  row_cache = model.apply(variables, B * beams, T, method=Transformer.init_cache)
  assert slot_cache.slots.shape == (B, beams, T) and row_cache.slots.shape == (B * beams, 1, T)
  rng = np.random.default_rng(0)
  ids = jnp.zeros((B * beams, 1), jnp.int32)
  for _ in range(T):
    slot_logits, slot_cache = step(ids, slot_cache)
    row_logits, row_cache = step(ids, row_cache)
    np.testing.assert_allclose(slot_logits, row_logits, rtol=1e-5, atol=1e-5)
    parent = rng.integers(0, beams, (B, beams))
    rows = jnp.asarray((np.arange(B)[:, None] * beams + parent).reshape(-1))
    slot_cache = transformer.reorder_cache(slot_cache, jnp.asarray(parent, jnp.int32))
    row_cache = jax.tree.map(lambda x, rows=rows: x if x.ndim == 0 else x[rows], row_cache)
    ids = jnp.asarray(rng.integers(3, config.vocab_size, (B * beams, 1)), jnp.int32)
  with pytest.raises(ValueError, match="the cache already has 3 slots per sentence"):
    transformer.expand_cache(slot_cache, beams)
  with pytest.raises(ValueError, match=rf"{B} rows of ids for a cache of {B} sentences x 3"):
    step(jnp.zeros((B, 1), jnp.int32), slot_cache)


# ------------------------------------------------------------------------------ sizes, dtypes
def count_parameters(config: ModelConfig) -> int:
  tokens = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), tokens, tokens))
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes))


def test_parameter_counts_match_the_paper():
  assert 61e6 <= count_parameters(ModelConfig.base(37000)) <= 66e6  # paper: 65M
  assert 208e6 <= count_parameters(ModelConfig.big(37000)) <= 218e6  # paper: 213M


@pytest.mark.parametrize("gain", [1.0, 2**-0.5])
def test_attention_kernels_start_xavier_uniform_over_model_and_all_heads(gain):
  """`qkv_init_gain` reaches every attention layer: Q, K, V kernels [D, N, H] are drawn from
  U(-a, a) with a = gain * sqrt(6 / (D + N*H)), the output's [N, H, D] with gain 1: fairseq's
  initialization at gain 1/sqrt(2) (D 128, 4 heads: std 0.0625 and 0.088). Fans from the
  kernel's own axes (N and H for Q) would give other bounds."""
  dim, heads = 128, 4
  config = make_config(emb_dim=dim, num_heads=heads, num_encoder_layers=1,
                       num_decoder_layers=1, qkv_init_gain=gain)
  params = nn.unbox(Transformer(config).init(jax.random.key(3), *make_batch()))["params"]
  kernels = {jax.tree_util.keystr(path): np.asarray(leaf, np.float64) for path, leaf in
             jax.tree_util.tree_leaves_with_path(params)
             if "attention" in jax.tree_util.keystr(path) and path[-1].key == "kernel"}
  assert len(kernels) == 3 * 4  # Encoder self, decoder self and cross: Q, K, V, output.
  bound = np.sqrt(6.0 / (dim + dim))
  for name, kernel in kernels.items():  # 16,384 draws each
    limit = bound if "'output'" in name else gain * bound
    assert np.abs(kernel).max() <= limit * (1 + 1e-6), name
    assert np.abs(kernel).max() >= 0.99 * limit, name  # Reaches its bound: not a narrower law.
    assert kernel.std() == pytest.approx(limit / np.sqrt(3.0), rel=0.01), name


# Every parameter's path and shape: the layout of every checkpoint written so far. A refactor
# that renames, moves or reshapes one breaks `Translator` on existing workdirs.
ATTENTION_PARAMS = {"query/kernel": (D, N, D // N), "key/kernel": (D, N, D // N),
                    "value/kernel": (D, N, D // N), "output/kernel": (N, D // N, D)}
NORM_PARAMS = {"scale": (D,), "bias": (D,)}
FEED_FORWARD_PARAMS = {"wi/kernel": (D, F), "wi/bias": (F,), "wo/kernel": (F, D), "wo/bias": (D,)}
ENCODER_LAYER_PARAMS = {
    **{f"self_attention/{k}": v for k, v in ATTENTION_PARAMS.items()},
    **{f"self_attention_norm/{k}": v for k, v in NORM_PARAMS.items()},
    **{f"feed_forward/{k}": v for k, v in FEED_FORWARD_PARAMS.items()},
    **{f"feed_forward_norm/{k}": v for k, v in NORM_PARAMS.items()},
}
DECODER_LAYER_PARAMS = {
    **ENCODER_LAYER_PARAMS,
    **{f"cross_attention/{k}": v for k, v in ATTENTION_PARAMS.items()},
    **{f"cross_attention_norm/{k}": v for k, v in NORM_PARAMS.items()},
}


ATTENTION_BIASES = {"query/bias": (N, D // N), "key/bias": (N, D // N),
                    "value/bias": (N, D // N), "output/bias": (D,)}


def expected_parameters(encoder_layers: int, decoder_layers: int, *, pre_norm: bool,
                        separate_target_embedding: bool, untied: bool, learned: bool,
                        attention_bias: bool = False, logits_bias: bool = False):
  expected = {"embedder/embedding": (V, D)}
  for stack, layers, layer in (("encoder", encoder_layers, ENCODER_LAYER_PARAMS),
                               ("decoder", decoder_layers, DECODER_LAYER_PARAMS)):
    for i in range(layers):
      expected.update({f"{stack}/layers_{i}/{k}": v for k, v in layer.items()})
      attentions = ("self_attention", "cross_attention")[:1 if stack == "encoder" else 2]
      for name in attentions if attention_bias else ():
        expected.update({f"{stack}/layers_{i}/{name}/{k}": v for k, v in ATTENTION_BIASES.items()})
    if pre_norm:
      expected.update({f"{stack}/final_norm/{k}": v for k, v in NORM_PARAMS.items()})
    if learned:
      expected[f"{stack}/positional_encoding/position_embedding"] = (16, D)  # max_len 16
  if separate_target_embedding:
    expected["target_embedder/embedding"] = (V, D)
  if untied:
    expected["decoder/output_projection/kernel"] = (D, V)
  if logits_bias:
    expected["decoder/logits_bias"] = (V,)
  return expected


@pytest.mark.parametrize("overrides, layers, flags", [
    (dict(), (2, 3), dict()),
    (dict(norm_placement="pre"), (2, 3), dict(pre_norm=True)),
    (dict(share_embeddings=False), (2, 3), dict(separate_target_embedding=True)),
    (dict(share_embeddings=False, tie_output_projection=False), (2, 3),
     dict(separate_target_embedding=True, untied=True)),
    (dict(tie_output_projection=False), (2, 3), dict(untied=True)),
    (dict(positional_encoding="learned"), (2, 3), dict(learned=True)),
    (dict(share_layer_weights=True), (1, 1), dict()),
    (dict(norm_placement="pre", share_layer_weights=True, share_embeddings=False,
          tie_output_projection=False, positional_encoding="learned"), (1, 1),
     dict(pre_norm=True, separate_target_embedding=True, untied=True, learned=True)),
    (dict(attention_bias=True), (2, 3), dict(attention_bias=True)),
    (dict(logits_bias=True), (2, 3), dict(logits_bias=True)),
    # Activation, sinusoid layout, embedding scale and epsilon add no parameters.
    (dict(activation="swish", sinusoid_layout="halves", scale_embeddings=False,
          layer_norm_epsilon=1e-5), (2, 3), dict()),
    (dict(MARIAN_OPTIONS, share_layer_weights=True, tie_output_projection=False), (1, 1),
     dict(attention_bias=True, logits_bias=True, untied=True)),
], ids=["paper", "pre-norm", "separate-tied", "separate-untied", "shared-untied", "learned",
        "shared-layers", "everything", "attention-bias", "logits-bias", "parameter-free-options",
        "marian-shared-untied"])
def test_parameter_paths_and_shapes_are_pinned(overrides, layers, flags):
  config = make_config(**overrides)
  inputs, targets = make_batch()
  shapes = jax.eval_shape(
      lambda: nn.unbox(Transformer(config).init(jax.random.key(0), inputs, targets)))
  got = {"/".join(str(k.key) for k in path): leaf.shape
         for path, leaf in jax.tree_util.tree_leaves_with_path(shapes["params"])}
  options = dict(pre_norm=False, separate_target_embedding=False, untied=False, learned=False)
  assert got == expected_parameters(*layers, **{**options, **flags})
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(shapes)} == {jnp.dtype("float32")}


def test_every_parameter_has_logical_axis_names():
  config = make_config(share_embeddings=False, tie_output_projection=False,
                       positional_encoding="learned", attention_bias=True, logits_bias=True)
  inputs, targets = make_batch()
  variables = Transformer(config).init(jax.random.key(0), inputs, targets)
  specs = nn.get_partition_spec(variables)["params"]
  allowed = {"vocab", "embed", "heads", "kv", "mlp", None}
  leaves = jax.tree_util.tree_leaves(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  params = jax.tree_util.tree_leaves(nn.unbox(variables))
  assert len(leaves) == len(params)
  for spec, param in zip(leaves, params, strict=True):
    assert isinstance(spec, jax.sharding.PartitionSpec) and len(spec) == param.ndim
    assert set(spec) <= allowed and any(name is not None for name in spec)


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
def test_bfloat16_compute_stays_close_to_float32():
  config = make_config()
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  full = Transformer(config).apply(variables, inputs, targets)
  half = Transformer(config.replace(dtype="bfloat16")).apply(variables, inputs, targets)
  assert half.dtype == jnp.float32  # Logits come out in float32 for the loss.
  # Measured: relative error 7.7e-3 (post-norm) and 8.2e-3 (pre-norm); bfloat16 keeps 8 bits.
  error = relative_error(half, full)
  assert 1e-4 < error < 2e-2
  param_dtypes = {leaf.dtype for leaf in jax.tree_util.tree_leaves(variables)}
  assert param_dtypes == {jnp.dtype("float32")}


def test_dropout_only_in_training():
  config = make_config()
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  model = Transformer(config)
  eval_a = model.apply(variables, inputs, targets)
  eval_b = model.apply(variables, inputs, targets, train=False)
  np.testing.assert_array_equal(eval_a, eval_b)
  train_a = model.apply(variables, inputs, targets, train=True, rngs={"dropout": jax.random.key(1)})
  train_b = model.apply(variables, inputs, targets, train=True, rngs={"dropout": jax.random.key(2)})
  assert np.abs(train_a - eval_a).max() > 1e-3 and np.abs(train_a - train_b).max() > 1e-3


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize("overrides, message", [
    (dict(emb_dim=30, num_heads=4), "config.model.emb_dim (30) must be divisible by "
     "config.model.num_heads (4)"),
    (dict(mlp_dim=0), "config.model.mlp_dim must be > 0, got 0"),
    (dict(mlp_dim=64.0), "config.model.mlp_dim must be of type int, got 64.0"),
    (dict(num_decoder_layers=-1), "config.model.num_decoder_layers must be > 0, got -1"),
    (dict(dropout_rate=1.0), "config.model.dropout_rate must be in [0, 1), got 1.0"),
    (dict(attention_dropout_rate=-0.1), "config.model.attention_dropout_rate must be in [0, 1)"),
    (dict(norm_placement="middle"), "norm_placement must be one of ('post', 'pre')"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(activation="tanh"), "config.model.activation must be one of ('relu', 'gelu', 'swish',"),
    (dict(sinusoid_layout="split"),
     "sinusoid_layout must be one of ('interleaved', 'halves', 'fairseq')"),
    (dict(position_offset=-1), "config.model.position_offset must be >= 0"),
    (dict(attention_bias=1), "config.model.attention_bias must be of type bool, got 1"),
    (dict(norm_type="batch"), "config.model.norm_type must be one of ('layer', 'rms')"),
    (dict(positional_encoding="rotary"),
     "positional_encoding must be one of ('sinusoidal', 'learned', 'none')"),
    (dict(activation="geglu"), "config.model.activation must be one of ('relu', 'gelu', "
     "'swish', 'gated-gelu', 'gated-relu')"),
    (dict(relative_attention_num_buckets=-1),
     "config.model.relative_attention_num_buckets must be >= 0, got -1"),
    (dict(relative_attention_num_buckets=3),
     "config.model.relative_attention_num_buckets must be 0 (off) or >= 4, got 3"),
    (dict(relative_attention_num_buckets=32, relative_attention_max_distance=16),
     "config.model.relative_attention_max_distance (16) must be > "
     "config.model.relative_attention_num_buckets // 2 (16)"),
    (dict(relative_attention_max_distance=0),
     "config.model.relative_attention_max_distance must be > 0, got 0"),
    (dict(scale_tied_logits=True, tie_output_projection=False),
     "config.model.scale_tied_logits needs config.model.tie_output_projection"),
    (dict(emb_dim=30, num_heads=4, attention_head_dim=-8),
     "config.model.attention_head_dim must be >= 0, got -8"),
    (dict(mlp_bias="no"), "config.model.mlp_bias must be of type bool, got 'no'"),
])
def test_invalid_config_names_the_field(overrides, message):
  with pytest.raises(ValueError) as error:
    make_config(**overrides)
  assert message in str(error.value)
  assert "\n" not in str(error.value)


def _dims(config: ModelConfig) -> tuple[int, ...]:
  """D, N, F, encoder and decoder layers, max_len."""
  return (config.emb_dim, config.num_heads, config.mlp_dim, config.num_encoder_layers,
          config.num_decoder_layers, config.max_len)


def test_presets():
  assert _dims(ModelConfig.base(100)) == (512, 8, 2048, 6, 6, 256)
  big = ModelConfig.big(100)
  assert _dims(big) == (1024, 16, 4096, 6, 6, 256)
  assert (big.dropout_rate, big.attention_dropout_rate) == (0.3, 0.1)
  assert _dims(ModelConfig.small(100)) == (256, 4, 1024, 3, 3, 256)
  mini = ModelConfig.mini(100)  # Wu et al.'s Multi30k model (configs/multi30k_en_de.py:mini).
  assert _dims(mini) == (128, 4, 256, 4, 4, 256)
  assert (mini.dropout_rate, mini.attention_dropout_rate) == (0.3, 0.0)
  # tiny is configs/default.py's quick-start model.
  tiny = ModelConfig.tiny(100)
  assert _dims(tiny) == (64, 4, 256, 2, 2, 64)
  assert (tiny.dropout_rate, tiny.attention_dropout_rate, tiny.dtype) == (0.1, 0.1, "float32")
  assert ModelConfig.tiny(100, num_heads=2).num_heads == 2
  assert ModelConfig.base(100).head_dim == 64
  with pytest.raises(ValueError, match="max_decode_len"):
    Transformer(ModelConfig.tiny(100)).init_cache(1, 1000)
