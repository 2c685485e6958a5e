"""oneDNN's packed int8 product under the engine's vmap over slots: each slot's rows in a product
of their own (`jax.ffi` vmap_method "sequential") against one product of the group's rows
("expand_dims", what `int8_kernel.packed_matmul_int32` uses), per call of one layer.

    python benchmarks/speed/int8_slots.py --shapes 256x1024 1024x4096 4096x1024 --groups 8 32

Each shape is C x F (contracted x features) and each group G slots of `--beams` rows; both ways
give the exact integer product (checked against NumPy) and the script prints the median time of
a jitted call over `--repeats` timings of 20 calls. Needs the [cpu-int8] extra and a compiler.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.model import int8_kernel


def _product(x, packed, features: int, method: str):
  out = jax.ShapeDtypeStruct((*x.shape[:-1], features), jnp.int32)
  call = jax.ffi.ffi_call(int8_kernel.PACKED_TARGET, out, vmap_method=method)
  return call(x, packed, k=np.int64(x.shape[-1]), n=np.int64(features))


def _median_us(fn, x, repeats: int) -> float:
  fn(x).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(20):
      y = fn(x)
    y.block_until_ready()
    times.append((time.perf_counter() - start) / 20)
  return float(np.median(times)) * 1e6


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shapes", nargs="+", default=["256x1024", "1024x4096", "4096x1024"])
  parser.add_argument("--groups", type=int, nargs="+", default=[8, 32])
  parser.add_argument("--beams", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()
  native = int8_kernel.load()
  if not native.available:
    raise SystemExit(f"oneDNN's int8 kernel is not available: {native.reason}")
  rng = np.random.default_rng(0)
  for shape in args.shapes:
    contracted, features = map(int, shape.split("x"))
    w = rng.integers(-127, 128, (contracted, features), dtype=np.int8)
    packed = jnp.asarray(int8_kernel.pack(w))
    for group in args.groups:
      x = rng.integers(-127, 128, (group, args.beams, contracted), dtype=np.int8)
      expected = np.einsum("gbc,cf->gbf", x.astype(np.int64), w.astype(np.int64))
      micros = {}
      for method in ("sequential", "expand_dims"):
        fn = jax.jit(jax.vmap(functools.partial(_product, packed=packed, features=features,
                                                method=method)))
        np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(x)), np.int64), expected)
        micros[method] = _median_us(fn, jnp.asarray(x), args.repeats)
      print(f"[{contracted} x {features}] G = {group} ({group * args.beams} rows): a product "
            f"per slot {micros['sequential']:.0f} us, one of the group's rows "
            f"{micros['expand_dims']:.0f} us: {micros['sequential'] / micros['expand_dims']:.2f}x")


if __name__ == "__main__":
  main()
