"""Where metrics go: console lines, TensorBoard and metrics.jsonl; FLOPs and MFU.

Only process 0 writes; on other processes `MetricWriter` drops everything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax

from flax_transformer import workdir as workdir_lib
from flax_transformer.model.config import ModelConfig
from flax_transformer.progress import format_duration
from flax_transformer.runtime import accelerators


def peak_flops_per_device(device: jax.Device, configured: float = 0.0) -> float:
  """`configured` if > 0, else the known bfloat16 peak of `device`, else 0 (unknown: no MFU)."""
  if configured > 0:
    return configured
  known = accelerators.chip(getattr(device, "device_kind", ""))
  return 0.0 if known is None else known.peak_bf16_flops


TRAIN_FLOPS_HOW = ("3 x the forward matmuls (2 per weight and token of the attention, FFN and "
                   "vocabulary projections, + QK^T and AV over the whole row)")


def train_flops_per_step(model: ModelConfig, rows: int, length: int) -> float:
  """Matmul FLOPs of one train step (forward + backward = 3x forward) on rows x length tokens.

  Counts the dense layers (2 FLOPs per weight per token), the attention score and value
  products over the full row length, and the output projection over the vocabulary.
  """
  d, f, v, n = model.emb_dim, model.mlp_dim, model.vocab_size, rows * length
  attention_weights = 4 * d * d  # Q, K, V, O
  encoder = model.num_encoder_layers * (attention_weights + 2 * d * f)
  decoder = model.num_decoder_layers * (2 * attention_weights + 2 * d * f)
  dense = 2 * n * (encoder + decoder + d * v)
  # Per query and layer: QK^T and AV over `length` keys, 2 * 2 * length * d.
  attention = 4 * n * length * d * (model.num_encoder_layers + 2 * model.num_decoder_layers)
  return 3.0 * (dense + attention)


class MetricWriter:
  """Appends {"step", "split", "name", "value"} lines to metrics.jsonl and TensorBoard scalars."""

  def __init__(self, workdir: str | os.PathLike, enabled: bool):
    self.enabled = enabled
    self._jsonl = None
    self._tensorboard = None
    if enabled:
      from tensorboardX import SummaryWriter

      Path(workdir).mkdir(parents=True, exist_ok=True)
      self._jsonl = open(Path(workdir) / workdir_lib.METRICS_FILE, "a", buffering=1)  # noqa: SIM115
      self._tensorboard = SummaryWriter(str(Path(workdir) / workdir_lib.TENSORBOARD_DIR))

  def write(self, step: int, split: str, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    for name, value in scalars.items():
      value = float(value)
      self._jsonl.write(json.dumps(
          {"step": int(step), "split": split, "name": name, "value": value}) + "\n")
      self._tensorboard.add_scalar(f"{split}/{name}", value, int(step))

  def write_text(self, step: int, tag: str, text: str) -> None:
    if self.enabled:
      self._tensorboard.add_text(tag, text, int(step))

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tensorboard.close()


def train_line(step: int, total: int, scalars: dict[str, float]) -> str:
  """'step 100/1000 | loss 3.210 | acc 41.2% | lr 1.2e-04 | 5,400 tok/s | 0.210 s/step | ...'"""
  parts = [f"step {step}/{total}", f"loss {scalars['loss']:.3f}",
           f"acc {100 * scalars['accuracy']:.1f}%", f"lr {scalars['learning_rate']:.2e}",
           f"{scalars['tokens_per_second']:,.0f} tok/s",
           f"{scalars['seconds_per_step']:.3f} s/step",
           f"ETA {format_duration(scalars['seconds_per_step'] * (total - step))}"]
  if "mfu" in scalars:
    parts.append(f"MFU {100 * scalars['mfu']:.1f}%")
  return " | ".join(parts)


def reduce_metrics(sums: dict[str, Any]) -> dict[str, float]:
  """Loss sums ('loss', 'nll', 'correct', 'num_tokens') -> per-token 'loss', 'nll', 'accuracy'."""
  tokens = max(float(sums["num_tokens"]), 1.0)
  return {"loss": float(sums["loss"]) / tokens, "nll": float(sums["nll"]) / tokens,
          "accuracy": float(sums["correct"]) / tokens}
