"""Train-step throughput: target tokens/s, step time, compile time and peak memory, as JSON lines.

python benchmarks/speed/train_throughput.py                  # small and base, float32, CPU/GPU/TPU
python benchmarks/speed/train_throughput.py --sizes=big --dtype=bfloat16 --fsdp  # GPU/TPU, MFU
python benchmarks/speed/train_throughput.py --sizes=base,big --dtype=bfloat16 --rows=200 \
    --length=128 --profile=/tmp/trace --time_optimizer  # a realistic GPU batch (25.6k tokens)
python benchmarks/speed/train_throughput.py --sizes=base,big --dtype=bfloat16 --length=128 \
    --fit=128 --attention_dropout=0.0             # the largest batch that fits (see `fit`)

Workloads (the same as the Flax examples/wmt comparison in DESIGN.md): small = vocab 8000,
D 256, 3+3 layers, 4 heads, F 1024, 64 sentences x 32 tokens; base = vocab 32000, the paper's
base model, 16 sentences x 64 tokens; big = vocab 32000, the paper's big model, 64 x 128;
mini = the Multi30k recipe's step (`configs/multi30k_en_de.py:mini` at 7,168 slots: vocab
10000, D 128, F 256, 4+4 layers, 112 rows x 64), not in the comparison.
Every row is one full sentence (no padding), dropout 0.1; each size is measured with attention
dropout 0.1 and 0.0 (`--attention_dropout`). The step is the training job's own jitted step
(`flax_transformer.training.steps`), with Adam and label smoothing, on all local devices.
`--rows`/`--length` replace every size's batch; `--fit=R` measures R and 2R rows, reads
the device memory of each compiled step by XLA's count, and measures again at the largest
multiple of 8 rows that the line through those two points fits into 90% of the device's memory.
Each record names the attention kernel the compiled step calls ("cudnn" or "xla") and its device
memory by XLA's own count; `--profile` adds where the device time goes (`profile_summary.py`),
`--time_optimizer` the time of the Adam update alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import time

import jax
import numpy as np
import optax

from flax_transformer import ModelConfig
from flax_transformer.config import TrainConfig
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training import recipe

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profiling"))
import profile_summary

SIZES = {  # name: (preset, vocab, rows, length)
    "mini": ("mini", 10000, 112, 64),  # configs/multi30k_en_de.py:mini at 7,168 slots (issue 63).
    "small": ("small", 8000, 64, 32),
    "base": ("base", 32000, 16, 64),
    "big": ("big", 32000, 64, 128),
}


def _train_settings(fsdp: bool = False, warmup: int = 10) -> TrainConfig:
  """The paper's optimizer and schedule (Adam 0.9, 0.98, 1e-9; rsqrt), label smoothing 0.1."""
  return TrainConfig(schedule="rsqrt", learning_rate=1.0, warmup_steps=warmup,
                     num_train_steps=10**6, optimizer="adam", adam_b1=0.9, adam_b2=0.98,
                     adam_eps=1e-9, grad_clip_norm=0.0, label_smoothing=0.1, fsdp=fsdp, seed=0)


def measure(size: str, *, attention_dropout: float, dtype: str, fsdp: bool, num_steps: int,
            warmup_steps: int, rows: int | None = None, length: int | None = None,
            profile_dir: str | None = None, time_optimizer: bool = False,
            attention_implementation: str | None = None) -> dict:
  """One JSON-able record for `size` (its own batch unless `rows`/`length` are given)."""
  preset, vocab, default_rows, default_length = SIZES[size]
  rows, length = rows or default_rows, length or default_length
  config = getattr(ModelConfig, preset)(
      vocab, dropout_rate=0.1, attention_dropout_rate=attention_dropout, dtype=dtype,
      max_len=max(256, length), attention_implementation=attention_implementation)
  train = recipe.build(config, _train_settings(fsdp), rows=rows, length=length)
  state = train.init_state()
  rng = np.random.default_rng(0)
  batch = train.place_batch({k: rng.integers(3, vocab, (rows, length), dtype=np.int32)
                             for k in ("inputs", "targets")})
  start = time.perf_counter()
  compiled = train.lower(state, batch).compile()
  compile_seconds = time.perf_counter() - start
  for _ in range(warmup_steps):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(num_steps):
    state, metrics = compiled(state, batch)
  jax.block_until_ready((state, metrics))
  seconds = (time.perf_counter() - start) / num_steps
  tokens = rows * length
  record = {
      "benchmark": "train_step", "size": size, "vocab": vocab, "emb_dim": config.emb_dim,
      "layers": f"{config.num_encoder_layers}+{config.num_decoder_layers}",
      "batch": f"{rows}x{length}", "dtype": dtype, "fsdp": fsdp,
      "attention_dropout": attention_dropout, "devices": jax.device_count(),
      "device_kind": jax.devices()[0].device_kind,
      "attention_kernel": "cudnn" if "cudnn" in compiled.as_text() else "xla",
      "target_tokens_per_second": round(tokens / seconds, 1),
      "step_ms": round(1000 * seconds, 2), "compile_s": round(compile_seconds, 2),
      "steps_timed": num_steps, **_program_memory(compiled), **_peak_memory(),
  }
  peak = metrics_lib.peak_flops_per_device(jax.devices()[0]) * jax.device_count()
  if peak:
    flops = metrics_lib.train_flops_per_step(config, rows, length)
    record["mfu"] = round(flops / seconds / peak, 4)
  if time_optimizer:
    record["optimizer_update_ms"] = _optimizer_ms(train.optimizer, state)
  if profile_dir:
    directory = os.path.join(profile_dir, f"{size}_{dtype}_attdrop{attention_dropout}_"
                                          f"{record['attention_kernel']}_{rows}x{length}")
    with jax.profiler.trace(directory, create_perfetto_trace=True):
      for _ in range(3):
        state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
    try:
      record["profile"] = profile_summary.summarize(directory, steps=3)
    except Exception as error:  # The trace is still on disk; the timings above stand.
      record["profile_error"] = f"{type(error).__name__}: {error}"
  return record


def fit(size: str, start_rows: int, headroom: float = 0.9, **kwargs) -> list[dict]:
  """Records at `start_rows`, twice that, and the largest batch that fits (module docstring).

  Device memory is linear in the rows: fixed (params, Adam state) + per row (activations). If
  the predicted batch still runs out of memory, it is retried at 80% of its rows (twice at most).
  """
  records = [measure(size, rows=rows, **kwargs) for rows in (start_rows, 2 * start_rows)]
  first, second = (r["program_memory_mib"] for r in records)
  per_row = (second - first) / start_rows
  stats = jax.devices()[0].memory_stats()  # None on CPU: then the host's memory.
  limit = (stats["bytes_limit"] if stats else
           os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  limit_mib = limit / 2**20
  rows = int((headroom * limit_mib - (first - per_row * start_rows)) / per_row) // 8 * 8
  for attempt in range(3):
    try:
      record = measure(size, rows=rows, **kwargs)
    except Exception as error:  # XlaRuntimeError: RESOURCE_EXHAUSTED (jax's type moves).
      if attempt == 2 or "RESOURCE_EXHAUSTED" not in str(error):
        raise
      rows = int(rows * 0.8) // 8 * 8
      continue
    record.update(fitted=True, device_memory_limit_mib=round(limit_mib, 1),
                  predicted_mib_per_row=round(per_row, 2))
    return [*records, record]
  raise AssertionError("unreachable")


def _program_memory(compiled) -> dict:
  """Device memory of the compiled step by XLA's count: arguments + outputs + temporaries."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  total = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
           - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
  return {"program_memory_mib": round(total / 2**20, 1),
          "program_temp_mib": round(analysis.temp_size_in_bytes / 2**20, 1)}


def _optimizer_ms(optimizer, state, repeats: int = 10) -> float:
  """Milliseconds of the Adam update alone (gradients = parameters), jitted."""
  update = jax.jit(lambda params, opt_state: optax.apply_updates(
      params, optimizer.update(params, opt_state, params)[0]))
  jax.block_until_ready(update(state.params, state.opt_state))
  start = time.perf_counter()
  for _ in range(repeats):
    out = update(state.params, state.opt_state)
  jax.block_until_ready(out)
  return round(1000 * (time.perf_counter() - start) / repeats, 3)


def _peak_memory() -> dict:
  stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
  if stats and "peak_bytes_in_use" in stats:
    return {"peak_device_memory_mib": round(stats["peak_bytes_in_use"] / 2**20, 1)}
  # CPU: the process's peak resident memory (KiB on Linux), params and activations included.
  return {"peak_host_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="small,base",
                      help="comma-separated: mini,small,base,big")
  parser.add_argument("--attention_dropout", default="0.1,0.0",
                      help="comma-separated attention dropout rates to measure")
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--fsdp", action="store_true", help="shard params + Adam state")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per record")
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  parser.add_argument("--rows", type=int, default=None, help="rows per batch, every size")
  parser.add_argument("--length", type=int, default=None, help="tokens per row, every size")
  parser.add_argument("--fit", type=int, default=None, metavar="R",
                      help="measure R rows, 2R rows and the largest batch that fits")
  parser.add_argument("--profile", default=None, help="trace 3 steps per record under DIR")
  parser.add_argument("--attention_implementation", default=None, choices=("xla", "cudnn"),
                      help="the model's setting (default: chosen per call, see attention.py)")
  parser.add_argument("--time_optimizer", action="store_true",
                      help="also time the Adam update alone")
  args = parser.parse_args()
  header = {"benchmark": "train_step_environment", "date": datetime.date.today().isoformat(),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "machine": platform.machine(), "cpu_count": __import__("os").cpu_count()}
  print(json.dumps(header), flush=True)
  for size in args.sizes.split(","):
    for rate in (float(r) for r in args.attention_dropout.split(",")):
      kwargs = dict(attention_dropout=rate, dtype=args.dtype, fsdp=args.fsdp,
                    num_steps=args.steps, warmup_steps=args.warmup, length=args.length,
                    profile_dir=args.profile, time_optimizer=args.time_optimizer,
                    attention_implementation=args.attention_implementation)
      records = (fit(size, args.fit, **kwargs) if args.fit
                 else [measure(size, rows=args.rows, **kwargs)])
      for record in records:
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
  main()
