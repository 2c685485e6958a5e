"""The search of an ensemble of M copies of one model against the model alone (issue 33).

Random parameters of the small model (V 8000), 32 sentences of 24 source tokens, beam 4, 40
output tokens forced (EOS forbidden before), `bridge.prepare_search(..., ensemble=True)` and
`decoding.beam_search` jitted; fixed and growing self-attention cache. Prints one JSON line per
(M, cache) with the median of --repeats timed calls after a compiling one, and the ratio to
M = 1. An ensemble's arithmetic is M times the model's, so the ratio should be close to M.

  python benchmarks/speed/ensemble_search.py [--models 1 2 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import decoding
from flax_transformer.decoding import bridge
from flax_transformer.model.config import ModelConfig
from flax_transformer.model.transformer import Transformer


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", type=int, nargs="+", default=[1, 2, 4])
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  config = ModelConfig.small(8000, dropout_rate=0.0, attention_dropout_rate=0.0)
  model = Transformer(config)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(3, 8000, (32, 24)), jnp.int32).at[:, -1].set(1)  # [B, S]
  params = model.init(jax.random.key(0), inputs, inputs[:, :4])["params"]

  def run(params, models: int, grow: bool):
    problem = bridge.prepare_search(model, {"params": params}, inputs, max_decode_len=40,
                                    min_length=39, grow_cache=grow, ensemble=models > 1)
    return decoding.beam_search(problem, beam_size=4)

  for grow in (False, True):
    single = None
    for models in args.models:
      stacked = params if models == 1 else jax.tree.map(
          lambda x, m=models: jnp.stack([x] * m), params)  # [M, ...]
      call = jax.jit(functools.partial(run, models=models, grow=grow))
      jax.block_until_ready(call(stacked))
      seconds = []
      for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(call(stacked))
        seconds.append(time.perf_counter() - start)
      median = statistics.median(seconds)
      single = median if models == 1 else single
      print(json.dumps({"models": models, "grow_cache": grow, "median_s": round(median, 4),
                        "x_one_model": round(median / single, 2) if single else None}),
            flush=True)


if __name__ == "__main__":
  main()
