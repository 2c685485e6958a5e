"""`../shared/bench/side_by_side.py` with a `big` preset and a compute dtype for both sides.

The harness and the Flax example stay unchanged: this file adds the paper's big model to the
harness's presets (V 32000, D 1024, 6+6 layers, 16 heads, F 4096; train batch 64 x 64, the decode
workload the other presets share) and, with `--dtype bfloat16`, sets the example's own
`TransformerConfig.dtype` (what its `config.use_bfloat16` does) and ours (`ModelConfig.dtype`,
through `SIDE_BY_SIDE_DTYPE`, read by `side_by_side_adapter.py`). Parameters stay float32 on
both sides. Every other argument goes to the harness as it is:

  python benchmarks/speed/side_by_side_dtype.py --dtype bfloat16 --flax-wmt-dir DIR \\
      --configs small,base,big --phases train,beam4 --rounds 5 --calls 2
"""

from __future__ import annotations

import argparse
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared",
                     "bench")
BIG = dict(vocab_size=32000, emb_dim=1024, num_layers=6, num_heads=16, qkv_dim=1024,
           mlp_dim=4096, train_batch=64, train_src_len=64, train_tgt_len=64)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--bench-dir", default=BENCH, help="the folder of side_by_side.py")
  args, rest = parser.parse_known_args()
  os.environ["SIDE_BY_SIDE_DTYPE"] = args.dtype  # Our side (side_by_side_adapter.DTYPE).
  sys.path.insert(0, os.path.abspath(args.bench_dir))
  import anchor_flax_wmt as h
  import jax.numpy as jnp
  import side_by_side

  h.PRESETS.setdefault("big", BIG)
  anchor_config = h.anchor_config

  def anchor_config_in_dtype(models, preset, **overrides):
    return anchor_config(models, preset, **{"dtype": jnp.dtype(args.dtype), **overrides})

  h.anchor_config = anchor_config_in_dtype  # The anchor's benches look it up at call time.
  sys.argv = [sys.argv[0], *rest]
  side_by_side.main()


if __name__ == "__main__":
  main()
