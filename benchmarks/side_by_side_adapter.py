"""Our side of `../shared/bench/side_by_side.py` (the real Flax examples/wmt beside ours).

The harness loads this file from the project checkout and uses its two classes; the contract is
in the harness's README. `OursTrain` is the training job's own jitted step; `OursDecode` runs
`bridge.prepare_search` and then `decoding.beam_search` (or `greedy_search`) as the
`Translator` does, with 63 decoder steps forced (EOS forbidden before them), alpha 0.6.

  python ../shared/bench/side_by_side.py --flax-wmt-dir /tmp/flaxwmt/examples/wmt \
      --configs small,base --phases train,beam4,greedy --rounds 5 --calls 2
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp

from flax_transformer import ModelConfig, Transformer, decoding
from flax_transformer.config import TrainConfig
from flax_transformer.decoding import bridge, search
from flax_transformer.training import recipe

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "shared", "bench"))
import anchor_flax_wmt as h

STEPS = h.DECODE_MAX_LEN - 1  # The anchor runs 63 decoder steps.
# Compute dtype of our side ("float32" or "bfloat16"); benchmarks/speed/side_by_side_dtype.py sets
# it together with the anchor's. Parameters stay float32 on both sides.
DTYPE = os.environ.get("SIDE_BY_SIDE_DTYPE", "float32")


def _model_config(preset: dict, dropout: float) -> ModelConfig:
  return ModelConfig(
      vocab_size=preset["vocab_size"], emb_dim=preset["emb_dim"],
      num_heads=preset["num_heads"], mlp_dim=preset["mlp_dim"],
      num_encoder_layers=preset["num_layers"], num_decoder_layers=preset["num_layers"],
      dropout_rate=dropout, attention_dropout_rate=dropout, max_len=256, dtype=DTYPE)


class OursTrain:
  """flax_transformer's own jitted train step, configured like the anchor."""

  def __init__(self, preset: dict, seed: int):
    self.preset, self.seed = preset, seed
    train = TrainConfig(
        schedule="warmup_rsqrt", learning_rate=0.002, warmup_steps=1000,
        num_train_steps=10**6, end_learning_rate_factor=0.0, optimizer="adamw", adam_b1=0.9,
        adam_b2=0.98, adam_eps=1e-9, weight_decay=0.0, grad_clip_norm=0.0,
        label_smoothing=0.1, fsdp=False, seed=seed)
    # The train step train.py runs (training/recipe.py), on one device.
    self.recipe = recipe.build(_model_config(preset, 0.1), train, rows=preset["train_batch"],
                               length=preset["train_src_len"], devices=jax.devices()[:1])
    self.state = self.recipe.init_state()
    self.param_count = self.recipe.parameter_count
    self._jitted = self.recipe.train_step

  def make_batch(self, i: int):
    return self.recipe.place_batch(h.make_train_batch(self.preset, self.seed, i))

  def compile(self):
    self._compiled, timings = h.aot_compile(self._jitted, self.state,
                                            self.make_batch(h.COMPILE_EXAMPLE_INDEX))
    return timings

  def run(self, batch):
    self.state, metrics = self._compiled(self.state, batch)
    return self.state, metrics


def _search(model: Transformer, variables, inputs, *, beam_size: int):
  """The best hypothesis [B, L] of each row, 63 tokens forced."""
  method = "beam" if beam_size > 1 else "greedy"
  problem = bridge.prepare_search(model, variables, inputs, max_decode_len=STEPS,
                                 min_length=STEPS, grow_cache=bridge.grows_cache("auto", method))
  if method == "greedy":
    return decoding.greedy_search(problem)
  return decoding.beam_search(problem, beam_size=beam_size, ranking=search.Ranking(0.6),
                            return_all=False)


class OursDecode:
  """prepare_search + beam_search (or greedy_search), 63 steps forced by min_length."""

  def __init__(self, preset: dict, seed: int, beam_size: int):
    self.preset, self.seed, self.beam_size = preset, seed, beam_size
    model = Transformer(_model_config(preset, 0.0))
    ones = jnp.ones((h.DECODE_BATCH, h.DECODE_SRC_LEN), jnp.int32)
    self.variables = jax.jit(model.init)(jax.random.key(seed), ones, ones)
    self._jitted = jax.jit(functools.partial(_search, model, beam_size=beam_size))

  def make_inputs(self, i: int):
    return h.make_decode_inputs(self.preset, self.seed, self.beam_size, i)

  def compile(self):
    example = h.jax_materialize(self.make_inputs(h.COMPILE_EXAMPLE_INDEX))
    self._compiled, timings = h.aot_compile(self._jitted, self.variables, example)
    return timings

  def run(self, inputs):
    return self._compiled(self.variables, inputs)[0]
