"""What the product knows about accelerator chips, and which platform a program is traced for.

`CHIPS` holds each chip's dense bfloat16 peak (vendor figures, no sparsity; the MFU denominator)
and its memory per chip (the planner's fit test). A device names its chip by `device_kind`:
"TPU v5 lite" is v5e, "TPU v5" is v5p, "TPU v6 lite" is v6e.

A few choices are made while tracing, from the platform the program will run on: the fused
attention call, cuDNN, the beam search's steps per loop iteration, growing the decoding cache.
`traced_platform()` is `jax.default_backend()`, except inside `compiling_for(platform)`, which
`plan` uses to trace, on a CPU machine, the program a TPU would run. Imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import jax

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip: its `device_kind` prefix, peak dense bf16 FLOP/s and memory."""

  device_kind: str
  name: str
  peak_bf16_flops: float
  memory_bytes: int | None  # Per chip; None where the kind comes in several sizes.


# Matched by prefix, in this order ("TPU v5 lite" before "TPU v5").
CHIPS = (
    Chip("TPU v4", "v4", 275e12, 32 * GIB),
    Chip("TPU v5 lite", "v5e", 197e12, 16 * GIB),
    Chip("TPU v5", "v5p", 459e12, 95 * GIB),
    Chip("TPU v6 lite", "v6e", 918e12, 32 * GIB),
    Chip("NVIDIA H200", "H200", 989e12, 141 * GIB),
    Chip("NVIDIA H100", "H100", 989e12, 80 * GIB),
    Chip("NVIDIA A100", "A100", 312e12, None),
    Chip("NVIDIA L4", "L4", 121e12, 24 * GIB),
)


def chip(device_kind: str) -> Chip | None:
  """The chip of a `device_kind` ("TPU v5 lite", "NVIDIA H100 80GB HBM3"), or None if unknown."""
  return next((c for c in CHIPS if device_kind.startswith(c.device_kind)), None)


_TRACED_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "flax_transformer_traced_platform", default=None)


def traced_platform() -> str:
  """The platform ("cpu", "gpu", "tpu") the program being traced is for."""
  return _TRACED_PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
  """Traces inside for `platform`'s devices rather than the default backend's."""
  token = _TRACED_PLATFORM.set(platform)
  try:
    yield
  finally:
    _TRACED_PLATFORM.reset(token)
