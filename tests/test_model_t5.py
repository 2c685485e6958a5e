"""The T5 family's model options (issue 88 item 2) beyond what test_model.py's parametrized
checks cover: the relative-position buckets against Hugging Face's own function, the bias table
once per stack, the pieces (RMS norm, gated FFN) against numpy_reference, the parameter layout
the T5 import writes into, the cache growing under a relative bias, and the `t5` preset in the
`config.model` group. Sizes as in test_model.py (B 2, S 7, T 5, D 24, N 3, F 40, V 29).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_cases import (
  FEW_BUCKETS,
  WIDE_HEADS,
  B,
  D,
  F,
  N,
  T,
  V,
  init,
  make_batch,
  make_config,
  relative_error,
)

from flax_transformer import ModelConfig, Transformer
from flax_transformer.model import transformer
from flax_transformer.model.config import (
  T5_OPTIONS,
  describe_model,
  model_config_from,
  model_group,
)
from flax_transformer.model.layers import (
  ACTIVATIONS,
  FeedForward,
  RelativePositionBias,
  layer_norm,
  relative_position_bucket,
)

import numpy_reference as ref

# (buckets, max distance): T5's, MADLAD's and mT5's (32, 128), others that move the
# logarithmic part, an odd count, and the smallest the config allows.
BUCKET_SETTINGS = [(32, 128), (32, 64), (16, 128), (64, 256), (33, 100), (4, 3), (6, 5)]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_buckets_equal_hugging_faces_and_the_numpy_reference(bidirectional):
  torch = pytest.importorskip("torch")
  t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
  relative = np.arange(-400, 401)
  for buckets, distance in BUCKET_SETTINGS:
    hf = t5.T5Attention._relative_position_bucket(
        torch.tensor(relative), bidirectional=bidirectional, num_buckets=buckets,
        max_distance=distance).numpy()
    ours = np.asarray(relative_position_bucket(
        jnp.asarray(relative), bidirectional=bidirectional, num_buckets=buckets,
        max_distance=distance))
    np.testing.assert_array_equal(ours, hf, err_msg=f"{buckets} buckets, {distance}")
    numpy = [ref.relative_bucket(int(r), bidirectional, buckets, distance) for r in relative]
    np.testing.assert_array_equal(ours, numpy, err_msg=f"{buckets} buckets, {distance}")
    # Every bucket is reached (a side's last only beyond max_distance) but the one of offset 0
    # after the query, which is the query's own, on the side before it.
    assert len(set(hf.tolist())) == (buckets // 2 * 2 - 1 if bidirectional else buckets)


def test_relative_bias_module_matches_numpy_at_positions_of_its_own():
  """Positions of packed rows (examples restarting at 0) give each example its own bias."""
  module = RelativePositionBias(6, 5, N, bidirectional=True)
  queries = jnp.array([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])
  keys = jnp.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]])
  variables = module.init(jax.random.key(0), queries, keys)
  table = np.asarray(nn.unbox(variables)["params"]["embedding"], np.float64)
  bias = np.asarray(module.apply(variables, queries, keys))
  assert bias.shape == (B, N, 5, 7) and bias.dtype == np.float32
  for row in range(B):
    want = ref.relative_bias(table, np.asarray(queries[row]), np.asarray(keys[row]), True, 5)
    np.testing.assert_allclose(bias[row], want[0], rtol=1e-6)


def test_rms_norm_and_gated_feed_forward_match_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, T, D)) * 3 + 1  # A mean away from 0: RMS is not LayerNorm here.
  config = make_config(norm_type="rms", layer_norm_epsilon=1e-3)
  norm = layer_norm(config)
  scale = {"params": {"scale": jnp.asarray(rng.normal(size=D), jnp.float32)}}
  got = norm.apply(scale, jnp.asarray(x, jnp.float32))
  want = ref.rms_norm(ref.f64(scale["params"]), x, 1e-3)
  assert relative_error(got, want) < 1e-6
  assert relative_error(got, ref.layer_norm({**ref.f64(scale["params"]), "bias": 0.0}, x,
                                            1e-3)) > 1e-2
  for activation, use_bias in (("gated-gelu", False), ("gated-relu", True)):
    ffn = FeedForward(F, activation=activation, use_bias=use_bias)
    variables = nn.unbox(ffn.init(jax.random.key(1), jnp.asarray(x, jnp.float32)))
    names = {"wi_0", "wi_1", "wo"}
    assert set(variables["params"]) == names
    assert all(("bias" in variables["params"][n]) == use_bias for n in names)
    got = ffn.apply(variables, jnp.asarray(x, jnp.float32))
    want = ref.feed_forward(ref.f64(variables["params"]), x, activation)
    assert relative_error(got, want) < 1e-6


def test_gated_gelu_is_the_tanh_approximation():
  x = np.linspace(-6.0, 6.0, 241)
  got = np.asarray(ACTIVATIONS["gated-gelu"](jnp.asarray(x, jnp.float32)))
  np.testing.assert_allclose(got, ref.activation("gated-gelu", x), rtol=1e-6, atol=1e-6)
  assert np.abs(got - ref.activation("gelu", x)).max() > 1e-4  # Not the exact (erf) GELU.


# The T5 layout the import writes into: RMS norms have a scale alone, the gated FFN wi_0, wi_1
# and wo without biases, one relative-bias table [buckets, N] per stack, an untied projection.
def _t5_expected(encoder_layers: int, decoder_layers: int, head_dim: int) -> dict:
  attention = {f"{p}/kernel": (D, N, head_dim) for p in ("query", "key", "value")}
  attention["output/kernel"] = (N, head_dim, D)
  ffn = {"wi_0/kernel": (D, F), "wi_1/kernel": (D, F), "wo/kernel": (F, D)}
  expected = {"embedder/embedding": (V, D), "decoder/output_projection/kernel": (D, V)}
  for stack, layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
    expected[f"{stack}/relative_attention_bias/embedding"] = (32, N)
    expected[f"{stack}/final_norm/scale"] = (D,)
    blocks = ("self_attention", "feed_forward") + (("cross_attention",) if stack == "decoder"
                                                     else ())
    for i in range(layers):
      for block in blocks:
        expected[f"{stack}/layers_{i}/{block}_norm/scale"] = (D,)
        if block != "feed_forward":
          expected.update({f"{stack}/layers_{i}/{block}/{k}": v for k, v in attention.items()})
      expected.update({f"{stack}/layers_{i}/feed_forward/{k}": v for k, v in ffn.items()})
  return expected


@pytest.mark.parametrize("overrides, head_dim", [(dict(), D // N), (WIDE_HEADS, 12)],
                         ids=["t5-v1.1", "wide-heads"])
def test_t5_parameter_paths_and_shapes_are_pinned(overrides, head_dim):
  config = make_config(**T5_OPTIONS, **overrides)
  shapes = jax.eval_shape(
      lambda: nn.unbox(Transformer(config).init(jax.random.key(0), *make_batch())))
  got = {"/".join(str(k.key) for k in path): leaf.shape
         for path, leaf in jax.tree_util.tree_leaves_with_path(shapes["params"])}
  assert got == _t5_expected(2, 3, head_dim)


def test_the_bias_is_computed_once_per_stack_and_reaches_every_layer():
  """One table call per stack and pass (Hugging Face's position_bias handed on); a layer whose
  self-attention took no bias, or cross-attention that took one, would change the logits."""
  config = make_config(**dict(T5_OPTIONS, **FEW_BUCKETS))
  inputs, targets = make_batch()
  variables = jax.eval_shape(Transformer(config).init, jax.random.key(0), inputs, targets)
  calls, biased = [], []

  def count(next_fun, args, kwargs, context):
    if isinstance(context.module, RelativePositionBias):
      calls.append(context.module.parent.name)
    if context.method_name == "__call__" and context.module.name in ("self_attention",
                                                                      "cross_attention"):
      biased.append((context.module.name, kwargs.get("bias") is not None))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(count):  # Traced alone: the calls are made while tracing.
    jax.eval_shape(lambda v: Transformer(config).apply(v, inputs, targets), variables)
  assert calls == ["encoder", "decoder"]
  assert biased.count(("self_attention", True)) == 2 + 3
  assert biased.count(("cross_attention", False)) == 3 and len(biased) == 2 + 3 + 3


def test_a_cache_grown_between_steps_keeps_the_relative_bias():
  """Beam search grows its cache between loop segments (`resize_cache`); the bias over the
  cache's entries follows its length."""
  config = make_config(**dict(T5_OPTIONS, **FEW_BUCKETS))
  inputs, targets = make_batch()
  variables = init(config, inputs, targets)
  model = Transformer(config)
  full = model.apply(variables, inputs, targets)
  encoded = model.apply(variables, inputs, method=Transformer.encode)
  cross = model.apply(variables, encoded, inputs, method=Transformer.precompute_cross_attention)
  step = jax.jit(lambda ids, cache: model.apply(variables, ids, cache, cross,
                                                method=Transformer.decode_step))
  cache = transformer.expand_cache(model.apply(variables, B, 2, method=Transformer.init_cache), 2)
  ids = jnp.zeros((B * 2, 1), jnp.int32)
  real = np.repeat(np.asarray(targets) > 0, 2, axis=0)
  for t in range(T):
    if t == 2:
      cache = transformer.resize_cache(cache, T)
    logits, cache = step(ids, cache)
    want = np.repeat(np.asarray(full[:, t]), 2, axis=0)
    np.testing.assert_allclose(np.asarray(logits)[real[:, t]], want[real[:, t]], rtol=1e-5,
                               atol=1e-5)
    ids = jnp.repeat(targets[:, t:t + 1], 2, axis=0)


def test_the_t5_preset_in_the_model_group():
  config = model_config_from({"preset": "t5"}, 100)
  assert config == ModelConfig.t5(100)
  assert {k: getattr(config, k) for k in T5_OPTIONS} == T5_OPTIONS
  assert (config.emb_dim, config.num_heads, config.mlp_dim, config.num_encoder_layers,
          config.num_decoder_layers) == (64, 4, 192, 2, 2)
  assert model_config_from(model_group(config, "t5"), 100) == config
  assert describe_model(config, "t5") == ("t5 preset: D 64, 4 heads, F 192, 2+2 layers, "
                                          "vocab 100, max_len 64, float32 compute")
  # T5 v1.0 on top of the preset, and mT5-small's heads: what differs is named.
  v10 = ModelConfig.t5(100, activation="relu", tie_output_projection=True,
                       scale_tied_logits=True, num_heads=6, attention_head_dim=64)
  assert describe_model(v10, "t5").endswith(
      "on top of the preset: num_heads=6, activation='relu', attention_head_dim=64, "
      "tie_output_projection=True, scale_tied_logits=True")
  assert model_config_from(model_group(v10, "t5"), 100) == v10
  assert v10.head_dim == 64 and ModelConfig.t5(100).head_dim == 16



def test_adamw_decays_the_t5_matrices_but_not_the_relative_position_tables():
  """optim.make_optimizer: weight decay on matrices only; a relative-position table [buckets, N]
  is a bias (T5's), left alone as Hugging Face's Trainer leaves it. With zero gradients Adam's
  step is 0, so an update is -lr * decay * p exactly where decay applies, 0 elsewhere."""
  from flax_transformer.config import TrainConfig
  from flax_transformer.training import optim

  rng = np.random.default_rng(0)
  shapes = {"embedder": {"embedding": (11, 4)},  # T5's paths, [V, D], [buckets, N], [D, F].
            "encoder": {"relative_attention_bias": {"embedding": (8, 2)},
                        "final_norm": {"scale": (4,)},
                        "layers_0": {"feed_forward": {"wi_0": {"kernel": (4, 6)}}}}}
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32), shapes,
                        is_leaf=lambda s: isinstance(s, tuple))
  train = TrainConfig(schedule="constant", learning_rate=0.5, warmup_steps=0, optimizer="adamw",
                      weight_decay=0.1, grad_clip_norm=0.0)
  optimizer, _ = optim.make_optimizer(train, 4)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = optimizer.update(zeros, optimizer.init(params), params)
  decayed = {"embedding": True, "relative_attention_bias": False, "scale": False, "wi_0": True}
  for (path, p), u in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(updates), strict=True):
    name = next(key.key for key in path if key.key in decayed)
    want = -0.5 * 0.1 * np.asarray(p, np.float64) if decayed[name] else np.zeros(p.shape)
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-6, atol=0, err_msg=name)
