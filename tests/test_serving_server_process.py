"""`flax-transformer serve` as a process, the way production runs it: its ready line, then
SIGTERM under load on 127.0.0.1 (and clients that reset their connections mid-request): every
request it took is answered (translate's translation), a new connection is refused, and it
exits 0 within its drain deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import small_program_child_xla_flags

from flax_transformer.data import synthetic
from flax_transformer.serving import Translator

pytestmark = pytest.mark.slow  # Spawns the server; a trained workdir.

REPO = Path(__file__).resolve().parents[1]
REQUESTS = 150


def start_server(workdir: Path, *flags: str) -> tuple[subprocess.Popen, str]:
  """`flax-transformer serve --port 0` on one CPU device, and its address once ready."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             XLA_FLAGS=f"--xla_force_host_platform_device_count=1 "
             f"{small_program_child_xla_flags()}")
  process = subprocess.Popen(
      [sys.executable, "-m", "flax_transformer.cli", "serve", "--workdir", str(workdir),
       "--port", "0", *flags], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE)
  line = process.stdout.readline()  # The ready line (or "" if it died).
  match = re.search(r"ready at (http://127\.0\.0\.1:\d+) ", line)
  if not match:
    process.kill()
    raise AssertionError(f"no ready line: {line!r}\n{process.stderr.read()[-3000:]}")
  return process, match[1]


@contextlib.contextmanager
def serving(workdir: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
  """`start_server`, killed on the way out if it still runs (a failed assertion before its
  SIGTERM would leave it serving after the test)."""
  process, address = start_server(workdir, *flags)
  try:
    yield process, address
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()


@pytest.mark.parametrize("engine", ["batches", "slots"])
def test_sigterm_under_load_answers_every_request_and_exits_0(trained_workdir, engine):
  """On either engine: on the slots, the signal finds sentences in the tables' slots and in the
  lanes' queues, and each is answered with `translate --engine slots`' bytes."""
  rng = random.Random(3)
  lines = [synthetic.sample_pair(rng)[0] for _ in range(REQUESTS)]
  translator = Translator.from_workdir(trained_workdir, batch_tokens=512, engine=engine)
  expected = translator.translate(lines)
  with serving(trained_workdir, "--max_batch_tokens", "512", "--drain_seconds", "60",
               "--max_beam_size", "5", "--engine", engine) as (process, address):
    # The command's limit reaches the batcher: a huge beam is a 400, not a search.
    huge = httpx.post(f"{address}/v1/translate", json={"sentences": [lines[0]], "beam_size": 10**6},
                      timeout=60)
    assert (huge.status_code, huge.json()) == (400, {"error": "Invalid request: beam_size 1000000 "
                                                     "is over this server's limit of 5 (its "
                                                     "--max_beam_size)."})

    async def load() -> tuple[list, float, BaseException | None]:
      limits = httpx.Limits(max_connections=REQUESTS + 10, max_keepalive_connections=0)
      async with httpx.AsyncClient(base_url=address, limits=limits, timeout=120) as client:
        async def one(line: str):
          try:
            return await client.post("/translate", json={"q": line, "source": "en",
                                                         "target": "de"})
          except httpx.HTTPError as error:
            return error

        async def gone(line: str) -> None:  # Sends a whole request, then hangs up at once.
          body = json.dumps({"q": line, "source": "en", "target": "de"}).encode()
          host, port = address.removeprefix("http://").split(":")
          _, writer = await asyncio.open_connection(host, int(port))
          writer.write(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                       b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
          await writer.drain()
          writer.transport.abort()  # A reset, not a polite close.

        tasks = [asyncio.create_task(one(line)) for line in lines]
        await asyncio.gather(*[gone(line) for line in lines[:10]])
        while sum(task.done() for task in tasks) < REQUESTS // 4:
          await asyncio.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        answers = await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)
        try:  # After the signal: the socket is closed.
          await client.post("/translate", json={"q": lines[0], "source": "en", "target": "de"})
          refused = None
        except httpx.HTTPError as error:
          refused = error
        return answers, signalled, refused

    answers, signalled, refused = asyncio.run(load())
    status = process.wait(timeout=90)
    seconds = time.monotonic() - signalled
    stderr = process.stderr.read()
    lost = [a for a in answers if not isinstance(a, httpx.Response)]
    assert not lost, lost[:3]
    assert [a.status_code for a in answers] == [200] * REQUESTS
    assert [a.json()["translatedText"] for a in answers] == expected
    assert isinstance(refused, httpx.ConnectError)
    assert status == 0, stderr[-3000:]
    assert seconds < 60
    assert "stopped; every request taken was answered" in stderr
    assert "Traceback" not in stderr
