"""Where metrics go: console lines, TensorBoard and metrics.jsonl; FLOPs and MFU.

Only process 0 writes; on other processes `MetricWriter` drops everything.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import Any

import jax

from flax_transformer import files
from flax_transformer import workdir as workdir_lib
from flax_transformer.model.config import ModelConfig
from flax_transformer.progress import format_duration
from flax_transformer.runtime import accelerators

# What tensorboardX imports only to offer what this writer does not use: torch, to take torch
# tensors, and google.cloud.storage, to write gs:// event files itself (a gs:// workdir's events
# are written locally and copied, `_BucketLogs`). With the [hf] and [gcs] extras installed they
# took 3.2 s of a 23 s SHRUNK train.py run (cProfile, AMD EPYC Zen 3) and 0.15 s of a training
# job's 1.30 s of imports (side by side, Zen 4, 2026-11-28; docs/performance.md, "Measured design
# choices").
_UNUSED_BY_THE_WRITER = ("torch", "google.cloud.storage")


def _summary_writer_class() -> type:
  """tensorboardX's SummaryWriter, imported without _UNUSED_BY_THE_WRITER.

  While tensorboardX loads, importing one of them fails as if it were not installed;
  afterwards each imports as usual. A process that has imported tensorboardX, or one of them,
  already is left as it is. tensorboardX loaded so cannot write to gs:// or take torch tensors
  itself, in this process; this writer asks for neither.
  """
  if "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  blocked = [name for name in _UNUSED_BY_THE_WRITER if name not in sys.modules]
  for name in blocked:
    sys.modules[name] = None  # type: ignore[assignment]  # Now `import name` raises ImportError.
  try:
    from tensorboardX import SummaryWriter
  finally:
    for name in blocked:
      if name in sys.modules and sys.modules[name] is None:
        del sys.modules[name]
  return SummaryWriter


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
  products over the full row length, and the output projection over the vocabulary. Heads of
  `attention_head_dim` (N x H wide) and gated feed-forwards (three matrices) count as built.
  """
  d, f, v, n = model.emb_dim, model.mlp_dim, model.vocab_size, rows * length
  inner = model.num_heads * model.head_dim  # N x H: D in the paper.
  attention_weights = 4 * d * inner  # Q, K, V, O
  feed_forward = (3 if model.gated else 2) * d * f
  encoder = model.num_encoder_layers * (attention_weights + feed_forward)
  decoder = model.num_decoder_layers * (2 * attention_weights + feed_forward)
  dense = 2 * n * (encoder + decoder + d * v)
  # Per query and layer: QK^T and AV over `length` keys, 2 * 2 * length * N x H.
  attention = 4 * n * length * inner * (model.num_encoder_layers + 2 * model.num_decoder_layers)
  return 3.0 * (dense + attention)


_WRITERS = itertools.count()  # MetricWriters made by this process.


class MetricWriter:
  """Appends {"step", "split", "name", "value"} lines to metrics.jsonl and TensorBoard scalars.

  On a local disk metrics.jsonl is appended to a line at a time, and TensorBoard writes its
  event file in WORKDIR/tensorboard. A bucket has no append (gcsfs silently overwrites), so on
  gs:// both are uploaded whole, one object each time (`_BucketLogs`): every `upload_seconds`
  from a background thread, and at every `flush`. The loop flushes before each checkpoint save,
  so every line up to a checkpoint's step is stored before the checkpoint is; lines after it are
  written again by the resumed run.
  """

  def __init__(self, workdir: str | os.PathLike, enabled: bool, *, upload_seconds: float = 10):
    self.enabled = enabled
    self._jsonl: Any = None
    self._tensorboard: Any = None
    self._bucket: _BucketLogs | None = None
    if not enabled:
      return
    SummaryWriter = _summary_writer_class()

    directory = files.to_path(workdir)
    if files.is_remote(directory):
      self._bucket = _BucketLogs(directory, self.flush, upload_seconds)
      self._jsonl, events = self._bucket.log, self._bucket.spool
    else:
      directory.mkdir(parents=True, exist_ok=True)
      self._jsonl = open(directory / workdir_lib.METRICS_FILE, "a", buffering=1)  # noqa: SIM115
      events = os.fspath(directory / workdir_lib.TENSORBOARD_DIR)
    # The pid and a count in the name: a resumed run's event file never replaces an earlier
    # run's (their names otherwise differ only by the second they were made in).
    self._tensorboard = SummaryWriter(
        events, filename_suffix=f".{os.getpid()}.{next(_WRITERS)}")

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

  def flush(self) -> None:
    """Stores every line written so far (locally each line is written at once)."""
    if self._bucket is not None:
      self._tensorboard.flush()
      self._bucket.upload()

  def close(self) -> None:
    if self.enabled and self._tensorboard is not None:
      self._tensorboard.close()
      if self._bucket is not None:
        self._bucket.close()
      else:
        self._jsonl.close()
      self._tensorboard = None


class _BucketLogs:
  """metrics.jsonl and TensorBoard's event file of a gs:// workdir. The log's lines (those
  already in the bucket first) are kept in memory; TensorBoard writes its event file into a
  local spool folder. `upload` sends each whole as one object, so a reader sees every line up to
  some point and never a torn one. `flush` (the writer's) runs every `upload_seconds` from a
  background thread; writers never wait for an upload."""

  def __init__(self, workdir: files.Path, flush: Any, upload_seconds: float):
    self.log = _LogLines(workdir / workdir_lib.METRICS_FILE)
    self.spool = tempfile.mkdtemp(prefix="flax_transformer_tensorboard_")
    self._events = workdir / workdir_lib.TENSORBOARD_DIR
    self._uploading = threading.Lock()  # One upload at a time, the newest last.
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._every, args=(flush, upload_seconds),
                                    daemon=True, name="metrics-upload")
    self._thread.start()

  def _every(self, flush: Any, seconds: float) -> None:
    while not self._stop.wait(seconds):
      try:
        flush()
      except Exception as error:  # A passing network fault: the next upload sends it all.
        logging.warning("Could not upload metrics to %s (%s); trying again.",
                        self.log.path.parent, error)

  def upload(self) -> None:
    with self._uploading:
      self.log.upload()
      for name in sorted(os.listdir(self.spool)):
        with open(os.path.join(self.spool, name), "rb") as f:
          files.atomic_write(self._events / name, f.read())

  def close(self) -> None:
    self._stop.set()
    self._thread.join()
    self.upload()
    shutil.rmtree(self.spool, ignore_errors=True)


class _LogLines:
  """A text log's lines in memory, uploaded whole to `path` when new ones came."""

  def __init__(self, path: files.Path):
    self.path = path
    self._lines: list[str] = [path.read_text()] if path.exists() else []
    self._stored = len(self._lines)
    self._lock = threading.Lock()

  def write(self, text: str) -> None:
    with self._lock:
      self._lines.append(text)

  def upload(self) -> None:
    with self._lock:
      if len(self._lines) == self._stored:
        return
      text, count = "".join(self._lines), len(self._lines)
    files.atomic_write(self.path, text)
    self._stored = count


def train_line(step: int, total: int, scalars: dict[str, float]) -> str:
  """'step 100/1000 | loss 3.210 | acc 41.2% | lr 1.2e-04 | 5,400 tok/s | 0.210 s/step | ...'"""
  parts = [f"step {step}/{total}", f"loss {scalars['loss']:.3f}",
           f"acc {100 * scalars['accuracy']:.1f}%",
           *([f"align {scalars['alignment_loss']:.3f}"] if "alignment_loss" in scalars else []),
           f"lr {scalars['learning_rate']:.2e}",
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
