"""Hashes of the StableHLO of the float32 train step, beam search, greedy search and the
Translator's `search_batch`, without and with constraints (tiny model, source locations
stripped): run it in two checkouts to
show that a change leaves the compiled programs, and so their speed, as they were.

  (cd OLD && PYTHONPATH=$PWD python /path/to/benchmarks/profiling/stablehlo_identity.py)
  (cd NEW && PYTHONPATH=$PWD python benchmarks/profiling/stablehlo_identity.py)

Each line: program, SHA-256 prefix of its text, its length in characters.
"""

from __future__ import annotations

import functools
import hashlib
import re

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import ModelConfig, Transformer, decoding
from flax_transformer.config import SearchConfig, TrainConfig
from flax_transformer.decoding import bridge, search
from flax_transformer.serving.translator import search_batch
from flax_transformer.training import recipe


def _without_locations(text: str) -> str:
  """The program without `loc(...)` annotations and `#loc` lines (file paths, line numbers)."""
  text = re.sub(r"loc\([^()]*(\([^()]*\)[^()]*)*\)", "", text)
  return "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))


def programs() -> dict[str, str]:
  """{name: StableHLO text} of the five programs."""
  config = ModelConfig.tiny(200)
  train = TrainConfig(schedule="warmup_rsqrt", learning_rate=1e-3, warmup_steps=10,
                      num_train_steps=100, label_smoothing=0.1, seed=0)
  built = recipe.build(config, train, rows=8, length=16, devices=jax.devices()[:1])
  batch = built.place_batch({k: np.ones((8, 16), np.int32) for k in ("inputs", "targets")})
  model = Transformer(config.replace(dropout_rate=0.0, attention_dropout_rate=0.0))
  ids = jnp.ones((4, 12), jnp.int32)  # [B, S]
  variables = model.init(jax.random.key(0), ids, ids)

  def beam(variables, inputs):
    problem = bridge.prepare_search(model, variables, inputs, max_decode_len=20, grow_cache=True)
    return decoding.beam_search(problem, beam_size=4, ranking=search.Ranking(0.6))

  def greedy(variables, inputs):
    return decoding.greedy_search(bridge.prepare_search(model, variables, inputs,
                                                      max_decode_len=20))

  # The Translator's program, as a call without a prefix or constraints runs it.
  settings = SearchConfig(beam_size=4, grow_cache="yes")
  served = jax.jit(functools.partial(search_batch, model, settings=settings, max_decode_len=20))
  return {"train_step": built.lower(built.init_state(), batch).as_text(),
          "beam_search": jax.jit(beam).lower(variables, ids).as_text(),
          "greedy_search": jax.jit(greedy).lower(variables, ids).as_text(),
          "search_batch": served.lower(variables["params"], ids, jax.random.key(0)).as_text(),
          # Two constraints of up to 3 pieces per sentence: int32 [B, C, P], 0-padded.
          "search_batch_constrained": served.lower(
              variables["params"], ids, jax.random.key(0),
              constraints=jnp.asarray(np.tile([[5, 6, 0], [7, 0, 0]], (4, 1, 1)), jnp.int32)
          ).as_text()}


def main() -> None:
  for name, text in programs().items():
    text = _without_locations(text)
    print(name, hashlib.sha256(text.encode()).hexdigest()[:16], len(text))


if __name__ == "__main__":
  main()
