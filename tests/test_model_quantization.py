"""Serving precisions (`model/quantization.py`): the int8 scheme against an integer NumPy
reference, the converted parameters, and the model at each precision against float32 and
against itself (cached decoding = the full forward pass)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_cases import (
  FEW_BUCKETS,
  MARIAN_OPTIONS,
  NLLB_OPTIONS,
  T5_V10_OPTIONS,
  WIDE_HEADS,
  assert_cached_decoding_matches_the_full_forward_pass,
  init,
  make_batch,
  make_config,
  relative_error,
)

from flax_transformer import ModelConfig, Transformer
from flax_transformer.model.config import T5_OPTIONS
from flax_transformer.model.precision import convert_params, precision_config
from flax_transformer.model.quantization import Int8DenseGeneral, int8_matmul, quantize

import numpy_reference


def _numpy_quantize(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
  """The scheme from its definition, in float64: scale = max|x| / 127 over `axes`."""
  x = np.asarray(x, np.float64)
  scale = np.abs(x).max(axis=axes, keepdims=True) / 127.0
  scale[scale == 0] = 1.0
  q = np.clip(np.rint(x / scale), -127, 127).astype(np.int64)
  return q, np.squeeze(scale, axes)


def test_quantize_is_per_slice_symmetric_and_within_half_a_step():
  rng = np.random.default_rng(0)
  w = rng.standard_normal((48, 5, 7)).astype(np.float32) * rng.uniform(0.1, 3, (1, 5, 7))
  w[:, 2, 3] = 0.0  # An all-zero channel keeps scale 1 and quantizes to zeros.
  q, scale = quantize(jnp.asarray(w), axes=(0,))
  assert q.dtype == jnp.int8 and q.shape == w.shape and scale.shape == (5, 7)
  q_ref, scale_ref = _numpy_quantize(w, (0,))
  np.testing.assert_allclose(np.asarray(scale), scale_ref, rtol=1e-6)
  assert np.abs(np.asarray(q, np.int64) - q_ref).max() <= 1  # Ties may round either way.
  assert (np.abs(np.asarray(q)).max(axis=0)[scale_ref != 1.0] == 127).all()
  assert np.asarray(scale)[2, 3] == 1.0 and not np.asarray(q)[:, 2, 3].any()
  error = np.abs(np.asarray(q, np.float64) * np.asarray(scale, np.float64) - w)
  assert (error <= np.asarray(scale, np.float64) / 2 * (1 + 1e-5)).all()


def test_int8_matmul_is_the_integer_product_exactly_and_its_rounding_bound():
  rng = np.random.default_rng(1)
  x = (rng.standard_normal((64, 96)) * rng.uniform(0.1, 10, (64, 1))).astype(np.float32)
  w = rng.standard_normal((96, 40)).astype(np.float32)
  w_q, w_scale = quantize(jnp.asarray(w), axes=(0,))
  y = np.asarray(int8_matmul(jnp.asarray(x), w_q, w_scale), np.float64)
  # The same scheme in integers: activations per row, int64 products summed exactly.
  x_q, x_scale = _numpy_quantize(x, (1,))
  w_q64 = np.asarray(w_q, np.int64)
  integer = x_q @ w_q64  # [R, F], exact.
  y_ref = integer * x_scale[:, None] * np.asarray(w_scale, np.float64)[None, :]
  np.testing.assert_allclose(y, y_ref, rtol=2e-6, atol=0)  # Only float32 rounding of scales.
  # The int32 accumulation itself, without the float scaling: equal to the integer reference.
  accumulated = jax.lax.dot_general(jnp.asarray(x_q, jnp.int8), w_q, (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.int32)
  np.testing.assert_array_equal(np.asarray(accumulated, np.int64), integer)
  # Against the float64 product: |x.w - y| <= sum_c |x_c| dw + |w_c| dx + dx dw, with the
  # half steps dx = s_x / 2 (per row) and dw = s_w / 2 (per column).
  exact = x.astype(np.float64) @ w.astype(np.float64)
  dx, dw = x_scale[:, None] / 2, np.asarray(w_scale, np.float64)[None, :] / 2
  bound = (np.abs(x).sum(1, keepdims=True) * dw + dx * np.abs(w).sum(0, keepdims=True)
           + 96 * dx * dw)
  assert (np.abs(y - exact) <= bound * (1 + 1e-5)).all()
  relative = np.abs(y - exact).max() / np.abs(exact).max()
  assert 1e-4 < relative < 0.02  # Quantized (not a float product), yet close.


@pytest.mark.parametrize(("features", "axis", "use_bias"), [
    ((4, 6), -1, False),  # Attention's Q, K, V: [D] -> [N, H].
    (24, (-2, -1), True),  # Attention's output: [N, H] -> [D].
    (10, -1, True),  # The FFN and the output projection.
])
def test_int8_dense_general_equals_the_float_layer_within_the_bound(features, axis, use_bias):
  rng = np.random.default_rng(2)
  shape = (3, 5, 4, 6) if axis == (-2, -1) else (3, 5, 24)
  x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  dense = nn.DenseGeneral(features, axis=axis, use_bias=use_bias,
                          bias_init=nn.initializers.normal(1.0))
  params = dense.init(jax.random.key(0), x)["params"]
  int8 = Int8DenseGeneral(features, axis=axis, use_bias=use_bias)
  contracted = 2 if axis == (-2, -1) else 1
  kernel, scale = quantize(params["kernel"], axes=tuple(range(contracted)))
  quantized = {**params, "kernel": kernel, "kernel_scale": scale}
  shapes = jax.eval_shape(int8.init, jax.random.key(0), x)["params"]
  assert jax.tree.map(lambda a: (a.shape, a.dtype), nn.meta.unbox(shapes)) == jax.tree.map(
      lambda a: (a.shape, a.dtype), quantized)
  y = np.asarray(int8.apply({"params": quantized}, x))
  y_float = np.asarray(dense.apply({"params": params}, x))
  assert y.shape == y_float.shape
  assert 1e-4 < np.abs(y - y_float).max() < 0.03 * np.abs(y_float).max()


# ------------------------------------------------------------------------------ the whole model
def _trained(overrides: dict) -> tuple[ModelConfig, dict]:
  config = make_config(dropout_rate=0.0, attention_dropout_rate=0.0, **overrides)
  return config, init(config, *make_batch())


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("leading_axes", [0, 1])
def test_int8_params_quantize_every_projection_and_embedding_and_nothing_else(leading_axes):
  config, variables = _trained(dict(tie_output_projection=False, share_embeddings=False,
                                    **MARIAN_OPTIONS))
  params = variables["params"]
  if leading_axes:  # An ensemble's stacked models.
    params = jax.tree.map(lambda *leaves: jnp.stack(leaves), params, params)
  int8 = precision_config(config, "int8")
  converted = convert_params(params, int8, leading_axes=leading_axes)
  shapes = nn.meta.unbox(jax.eval_shape(Transformer(int8).init, jax.random.key(0),
                                        *make_batch()))["params"]
  lead = lambda shape: (2,) * leading_axes + shape
  assert jax.tree.map(lambda a: (lead(a.shape), a.dtype), shapes) == jax.tree.map(
      lambda a: (a.shape, a.dtype), converted)
  flat = {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(converted)}
  int8_leaves = sorted(path for path, leaf in flat.items() if leaf.dtype == jnp.int8)
  # 2 encoder layers x 6 kernels + 3 decoder layers x 10 + the output projection + 2 tables.
  assert len(int8_leaves) == 2 * 6 + 3 * 10 + 1 + 2
  assert all(path.endswith(("['kernel']", "['embedding_kernel']")) for path in int8_leaves)
  # A kernel dequantizes to the trained one within half a step of its channel's scale.
  path = "['decoder']['layers_0']['cross_attention']['output']"  # [N, H, D]: 2 axes contracted.
  trained = np.asarray(_leaf(params, path + "['kernel']"), np.float64)
  scale = np.asarray(flat[path + "['kernel_scale']"], np.float64)
  np.testing.assert_allclose(scale, np.abs(trained).max(axis=tuple(
      range(leading_axes, leading_axes + 2))) / 127, rtol=1e-6)
  restored = np.asarray(flat[path + "['kernel']"], np.float64) * scale[..., None, None, :]
  assert (np.abs(restored - trained) <= scale[..., None, None, :] / 2 * (1 + 1e-5)).all()
  again = convert_params(converted, int8, leading_axes=leading_axes)  # Converting is idempotent.
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), again, converted))


def _leaf(tree, path: str):
  for key in path.strip("[]'").split("']['"):
    tree = tree[key]
  return tree


@pytest.mark.slow  # Compile-bound: the fast tier leaves it to CI.
@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
@pytest.mark.parametrize("overrides", [dict(), dict(tie_output_projection=False,
                                                    share_embeddings=False, **MARIAN_OPTIONS)],
                         ids=["paper", "marian-untied"])
def test_cached_decoding_matches_the_full_forward_pass_at_each_precision(precision, overrides):
  config, variables = _trained(overrides)
  served = precision_config(config, precision)
  params = convert_params(variables["params"], served)
  # int8: both passes quantize the same rows the same way, so only float rounding differs
  # (measured on CPU: 5e-7). bfloat16: the two passes round in a different order; the largest
  # difference measured is one bfloat16 step at |logit| ~ 2 (0.0156).
  assert_cached_decoding_matches_the_full_forward_pass(
      served, {"params": params}, tolerance=1e-5 if precision == "int8" else 2e-2)


def _channels_of_many_scales(params: dict, seed: int) -> dict:
  """Every projection kernel's output channels (its last axis) times a log-normal factor
  (e^N(0, 1)): a trained model's channels differ in scale, which one scale per tensor would
  lose; a random init's hardly do."""
  rng = np.random.default_rng(seed)

  def widen(path, leaf):
    if jax.tree_util.keystr(path).endswith("['kernel']"):
      return leaf * rng.lognormal(0.0, 1.0, leaf.shape[-1:]).astype(np.float32)
    return leaf
  return jax.tree_util.tree_map_with_path(widen, params)


@pytest.mark.parametrize("overrides", [
    dict(), dict(tie_output_projection=False, share_embeddings=False, **MARIAN_OPTIONS),
    NLLB_OPTIONS, dict(T5_OPTIONS, **FEW_BUCKETS, **WIDE_HEADS),
    dict(T5_V10_OPTIONS, **FEW_BUCKETS)], ids=["paper", "marian-untied", "nllb", "t5-v1.1",
                                               "t5-v1.0"])
def test_int8_logits_equal_the_numpy_int8_reference(overrides):
  """The int8 model against numpy_reference's int8 scheme, computed from the float weights:
  only float32 rounding differs (measured 7e-8 to 1e-7 relative), where one weight scale per
  tensor instead of per channel differs by 6e-2 to 1e-1, and the float model by 4e-2 to 6e-2."""
  config, variables = _trained(overrides)
  params = _channels_of_many_scales(variables["params"], seed=7)
  inputs, targets = make_batch()
  served = precision_config(config, "int8")
  logits = Transformer(served).apply({"params": convert_params(params, served)}, inputs, targets)
  real = np.asarray(targets) > 0
  int8 = numpy_reference.transformer(params, config, np.asarray(inputs), np.asarray(targets),
                                     int8=True)
  assert relative_error(np.asarray(logits)[real], int8[real]) < 1e-6
  float64 = numpy_reference.transformer(params, config, np.asarray(inputs), np.asarray(targets))
  assert relative_error(float64[real], int8[real]) > 1e-2  # The scheme is not a float product.


# Measured: 0.016 (bfloat16) and 0.028 (int8), largest over every real target token.
@pytest.mark.parametrize(("precision", "bound"), [("bfloat16", 0.03), ("int8", 0.05)])
def test_teacher_forced_log_probabilities_stay_near_float32(precision, bound):
  config, variables = _trained(dict())
  inputs, targets = make_batch()
  real = np.asarray(targets) > 0
  log_probs = {}
  for name in ("float32", precision):
    served = precision_config(config, name)
    logits = Transformer(served).apply(
        {"params": convert_params(variables["params"], served)}, inputs, targets)
    log_probs[name] = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))[real]
  difference = np.abs(log_probs[precision] - log_probs["float32"]).max()
  assert 0 < difference < bound, difference
