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
