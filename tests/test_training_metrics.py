"""The metric writer's TensorBoard events (`training/metrics.py`)."""

import struct
import subprocess
import sys

import pytest
from conftest import HF_INSTALL

# Writes a scalar and a text into a local workdir (argv[1]), then says whether torch and
# google.cloud.storage were imported and that each still imports afterwards.
_WRITE = """
import sys

from flax_transformer.training.metrics import MetricWriter

writer = MetricWriter(sys.argv[1], enabled=True)
writer.write(3, "train", {"loss": 2.5})
writer.write_text(3, "sample", "a b c")
writer.close()
print("torch" in sys.modules, "google.cloud.storage" in sys.modules)
import torch

print(torch.ones(2).sum().item())
try:
  from google.cloud import storage
except ImportError:  # Not installed: nothing to check.
  print("absent")
else:
  print(storage.Client.__name__)
"""


def _events(path):
  """The Event records of a TensorBoard event file: TFRecord framing (length, its CRC, data,
  the data's CRC), read without tensorboardX's writer."""
  from tensorboardX.proto import event_pb2

  data, records, at = path.read_bytes(), [], 0
  while at < len(data):
    (length,) = struct.unpack("<Q", data[at:at + 8])
    event = event_pb2.Event()
    event.ParseFromString(data[at + 12:at + 12 + length])
    records.append(event)
    at += 12 + length + 4
  return records


@pytest.mark.slow  # Spawns a process: whether torch gets imported shows in a fresh one.
def test_the_writer_imports_neither_torch_nor_gcs_and_its_events_hold_the_scalars(tmp_path):
  pytest.importorskip("torch", reason=HF_INSTALL)  # Without torch there is nothing to avoid.
  result = subprocess.run([sys.executable, "-c", _WRITE, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split()[:3] == ["False", "False", "2.0"]
  assert result.stdout.split()[3] in ("Client", "absent")
  [event_file] = (tmp_path / "tensorboard").iterdir()
  scalars = {(value.tag, event.step): value.simple_value
             for event in _events(event_file) for value in event.summary.value
             if value.HasField("simple_value")}
  assert scalars == {("train/loss", 3): 2.5}
  assert '"name": "loss", "value": 2.5' in (tmp_path / "metrics.jsonl").read_text()


@pytest.mark.parametrize("overrides", [
    {},  # The paper's block, tied output.
    # T5 v1.1's: gated feed-forward (three matrices), heads N x H wider than D, untied output.
    {"activation": "gated-gelu", "attention_head_dim": 12, "tie_output_projection": False,
     "share_embeddings": True},
])
def test_train_flops_count_every_kernel_the_model_builds(overrides):
  """The MFU's FLOPs against the model's own parameters: 2 FLOPs per kernel weight per token
  (the output projection through the tied embedding where there is no kernel of its own),
  plus QK^T and AV over the row, times 3 for the backward pass."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from flax_transformer import ModelConfig, Transformer
  from flax_transformer.training.metrics import train_flops_per_step

  config = ModelConfig(vocab_size=29, emb_dim=24, num_heads=3, mlp_dim=40, num_encoder_layers=2,
                       num_decoder_layers=3, max_len=16, **overrides)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), tokens, tokens))
  kernels = sum(int(np.prod(leaf.shape))
                for path, leaf in jax.tree_util.tree_leaves_with_path(params["params"])
                if "['kernel']" in jax.tree_util.keystr(path))
  rows, length = 4, 10
  tied_output = 24 * 29 if config.tie_output_projection else 0
  heads = 3 * (12 if "attention_head_dim" in overrides else 8)
  attention = 4 * rows * length * length * heads * (2 + 2 * 3)
  expected = 3 * (2 * rows * length * (kernels + tied_output) + attention)
  assert train_flops_per_step(config, rows, length) == expected
