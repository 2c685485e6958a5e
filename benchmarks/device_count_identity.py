"""Why batches are planned per device: 1 device vs 8 (fake) devices, with the plan the bulk job
uses and with the plan it replaced (each batch's rows split over the devices).

Random weights (scaled by 3, so that outputs vary with the input), a small model (D 256, 3+3
layers), beam 3, 120 sentences; prints how many translations differ from the one-device run.
XLA's CPU matmuls may round differently for another number of rows, and beam search turns a
last-bit difference into another hypothesis at a near-tie.

  python benchmarks/device_count_identity.py [--preset small|tiny] [--lines 120]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # Before JAX starts.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flax_transformer import ModelConfig, Transformer, TranslateConfig  # noqa: E402
from flax_transformer.data.tokenizer import train_tokenizer  # noqa: E402
from flax_transformer.runtime import sharding as sharding_lib  # noqa: E402
from flax_transformer.serving import translator as translate_lib  # noqa: E402
from flax_transformer.serving.batching import Batch, Step  # noqa: E402

WORDS = ["a", "man", "is", "riding", "a", "red", "bike", "down", "the", "street", "while",
         "two", "dogs", "run", "after", "him", "in", "the", "park", "near", "a", "small", "lake",
         "with", "blue", "water"]


def sentences(count: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(1, 30))) for _ in range(count)]


def split_batches(batches: list[Batch], devices: int) -> list[Step]:
  """The replaced plan: each batch alone in a step, its rows split over the devices."""
  steps = []
  for batch in batches:
    per_device = -(-batch.rows // devices)
    parts = [batch.indices[d * per_device:(d + 1) * per_device] for d in range(devices)]
    steps.append(Step(tuple(Batch(p, per_device, batch.length) if len(p) else None
                            for p in parts), per_device, batch.length))
  return steps


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--preset", default="small", choices=("tiny", "small"))
  parser.add_argument("--lines", type=int, default=120)
  args = parser.parse_args()
  tokenizer = train_tokenizer(sentences(300, 0) + WORDS, vocab_size=60, model_type="unigram")
  config = getattr(ModelConfig, args.preset)(tokenizer.vocab_size, max_len=64,
                                             dropout_rate=0.0, attention_dropout_rate=0.0)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = nn.meta.unbox(Transformer(config).init(jax.random.key(7), tokens, tokens)["params"])
  params = jax.tree.map(lambda x: 3.0 * x, params)
  settings = TranslateConfig().replace(beam_size=3, grow_cache="no", max_len_b=20, min_length=2,
                                       batch_tokens=256)
  lines = sentences(args.lines, 4)

  def translate(mesh):
    placed = params if mesh is None else jax.device_put(
        params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return translate_lib.Translator(config, placed, tokenizer, settings, mesh=mesh).translate(
        lines)

  one = translate(None)
  mesh = sharding_lib.local_mesh()
  planned = translate(mesh)
  translate_lib.group_steps = split_batches
  split = translate(mesh)
  differing = lambda other: sum(a != b for a, b in zip(one, other, strict=True))
  print(f"{args.preset}, {args.lines} sentences, beam 3; lines that differ from one device:")
  print(f"  8 devices, device batches (the bulk plan): {differing(planned)}")
  print(f"  8 devices, each batch split over them:     {differing(split)}")


if __name__ == "__main__":
  main()
