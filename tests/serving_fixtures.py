"""The serving tests' text, vocabulary and workdir, shared by their modules: tests/conftest.py
registers this module as a plugin (`pytest_plugins`), so a test asks for `tokenizer` or
`workdir` by name and no test module imports fixtures from another.

A module's own fixture of the same name (test_cli's `workdir`, test_data_marian_tokenizer's
`tokenizer`) takes precedence there. Both fixtures are module-scoped: each module that asks
builds its own (a test may write into its workdir). They import JAX and the package when a test
asks: pytest imports this module with conftest, before conftest's `pytest_configure` sets the
process's XLA_FLAGS, and nothing here may start XLA's backend first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
  from flax_transformer import Translator
  from flax_transformer.data.tokenizer import Tokenizer

WORDS = [
    "a", "man", "is", "riding", "a", "red", "bike", "down", "the", "street", "while", "two",
    "dogs", "run", "after", "him", "in", "the", "park", "near", "a", "small", "lake", "with",
    "blue", "water"]


# Sentences of at most this many words fit the shortest bucket (8 pieces with EOS, in the tests'
# 60-piece vocabulary): one search program per method, where a test needs no more. Each search
# shape is a compile of 1-3 s, and most of the suite's time.
ONE_BUCKET_WORDS = 6


def sentences(count: int, seed: int = 0, max_words: int = 29) -> list[str]:
  """`count` random sentences of 1 to `max_words` words of WORDS (ONE_BUCKET_WORDS: all in one
  bucket)."""
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(1, max_words + 1))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
  """A 60-piece unigram vocabulary of 300 `sentences` and WORDS."""
  from flax_transformer.data.tokenizer import train_tokenizer

  return train_tokenizer(sentences(300) + WORDS, vocab_size=60, model_type="unigram")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tokenizer) -> Path:
  """A serving workdir: the tiny model with random params at step 1, its vocabulary, and a
  config.json whose search group sets beam 3 and short outputs."""
  return serving_workdir(tmp_path_factory.mktemp("bulk") / "workdir", tokenizer)


def serving_workdir(root: Path, tokenizer: Tokenizer, max_len: int = 64) -> Path:
  """`workdir`'s workdir in `root` (made), for sources and outputs of up to `max_len` tokens."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import orbax.checkpoint as ocp

  from flax_transformer import ModelConfig, Transformer
  from flax_transformer import workdir as workdir_lib

  root.mkdir()
  config = {
      "model": {"preset": "tiny", "max_len": max_len, "dropout_rate": 0.0,
                "attention_dropout_rate": 0.0},
      "data": {}, "train": {}, "checkpoint": {}, "eval": {},
      "search": {"beam_size": 3, "grow_cache": "no", "max_len_b": 10, "min_length": 2}}
  (root / workdir_lib.CONFIG_FILE).write_text(json.dumps(config))
  (root / workdir_lib.VOCAB_FILE).write_bytes(tokenizer.proto)
  model = Transformer(ModelConfig.tiny(tokenizer.vocab_size, max_len=max_len))
  tokens = jnp.ones((1, 4), jnp.int32)
  params = nn.meta.unbox(model.init(jax.random.key(7), tokens, tokens)["params"])
  # Scaled up, random weights give varied, input-dependent outputs (at scale 1, most lines of
  # the tests' input come out as the same few words).
  params = jax.tree.map(lambda x: 3.0 * x, params)
  manager = workdir_lib.checkpoint_manager(
      root, {workdir_lib.PARAMS_ITEM: ocp.StandardCheckpointHandler()}, async_save=False)
  manager.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(params)))
  manager.wait_until_finished()
  manager.close()
  return root


def copy_search(params, inputs, rng, length_penalty, *, settings, max_decode_len):
  """Stands in for beam search: K hypotheses, each the source itself, cut at the length cap."""
  import jax.numpy as jnp

  from flax_transformer.data.tokenizer import EOS_ID
  from flax_transformer.decoding.bridge import output_length_caps

  del params, rng, length_penalty
  beam_size = settings.beam_size
  rows, length = inputs.shape
  caps = output_length_caps(inputs, settings.max_len_a, settings.max_len_b)  # before EOS
  source = jnp.zeros((rows, max_decode_len), jnp.int32).at[:, : min(length, max_decode_len)].set(
      inputs[:, :max_decode_len])
  positions = jnp.arange(max_decode_len)[None]
  copied = jnp.where(positions < caps[:, None], source,
                     jnp.where(positions == caps[:, None], EOS_ID, 0))
  after_eos = jnp.cumsum(copied == EOS_ID, axis=1) - (copied == EOS_ID) > 0
  copied = jnp.where(after_eos, 0, copied)
  sequences = jnp.repeat(copied[:, None], beam_size, axis=1)  # [B, K, L]
  scores = -jnp.arange(beam_size, dtype=jnp.float32)[None].repeat(rows, 0)  # [B, K]
  return sequences, scores


def copy_translator(tokenizer, max_len: int = 64, **settings) -> Translator:
  """A Translator of the tiny model whose search is `copy_search`: every line's output is
  known exactly (test_serving_translator, the bulk jobs' crash tests)."""
  import jax
  import jax.numpy as jnp

  from flax_transformer import ModelConfig, Transformer, Translator
  from flax_transformer.config import TranslateConfig

  config = ModelConfig.tiny(tokenizer.vocab_size, max_len=max_len)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = Transformer(config).init(jax.random.key(0), tokens, tokens)["params"]
  return Translator(config, params, tokenizer, TranslateConfig().replace(**settings),
                    search_fn=copy_search)
