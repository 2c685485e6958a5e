"""Small workdirs for the export tests: random ones with any model options (no training), built
offline in seconds. (The trained one is conftest.py's session fixture `trained_workdir`.) Also
`perturbed`, the moved biases and LayerNorm scales that these workdirs and test_model.py share.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.config import SearchConfig
from flax_transformer.data.tokenizer import train_tokenizer
from flax_transformer.model.config import ModelConfig, model_group
from flax_transformer.model.transformer import Transformer
from flax_transformer.validation import group_dict

import marian_fixture


def perturbed(params: Any, seed: int) -> Any:
  """`params` with every bias, LayerNorm scale and position_embedding table moved by 0.3 times a
  standard normal draw: one key per leaf of `params`, split from `jax.random.key(seed)`. Fresh
  params have zero biases and unit scales, which a test could not tell from missing ones."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  moved = []
  for key, (path, leaf) in zip(keys, leaves, strict=True):
    name = jax.tree_util.keystr(path)
    if "bias" in name or "scale" in name or "position_embedding" in name:
      leaf = leaf + 0.3 * jax.random.normal(key, leaf.shape)
    moved.append(leaf)
  return jax.tree_util.tree_unflatten(treedef, moved)


def random_params(config: ModelConfig, seed: int = 0) -> Any:
  """Initial params (NumPy arrays) with every LayerNorm, bias and learned table moved off its
  initial value, so that a converter must map each one."""
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(Transformer(config).init(jax.random.key(seed), ids, ids))["params"]
  return jax.tree.map(np.asarray, perturbed(params, seed + 1))


def write_random_workdir(directory: Path, seed: int = 0,
                         adjust: Callable[[Any], Any] | None = None, **overrides: Any) -> Path:
  """A workdir (config.json, vocab.model, checkpoint 0) of a random small model with
  `overrides` of its ModelConfig, its params passed through `adjust` if given; no training."""
  directory.mkdir(parents=True)
  sentences = [s for pair in marian_fixture.synthetic_pairs(300) for s in pair]
  tokenizer = train_tokenizer(sentences, vocab_size=120, model_type="unigram")
  settings = dict(vocab_size=tokenizer.vocab_size, emb_dim=24, num_heads=3, mlp_dim=40,
                  num_encoder_layers=2, num_decoder_layers=2, max_len=48)
  config = ModelConfig(**{**settings, **overrides})
  (directory / workdir_lib.VOCAB_FILE).write_bytes(tokenizer.proto)
  files.write_json(directory / workdir_lib.CONFIG_FILE, {
      "model": model_group(config), "search": group_dict(SearchConfig()),
      "data": {"source_lang": "en", "target_lang": "de"}})
  params = random_params(config, seed)
  workdir_lib.save_params(directory, 0, adjust(params) if adjust else params)
  return directory
