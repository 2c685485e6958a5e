"""Small workdirs for the export tests: a trained one (session fixture in conftest.py) and
random ones with any model options (no training), built offline in seconds.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import workdir as workdir_lib
from flax_transformer.config import ModelConfig, SearchConfig, group_dict, model_group
from flax_transformer.data.tokenizer import train_tokenizer
from flax_transformer.model.transformer import Transformer

import marian_fixture

REPO = Path(__file__).resolve().parents[1]
TRAIN_STEPS = 400
# configs/default.py shrunk to under a minute (as tests/test_cli.py does): a 1+2-layer model on
# the synthetic pair, about 22 BLEU on its test split; checkpoints at steps 200, 300 and 400.
TRAINED = {
    "model.emb_dim": 32, "model.mlp_dim": 64, "model.num_encoder_layers": 1,
    "model.num_decoder_layers": 2, "model.max_len": 48,
    "data.synthetic_num_train": 2000, "data.synthetic_num_eval": 16,
    "data.synthetic_num_test": 64, "data.vocab_size": 160, "data.max_length": 24,
    "data.batch_tokens": 1536, "data.eval_batch_size": 8, "data.eval_max_length": 24,
    "train.num_train_steps": TRAIN_STEPS, "train.warmup_steps": 40,
    "train.learning_rate": 1e-2, "train.log_every_steps": 25,
    "checkpoint.save_every_steps": 100, "checkpoint.max_to_keep": 3,
    "eval.eval_every_steps": 0, "eval.translate": False, "eval.test_at_end": False,
    "search.beam_size": 4, "search.grow_cache": "no",
}


def train_workdir(workdir: Path, tfds_dir: Path, **overrides: Any) -> Path:
  """Runs train.py with TRAINED (plus `overrides`) into `workdir`; returns it."""
  settings = {**TRAINED, "data.tfds_data_dir": str(tfds_dir), **overrides}
  command = [sys.executable, str(REPO / "train.py"),
             f"--config={REPO / 'configs' / 'default.py'}", f"--workdir={workdir}",
             *(f"--config.{k}={v}" for k, v in settings.items())]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir


def random_params(config: ModelConfig, seed: int = 0) -> Any:
  """Initial params with every LayerNorm, bias and learned table moved off its initial value,
  so that a converter must map each one."""
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(Transformer(config).init(jax.random.key(seed), ids, ids))["params"]
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  moved = []
  for key, (path, leaf) in zip(keys, leaves, strict=True):
    name = jax.tree_util.keystr(path)
    if "bias" in name or "scale" in name or "position_embedding" in name:
      leaf = leaf + 0.3 * jax.random.normal(key, leaf.shape)
    moved.append(np.asarray(leaf))
  return jax.tree_util.tree_unflatten(treedef, moved)


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
  workdir_lib.write_json(directory / workdir_lib.CONFIG_FILE, {
      "model": model_group(config), "search": group_dict(SearchConfig()),
      "data": {"source_lang": "en", "target_lang": "de"}})
  params = random_params(config, seed)
  workdir_lib.save_params(directory, 0, adjust(params) if adjust else params)
  return directory
