"""What `flax-transformer plan` prints: the figures of each compiled program, the verdict line
of one that does not fit (with what to change), and the same as JSON."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from flax_transformer.planning.plans import Plan
from flax_transformer.runtime.accelerators import GIB


def describe(plan: Plan) -> str:
  """The plan's figures, a few aligned lines; the same whether it fits or not."""
  settings = plan.settings
  slices = f", {plan.num_slices} slices" if plan.num_slices > 1 else ""
  lines = [f"plan: {plan.program} on {plan.topology}{slices}: {plan.num_chips} x "
           f"{plan.device_kind} ({plan.chip}), {plan.num_hosts} host"
           f"{'s' if plan.num_hosts > 1 else ''}"]
  model = settings.get("model", "")
  if "parameters" in settings:
    model += f"; {settings['parameters'] / 1e6:.1f}M parameters; fsdp {settings['fsdp']}"
  lines.append(f"  model       {model}")
  lines.append(f"  tokens      {_tokens_line(plan)}")
  lines.extend(_memory_lines(plan))
  lines.append(f"  FLOPs       {_flops_line(plan)}")
  lines.append(f"  compile     {plan.compile_seconds:.1f} s")
  return "\n".join(lines)


def verdict(plan: Plan) -> str | None:
  """None when `plan` fits, else one line: what it needs, the chip's memory, what to try."""
  if plan.fits:
    return None
  if plan.memory is not None:
    amount = f"{_gib(plan.memory.total)} per chip"
  else:  # The compiler's figure when it stops: a part (e.g. the temporaries), a lower bound.
    amount = "more" if plan.needed is None else f"at least {_gib(plan.needed)} per chip"
  return (f"does not fit: {plan.program} needs {amount} of {plan.chip}'s "
          f"{_gib(plan.chip_memory)}; try {_suggestions(plan)}")


def as_json(plans: Sequence[Plan]) -> list[dict[str, Any]]:
  """Every figure of every plan, bytes and FLOPs as numbers."""
  rows = []
  for plan in plans:
    row = dataclasses.asdict(plan)
    row["fits"] = plan.fits
    row["total_bytes"] = None if plan.memory is None else plan.memory.total
    row["verdict"] = verdict(plan)
    rows.append(row)
  return rows


def _tokens_line(plan: Plan) -> str:
  settings = plan.settings
  per_chip = plan.target_tokens // plan.num_chips
  if "rows" in settings:
    return (f"{settings['rows']} rows x {settings['max_length']} = {plan.target_tokens:,} target "
            f"tokens per step ({per_chip:,} per chip), grad_accum_steps "
            f"{settings['grad_accum_steps']}")
  return (f"{settings['rows_per_chip']} sentences x {settings['source_length']} source tokens "
          f"per chip (translate --batch_tokens {settings['batch_tokens']}), beam "
          f"{settings['beam_size']}, up to {settings['max_decode_len']} output tokens: "
          f"{plan.target_tokens:,} per call ({per_chip:,} per chip)")


def _memory_lines(plan: Plan) -> list[str]:
  placed = f"state and batch as their shardings place them: {_gib(plan.state_bytes)} per chip"
  if plan.memory is None:
    return [f"  HBM/chip    {placed}",
            f"              the compiler ran out of memory: {plan.compiler_error}",
            f"              needs {_gib(plan.needed) if plan.needed else 'more'} of "
            f"{_gib(plan.chip_memory)}: does not fit"]
  memory = plan.memory
  share = memory.total / plan.chip_memory
  peak = f", compiler's peak {_gib(memory.peak)}" if memory.peak else ""
  return [f"  HBM/chip    arguments {_gib(memory.arguments)}, temporaries "
          f"{_gib(memory.temporaries)}, outputs {_gib(memory.outputs)}, aliased "
          f"{_gib(memory.aliased)}, code {_gib(memory.code)}{peak}",
          f"              total {_gib(memory.total)} of {_gib(plan.chip_memory)} ({share:.0%}): "
          f"{'fits' if plan.fits else 'does not fit'}"]


def _flops_line(plan: Plan) -> str:
  parts = []
  if plan.compiler_flops is not None:
    per_chip = plan.compiler_flops / plan.num_chips
    loop = "" if plan.model_flops is not None else ", a loop body counted once"
    parts.append(f"compiler {_tera(plan.compiler_flops)} per step ({_tera(per_chip)} per "
                 f"chip{loop})")
  if plan.model_flops is not None:
    parts.append(f"model {_tera(plan.model_flops)}")
  line = "; ".join(parts) or "none (the compiler stopped)"
  return line + (f"\n              model FLOPs: {plan.model_flops_how}"
                 if plan.model_flops is not None else "")


def _suggestions(plan: Plan) -> str:
  settings = plan.settings
  if "rows" not in settings:  # A search.
    return (f"a smaller translate --batch_tokens (now {settings['batch_tokens']} per chip) or "
            "--config.search.beam_size")
  options = []
  if not settings["fsdp"] and plan.num_chips > 1:
    options.append("--config.train.fsdp=True")
  options.append(f"a smaller --config.data.batch_tokens (now "
                 f"{settings['rows'] * settings['max_length']})")
  options.append(f"--config.train.grad_accum_steps={settings['grad_accum_steps'] * 2}")
  return ", ".join(options[:-1]) + " or " + options[-1]


def _gib(size: int) -> str:
  """Bytes in GiB, or MiB below one GiB."""
  return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 1024**2:.1f} MiB"


def _tera(flops: float) -> str:
  """FLOPs with the unit that leaves 1 to 999 of them."""
  for scale, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP")):
    if flops >= scale:
      return f"{flops / scale:.3g} {unit}"
  return f"{flops / 1e6:.3g} MFLOP"


def plan_config(config: Any, topology: str, *, num_slices: int = 1, decode: bool = False,
                batch_tokens: int | None = None, precisions: Sequence[str] = ("float32",)
                ) -> list[Plan]:
  """What `flax-transformer plan` compiles: the train step of `config` (an experiment
  ConfigDict) for `topology` ("v5e:2x4") and, with `decode`, translate's search at every length
  bucket's largest batch, at each serving precision of `precisions` (`model.precision`)."""
  from flax_transformer.planning import plans
  from flax_transformer.planning import topology as topology_lib

  parsed = topology_lib.parse_topology(topology, num_slices)
  devices = topology_lib.topology_devices(parsed)
  programs = [plans.plan_train(config, devices, parsed)]
  if decode:
    for precision in precisions:
      programs += plans.plan_decode(config, devices, parsed, batch_tokens=batch_tokens,
                                    precision=precision)
  return programs


def report(plans: Sequence[Plan], as_json_text: bool = False) -> tuple[str, list[str]]:
  """(what `plan` prints on stdout: the figures, or JSON; the verdict line of each program that
  does not fit, for stderr)."""
  text = (json.dumps(as_json(plans), indent=1) if as_json_text
          else "\n".join(describe(plan) for plan in plans))
  return text, [line for plan in plans if (line := verdict(plan))]
