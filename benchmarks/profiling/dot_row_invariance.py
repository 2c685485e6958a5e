"""Whether a row of a jitted matmul x [M, K] @ w [K, N] comes out with the same bits at every
row count M: the question behind the engine's group being part of a sentence's bytes
(docs/design.md, "The engine": the group is a setting, not a load).

  python benchmarks/profiling/dot_row_invariance.py [--shapes 256x1024 1024x256 ...]
      [--rows 1 2 4 8 16 32 48 64 128 256] [--dtype float32]

For each weight shape K x N (default: the `:cpu` Multi30k model's, D 256, MLP 1024, an 8k
vocabulary) and each row count M, one line: how many of the M rows differ, to the last bit, from
the same rows computed at the largest M, and from those computed at a small M (`--small`, 8:
the rows of a group of 2 at beam 4). The rows compared hold the same data in every case; only
their neighbours' count changes. XLA:CPU picks its kernel by the dot's shape, so a row's bits
follow which kernel its M lands in, not M itself: a count of 0 against one reference means that
M runs that reference's kernel.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_SHAPES = ("256x256", "256x1024", "1024x256", "256x8000")
DEFAULT_ROWS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256)


def differing_rows(k: int, n: int, rows: list[int], small: int, dtype: str, seed: int = 0
                   ) -> list[dict[str, int]]:
  """For each M in `rows`: the rows of x[:M] @ w [M, N] whose bits differ from the same rows
  at max(rows) and at `small` rows (compared over the first min(M, small) rows)."""
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.standard_normal((k, n)), dtype)  # [K, N]
  x = jnp.asarray(rng.standard_normal((max(rows), k)), dtype)  # [M_max, K]
  matmul = jax.jit(lambda x, w: x @ w)
  out = {m: np.asarray(matmul(x[:m], w)) for m in sorted({*rows, small})}  # [M, N] each
  largest, reference = out[max(rows)], out[small]
  lines = []
  for m in rows:
    shared = min(m, small)
    lines.append({
        "K": k, "N": n, "M": m,
        "differ_from_largest": int(np.sum(np.any(out[m] != largest[:m], axis=1))),
        f"differ_from_{small}_rows": int(np.sum(np.any(out[m][:shared] != reference[:shared],
                                                       axis=1)))})
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="K x N")
  parser.add_argument("--rows", nargs="+", type=int, default=list(DEFAULT_ROWS))
  parser.add_argument("--small", type=int, default=8)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  args = parser.parse_args()
  for shape in args.shapes:
    k, n = (int(side) for side in shape.lower().split("x"))
    for line in differing_rows(k, n, args.rows, args.small, args.dtype):
      print(json.dumps({**line, "dtype": args.dtype, "backend": jax.default_backend()}))


if __name__ == "__main__":
  main()
