"""Compiles the product's own programs for a TPU topology, on abstract inputs, and reads back
what the compiler says: memory per chip, FLOPs, and whether it fits.

`plan_train` lowers the train step `train.py` runs, built by the same recipe
(`training.recipe.from_experiment`: model, optimizer, mesh of the topology's devices, data
parallel or FSDP shardings, jitted step), on `jax.ShapeDtypeStruct`s of the train state and of
one global batch: nothing is allocated. `plan_decode` does the same for the
beam search `flax-transformer translate` runs (`translator.search_program`), at the largest
device batch of each length bucket. Tracing happens inside `accelerators.compiling_for("tpu")`,
so every choice made at trace time (the fused attention call, the search's loop shape) is the
one a TPU host makes.

The compiler's out-of-memory errors (RESOURCE_EXHAUSTED) become a plan that does not fit, with
the compiler's own figures; every other figure is reported either way.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from flax_transformer import config as config_lib
from flax_transformer.config import TranslateConfig
from flax_transformer.decoding import bridge
from flax_transformer.model import precision as precision_lib
from flax_transformer.model.config import describe_model
from flax_transformer.model.transformer import Transformer
from flax_transformer.planning.topology import PlanError, Topology, chip_of
from flax_transformer.runtime import accelerators
from flax_transformer.runtime import sharding as sharding_lib
from flax_transformer.serving import batching, translator
from flax_transformer.training import metrics as metrics_lib
from flax_transformer.training import recipe as recipe_lib
from flax_transformer.training import state as state_lib

GIB = accelerators.GIB


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-chip bytes of a compiled program, as `compiled.memory_analysis()` gives them."""

  arguments: int
  outputs: int
  temporaries: int
  aliased: int  # Outputs that reuse an argument's buffer (the donated train state).
  code: int  # The program itself.
  peak: int  # The compiler's own peak over the program (0 if it does not say).

  @property
  def total(self) -> int:
    """What the program holds at once at most: the compiler's peak, else arguments + outputs +
    temporaries - aliased + code."""
    summed = self.arguments + self.outputs + self.temporaries - self.aliased + self.code
    return max(self.peak, summed)

  @classmethod
  def of(cls, compiled: Any) -> Memory:
    stats = compiled.memory_analysis()
    return cls(arguments=stats.argument_size_in_bytes, outputs=stats.output_size_in_bytes,
               temporaries=stats.temp_size_in_bytes, aliased=stats.alias_size_in_bytes,
               code=stats.generated_code_size_in_bytes,
               peak=int(getattr(stats, "peak_memory_in_bytes", 0) or 0))


@dataclasses.dataclass(frozen=True)
class Plan:
  """One program compiled for a topology, and what the compiler said about it."""

  program: str  # "train step", "beam search [rows x length]"
  topology: str
  num_slices: int
  device_kind: str
  chip: str  # "v5e"
  num_chips: int
  num_hosts: int
  chip_memory: int  # HBM per chip, bytes.
  state_bytes: int  # Per chip: the arguments as their shardings place them (no compiler).
  memory: Memory | None  # None when the compiler stopped.
  needed: int | None  # Bytes per chip the compiler asked for when it ran out, else None.
  compiler_flops: float | None  # Per step, all chips (cost_analysis is per chip).
  model_flops: float | None  # Per step, all chips, counted from the config (`model_flops_how`).
  model_flops_how: str
  target_tokens: int  # Per step, all chips (train: the batch; search: rows x L).
  compile_seconds: float
  compiler_error: str | None = None  # The compiler's out-of-memory line.
  settings: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def fits(self) -> bool:
    return self.memory is not None and self.memory.total <= self.chip_memory


def plan_train(config: ml_collections.ConfigDict, devices: list[jax.Device],
               topology: Topology) -> Plan:
  """Compiles `train.py`'s train step of `config` for `devices` (a topology's) and reports."""
  exp = load_experiment(config, devices)
  train = recipe_lib.from_experiment(exp, devices=devices)
  batch = train.abstract_batch()
  settings = {"model": describe_model(exp.model, exp.preset), "fsdp": exp.train.fsdp,
              "rows": train.rows, "max_length": train.length,
              "grad_accum_steps": exp.train.grad_accum_steps,
              "parameters": train.parameter_count}
  return _compile(
      "train step", train.lower, devices, topology,
      state_bytes=_bytes_per_chip(train.abstract_state) + _bytes_per_chip(batch),
      model_flops=metrics_lib.train_flops_per_step(exp.model, train.rows, train.length),
      model_flops_how=metrics_lib.TRAIN_FLOPS_HOW, target_tokens=train.rows * train.length,
      settings=settings)


def plan_decode(config: ml_collections.ConfigDict, devices: list[jax.Device],
                topology: Topology, batch_tokens: int | None = None,
                precision: str = "float32") -> list[Plan]:
  """Compiles translate's search of `config` (its search group) for `devices`, at the largest
  device batch of every length bucket (`batching.largest_shapes`), one device batch per chip,
  parameters replicated as `Translator.from_workdir(mesh=)` places them, at the serving
  `precision` (`model.precision`: int8 kernels, bfloat16 weights)."""
  exp = load_experiment(config, devices)
  exp = dataclasses.replace(exp, model=precision_lib.precision_config(exp.model, precision))
  settings = TranslateConfig(search=exp.search, precision=precision)
  if batch_tokens is not None:
    settings = settings.replace(batch_tokens=batch_tokens)
  search = settings.search
  grow = _grows_cache_on_tpu(search)
  search = search.replace(grow_cache="yes" if grow else "no")
  mesh = sharding_lib.local_mesh(devices)
  program = translator.search_program(exp.model, mesh)
  replicated, rows_sharding = sharding_lib.replicated(mesh), sharding_lib.batch_sharding(mesh)
  boxed = state_lib.abstract_params(Transformer(exp.model), seed=0, max_length=8)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                        nn.meta.unbox(boxed))
  plans = []
  for rows, length in batching.largest_shapes(settings.batch_tokens, exp.model.max_len):
    decode_len = translator.decode_length(search, length, exp.model.max_len)
    inputs = jax.ShapeDtypeStruct((rows * len(devices), length), jnp.int32,
                                  sharding=rows_sharding)
    rng = _rng(search.method, rows * len(devices), replicated, rows_sharding)
    plans.append(_compile(
        f"{search.method} search [{rows} x {length}]"
        + ("" if precision == "float32" else f", {precision}"),
        lambda inputs=inputs, rng=rng, decode_len=decode_len: program.lower(
            params, inputs, rng, settings=search, max_decode_len=decode_len),
        devices, topology, state_bytes=_bytes_per_chip(params) + _bytes_per_chip(inputs),
        model_flops=None, model_flops_how="", target_tokens=rows * len(devices) * decode_len,
        settings={"model": describe_model(exp.model, exp.preset), "rows_per_chip": rows,
                  "source_length": length, "max_decode_len": decode_len,
                  "beam_size": search.beam_size if search.method == "beam" else 1,
                  "batch_tokens": settings.batch_tokens, "grow_cache": grow,
                  "precision": precision}))
  return plans


def load_experiment(config: ml_collections.ConfigDict, devices: list[jax.Device]
                    ) -> config_lib.Experiment:
  """`config` checked for this many chips and hosts (ConfigError names a bad key or batch)."""
  hosts = len({device.process_index for device in devices})
  return config_lib.load(config, num_devices=len(devices), num_processes=hosts)


def _grows_cache_on_tpu(search: config_lib.SearchConfig) -> bool:
  """config.search.grow_cache resolved as a TPU host resolves it ("auto": no)."""
  with accelerators.compiling_for("tpu"):
    return bridge.grows_cache(search.grow_cache, search.method)


def _compile(program: str, lower, devices: list[jax.Device], topology: Topology, *,
             state_bytes: int, model_flops: float | None, model_flops_how: str,
             target_tokens: int, settings: dict[str, Any]) -> Plan:
  """Lowers (tracing for TPU) and compiles; an out-of-memory compile gives a plan that does not
  fit, with the compiler's figures."""
  chip = chip_of(devices)
  start = time.perf_counter()
  memory = needed = flops = error = None
  try:
    with accelerators.compiling_for("tpu"):
      lowered = lower()
    compiled = lowered.compile()
    memory = Memory.of(compiled)
    flops = _flops(compiled) * len(devices)
  except jax.errors.JaxRuntimeError as failure:
    error = out_of_memory_line(failure)
    if error is None:
      raise
    needed = needed_bytes(error)
  return Plan(
      program=program, topology=topology.name, num_slices=topology.num_slices,
      device_kind=devices[0].device_kind, chip=chip.name, num_chips=len(devices),
      num_hosts=len({d.process_index for d in devices}), chip_memory=chip.memory_bytes,
      state_bytes=state_bytes, memory=memory, needed=needed, compiler_flops=flops,
      model_flops=model_flops, model_flops_how=model_flops_how, target_tokens=target_tokens,
      compile_seconds=time.perf_counter() - start, compiler_error=error, settings=settings)


def out_of_memory_line(error: BaseException) -> str | None:
  """The compiler's out-of-memory sentence, or None for any other error."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
    return None
  line = next((ln for ln in text.splitlines() if "RESOURCE_EXHAUSTED" in ln), text)
  return line.split("RESOURCE_EXHAUSTED:", 1)[-1].strip()


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s?([KMGT])i?B?\b")
_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def needed_bytes(line: str) -> int | None:
  """The first size in the compiler's out-of-memory sentence ("... required for HLO temporaries
  (224.14G) exceeds available HBM (15.75G)", "Used 21.3G of 15.75G hbm"): what it asked for."""
  match = _SIZE.search(line)
  return None if match is None else int(float(match.group(1)) * _UNITS[match.group(2)])


def _flops(compiled: Any) -> float:
  analysis = compiled.cost_analysis()
  if isinstance(analysis, list | tuple):  # Older jax: one dict per program.
    analysis = analysis[0] if analysis else {}
  return float((analysis or {}).get("flops", 0.0))


def _bytes_per_chip(tree: Any) -> int:
  """Bytes of the largest shard of each leaf, summed: one chip's share of `tree`."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def _rng(method: str, rows: int, replicated: Any, rows_sharding: Any) -> Any:
  """The search's key argument: one key (beam, greedy) or one per row (sample)."""
  key = jax.eval_shape(lambda: jax.random.key(0))
  if method == "sample":
    return jax.ShapeDtypeStruct((rows, *key.shape), key.dtype, sharding=rows_sharding)
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)


__all__ = ["Memory", "Plan", "PlanError", "plan_decode", "plan_train"]
