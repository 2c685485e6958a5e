"""The training tests' small models, settings and packed batches, shared by their modules (a
plain module: test modules import from it, never from each other).

The step tests (test_training_steps, test_training_checkpoints, test_training_multihost's
workers): a 1+1-layer tiny model of STEP_VOCAB pieces, the paper's Adam and warm-up, rows of two
packed examples. The guided-alignment tests (test_training_guided_alignment,
test_training_gradients): examples of ALIGNMENT_VOCAB pieces, each with a random alignment,
packed as the data pipeline packs them. Shapes: b examples' target length t, source length s.
"""

from __future__ import annotations

import numpy as np

from flax_transformer import ModelConfig, Transformer
from flax_transformer.config import TrainConfig

STEP_VOCAB = 48
ALIGNMENT_VOCAB = 40
KEYS = ("inputs", "targets", "inputs_segment_ids", "targets_segment_ids", "inputs_positions",
        "targets_positions")


def step_train_config(**overrides) -> TrainConfig:
  """The step tests' training settings (the paper's Adam, warm-up then rsqrt), with
  `overrides`."""
  settings = dict(schedule="warmup_rsqrt", learning_rate=1e-3, warmup_steps=2,
                  num_train_steps=10, end_learning_rate_factor=0.0, optimizer="adam",
                  adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, weight_decay=0.0,
                  grad_clip_norm=1.0, label_smoothing=0.1, seed=3)
  settings.update(overrides)
  return TrainConfig(**settings)


def step_model(dropout: float = 0.1) -> Transformer:
  """The tiny preset with one encoder and one decoder layer, STEP_VOCAB pieces, length 16."""
  return Transformer(ModelConfig.tiny(
      STEP_VOCAB, num_encoder_layers=1, num_decoder_layers=1, dropout_rate=dropout,
      attention_dropout_rate=dropout, max_len=16))


def packed_batch(rows: int, length: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
  """Rows of two packed examples each, then padding, as the data pipeline makes them."""
  rng = np.random.default_rng(seed)
  batch = {k: np.zeros((rows, length), np.int32) for k in KEYS}
  for side in ("inputs", "targets"):
    for row in range(rows):
      first, second = rng.integers(2, 6, size=2)
      for segment, (start, size) in enumerate(((0, first), (first, second)), start=1):
        batch[side][row, start:start + size] = rng.integers(3, STEP_VOCAB, size=size)
        batch[side][row, start + size - 1] = 1  # EOS
        batch[f"{side}_segment_ids"][row, start:start + size] = segment
        batch[f"{side}_positions"][row, start:start + size] = np.arange(size)
  return batch


def aligned_examples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
  """Examples of random ids ending with EOS, each with a random bool [t, s] alignment: every
  target piece but some aligned to 1-2 source pieces, EOS to EOS."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    s, t = rng.integers(3, 7), rng.integers(2, 6)
    inputs, targets = rng.integers(3, ALIGNMENT_VOCAB, s), rng.integers(3, ALIGNMENT_VOCAB, t)
    inputs[-1] = targets[-1] = 1
    alignment = np.zeros((t, s), bool)
    for row in range(t - 1):
      if rng.random() < 0.8:
        alignment[row, rng.choice(s - 1, rng.integers(1, 3), replace=False)] = True
    alignment[-1, -1] = True
    out.append(dict(inputs=inputs, targets=targets, alignment=alignment))
  return out


def pack_aligned(rows: list[list[dict]], length: int) -> dict[str, np.ndarray]:
  """Rows of packed aligned_examples (segment ids, positions, each alignment at its packed
  place)."""
  batch = {k: np.zeros((len(rows), length), np.int32) for k in KEYS}
  batch["alignment"] = np.zeros((len(rows), length, length), bool)
  for r, examples in enumerate(rows):
    s_at = t_at = 0
    for segment, ex in enumerate(examples, start=1):
      s, t = len(ex["inputs"]), len(ex["targets"])
      for side, start, n in (("inputs", s_at, s), ("targets", t_at, t)):
        batch[side][r, start:start + n] = ex[side]
        batch[f"{side}_segment_ids"][r, start:start + n] = segment
        batch[f"{side}_positions"][r, start:start + n] = np.arange(n)
      batch["alignment"][r, t_at:t_at + t, s_at:s_at + s] = ex["alignment"]
      s_at, t_at = s_at + s, t_at + t
  return batch
