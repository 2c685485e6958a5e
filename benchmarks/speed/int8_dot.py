"""XLA:CPU's int8 matrix product, the kernel under `int8` decoding, against float32 on this CPU.

A decode step multiplies R rows (sentences x beams) by every weight of the decoder once, so the
step's int8 time is this product's throughput at small R over weights that do not stay in the
cache. The benchmark chains --weights distinct [C, F] kernels (24 x 4 MB at NLLB-600M's F 4096,
more than a 2-core VM's share of cache) and times one jitted pass over them, for:

  s8 x s8 -> s32, kernel [C, F]   our layout (`model.quantization.int8_matmul`)
  s8 x s8 -> s32, kernel [F, C]   the transposed layout (contracting the kernel's last axis)
  u8 x s8 -> s32, kernel [C, F]   the operand types of x86's VNNI instruction (vpdpbusd)
  f32 x f32, kernel [C, F]        our float32 layout, for reference
  onednn_matmul, kernel [C, F]    s8 x s8 -> s32 through oneDNN's matmul primitive (the
                                  `model.int8_kernel` FFI call `int8` decoding uses)
  onednn_gemm, kernel [C, F]      the same through oneDNN's BLAS-like dnnl_gemm_s8s8s32

The oneDNN rows need `pip install 'flax-transformer[cpu-int8]'` (left out, saying why, without).

Prints one JSON line per row count with GOP/s (2 R C F x weights / seconds, the median of
--repeats passes, the variants alternating pass by pass) and the machine it ran on.

  python benchmarks/speed/int8_dot.py [--rows 16 64] [--contracted 1024] [--features 4096]
      [--weights 24] [--repeats 10]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.model import int8_kernel

# (name, lhs dtype, rhs dtype, kernel transposed)
VARIANTS = (("s8s8_CF", jnp.int8, jnp.int8, False), ("s8s8_FC", jnp.int8, jnp.int8, True),
            ("u8s8_CF", jnp.uint8, jnp.int8, False), ("f32_CF", jnp.float32, jnp.float32, False),
            ("onednn_matmul", jnp.int8, jnp.int8, False),
            ("onednn_gemm", jnp.int8, jnp.int8, False))


def _chain(name: str, transposed: bool, accumulate: jnp.dtype):
  """jit fn(x [R, C], kernels) -> a [R, 8] slice of each product: every kernel read once."""
  dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))
  if name.startswith("onednn"):
    variant = 0 if name == "onednn_matmul" else 1
    product = lambda x, k: int8_kernel.onednn_matmul(x, k, variant=variant)
  else:
    product = lambda x, k: jax.lax.dot_general(x, k, dims, preferred_element_type=accumulate)

  @jax.jit
  def run(x, kernels):
    return [product(x, k)[:, :8] for k in kernels]
  return run


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def measure(rows: int, args: argparse.Namespace) -> dict:
  rng = np.random.default_rng(0)
  c, f = args.contracted, args.features
  base = [rng.integers(-127, 128, (c, f), dtype=np.int8) for _ in range(args.weights)]
  runs = {}
  for name, lhs_dtype, rhs_dtype, transposed in VARIANTS:
    if name.startswith("onednn") and not int8_kernel.load().available:
      continue
    kernels = [jnp.asarray(np.ascontiguousarray(w.T) if transposed else w, rhs_dtype)
               for w in base]
    x = rng.integers(0 if lhs_dtype == jnp.uint8 else -127, 128, (rows, c))
    x = jnp.asarray(x, lhs_dtype)
    accumulate = jnp.float32 if lhs_dtype == jnp.float32 else jnp.int32
    run = _chain(name, transposed, accumulate)
    jax.block_until_ready(run(x, kernels))  # Compile and warm up.
    runs[name] = (run, x, kernels)
  times = {name: [] for name in runs}
  for _ in range(args.repeats):  # Rounds alternate the variants: a noisy moment hits all.
    for name, (run, x, kernels) in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run(x, kernels))
      times[name].append(time.perf_counter() - start)
  gops = {name: round(2 * rows * c * f * args.weights / statistics.median(t) / 1e9, 1)
          for name, t in times.items()}
  return {"benchmark": "int8_dot", "rows": rows, "contracted": c, "features": f,
          "weights": args.weights, "weight_mb": round(c * f * args.weights / 2**20, 1),
          "gop_per_s": gops, "onednn": int8_kernel.load().onednn_version,
          "onednn_unavailable": int8_kernel.load().reason or None, "cpu": _cpu_name(),
          "cpu_count": os.cpu_count(),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__,
          "load_average_1min": round(os.getloadavg()[0], 2),
          "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
  parser.add_argument("--contracted", type=int, default=1024)
  parser.add_argument("--features", type=int, default=4096)
  parser.add_argument("--weights", type=int, default=24)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()
  for rows in args.rows:
    print(json.dumps(measure(rows, args)), flush=True)


if __name__ == "__main__":
  main()
