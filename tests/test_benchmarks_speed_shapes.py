"""benchmarks/speed/nllb_shape.py's shapes: the T5 checkpoints' configs as import-hf makes them
(MADLAD-400-3B's parameter count, counted here from its config.json's fields), and the random
weights drawn into files and read back memory-mapped as the model's tree, which CTranslate2's
spec (our exporter) takes."""

from __future__ import annotations

import importlib.util
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO

SPEED = REPO / "benchmarks" / "speed"


@pytest.fixture(scope="module")
def shapes():
  """The script as a module (its imports are its folder's siblings)."""
  sys.path.insert(0, str(SPEED))
  try:
    spec = importlib.util.spec_from_file_location("nllb_shape", SPEED / "nllb_shape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(SPEED))
  return module


def test_madlad_and_t5_base_shapes(shapes):
  from flax_transformer import Transformer

  madlad = shapes.shape_config("madlad-3b")
  assert (madlad.vocab_size, madlad.emb_dim, madlad.num_heads, madlad.attention_head_dim,
          madlad.mlp_dim, madlad.num_encoder_layers, madlad.num_decoder_layers) == (
              256000, 1024, 16, 128, 8192, 32, 32)
  assert madlad.activation == "gated-gelu" and not madlad.tie_output_projection
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  two = madlad.replace(num_encoder_layers=2, num_decoder_layers=2)  # 32+32: slow to trace.
  params = nn.unbox(jax.eval_shape(Transformer(two).init, jax.random.key(0), tokens,
                                   tokens)["params"])
  d, inner, f, v, buckets, heads = 1024, 16 * 128, 8192, 256000, 32, 16
  attention, ffn = 4 * d * inner + d, 3 * d * f + d  # Q, K, V, O and one RMS scale; wi_0/1, wo.
  tables = 2 * v * d + 2 * (buckets * heads + d)  # Embedding, head, position tables, final norms.
  assert sum(leaf.size for leaf in jax.tree.leaves(params)) == (
      tables + 2 * (attention + ffn) + 2 * (2 * attention + ffn))
  # The count docs/performance.md gives for 32+32 layers:
  assert tables + 32 * (attention + ffn) + 32 * (2 * attention + ffn) == 2_940_374_016
  base = shapes.shape_config("t5-base")
  assert (base.emb_dim, base.num_heads, base.mlp_dim, base.vocab_size, base.activation,
          base.tie_output_projection, base.scale_tied_logits) == (
              768, 12, 3072, 32128, "relu", True, True)


def test_random_params_read_back_as_the_tree_ctranslate2_takes(shapes, tmp_path):
  from flax_transformer import Transformer

  config = shapes.shape_config("madlad-3b", small=True)
  count = shapes.write_random_params(config, str(tmp_path))
  params = shapes.read_params(str(tmp_path))
  tokens = jnp.ones((1, 4), jnp.int32)
  want = nn.unbox(jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens,
                                 tokens)["params"])
  assert jax.tree.structure(params) == jax.tree.structure(want)
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, want)
  assert count == sum(leaf.size for leaf in jax.tree.leaves(want))
  assert (params["encoder"]["final_norm"]["scale"] == 1).all()
  kernel = params["decoder"]["output_projection"]["kernel"]  # [D, V], N(0, 1/D)
  assert abs(float(kernel.std()) - config.emb_dim**-0.5) < 0.01
  params["encoder"]["final_norm"]["scale"][0] = 5.0  # Copy-on-write: the file stays as drawn.
  assert shapes.read_params(str(tmp_path))["encoder"]["final_norm"]["scale"][0] == 1.0
  spec = shapes.ctranslate2_spec(config, params, shapes.vocabulary(config.vocab_size))
  spec.validate()
