"""`flax-transformer serve`: the app (`server.api`) under uvicorn, over one batcher.

    serve(translator, ServerOptions(port=5000, warmup=True), Service("en", "de"))

It binds its socket first (a port in use is one line, before anything compiles), answers
/health with 503 while the worker thread compiles, then prints one line with its address and
serves. SIGTERM or SIGINT: the socket closes (no new connection), every request in flight gets
its answer (the batcher searches what is queued without waiting for batches to fill), and
`serve` returns within `drain_seconds`; a second signal ends the wait. Why uvicorn and FastAPI:
the ASGI stack that FastAPI's users and most Python model servers run, maintained, with
graceful shutdown, an OpenAPI page of the request schema and a test client that needs no
socket (httpx's ASGITransport).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator

import uvicorn

from flax_transformer import files
from flax_transformer.errors import InputError
from flax_transformer.server.api import make_app
from flax_transformer.server.languages import Service
from flax_transformer.server.metrics import Metrics
from flax_transformer.serving.batcher import Batcher
from flax_transformer.serving.translator import Translator

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServerOptions:
  """How the server listens and batches (the `serve` command's flags)."""

  host: str = "127.0.0.1"
  port: int = 5000  # 0: a free port, said in the ready line.
  max_wait_ms: float = 5.0
  max_queue: int = 2048
  max_beam_size: int | None = 16
  max_programs: int | None = 64
  batching_mode: str = "exact"
  warmup: bool | tuple[str, ...] = False  # True: the server's settings; or `WARM_KINDS`.
  drain_seconds: float = 30.0


class _Server(uvicorn.Server):
  """uvicorn's server, its signals handled here: SIGTERM and SIGINT start its graceful
  shutdown, and are not raised again once it is done (uvicorn re-raises them, which would end
  the command with 128 + the signal instead of 0)."""

  @contextlib.contextmanager
  def capture_signals(self) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    previous = {sig: signal.signal(sig, self.handle_exit)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
      yield
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)


def read_api_keys(path: str) -> frozenset[str]:
  """The keys of an --api_keys file (local or gs://): one a line; blank lines and '#' comments
  skipped. InputError when it holds none."""
  keys = frozenset(line.strip() for line in files.read_lines(path)
                   if line.strip() and not line.lstrip().startswith("#"))
  if not keys:
    raise InputError(f"--api_keys {path} holds no key (one a line).")
  return keys


def listen(host: str, port: int) -> socket.socket:
  """A socket bound to (host, port), listening; InputError in one line when it cannot be."""
  try:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
  except socket.gaierror as error:
    raise InputError(f"--host {host}: {error.strerror}.") from None
  family, kind, proto, _, address = infos[0]
  sock = socket.socket(family, kind, proto)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind(address)
  except OSError as error:
    sock.close()
    raise InputError(f"Cannot listen on {host}:{port}: {error.strerror}.") from None
  sock.listen(2048)
  sock.set_inheritable(True)
  return sock


def serve(translator: Translator, options: ServerOptions, service: Service,
          announce: Callable[[str], None] | None = None, progress: bool = False) -> bool:
  """Serves until SIGTERM or SIGINT, then drains; `announce(address)` once ready (default:
  one line on stdout). Returns whether it got ready (False: stopped during the warm-up, whose
  thread may still be compiling: the caller ends the process). Raises InputError for a socket
  that cannot be bound, RuntimeError when the warm-up failed."""
  sock = listen(options.host, options.port)
  host, port = sock.getsockname()[:2]
  address = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
  batcher = Batcher(translator, max_wait_ms=options.max_wait_ms, max_queue=options.max_queue,
                    batching_mode=options.batching_mode, max_beam_size=options.max_beam_size,
                    max_programs=options.max_programs)
  metrics = Metrics(lambda: batcher.queued, batcher.ready.is_set, lambda: batcher.programs)
  batcher.observe = metrics.observe_batch
  app = make_app(batcher, service, metrics)
  config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                          timeout_graceful_shutdown=options.drain_seconds,
                          timeout_keep_alive=5)
  server = _Server(config)
  announce = announce or (lambda address: print(address, flush=True))

  async def when_ready() -> None:
    await asyncio.to_thread(batcher.ready.wait)
    if batcher.failed is not None:
      server.should_exit = True
      return
    while not server.started and not server.should_exit:
      await asyncio.sleep(0.01)
    if server.started:
      announce(address)

  async def main() -> None:
    batcher.start(warmup=options.warmup, progress=progress)
    ready = asyncio.create_task(when_ready())
    try:
      await server.serve(sockets=[sock])
    finally:
      ready.cancel()

  try:
    asyncio.run(main())
  finally:
    sock.close()
    # The answers are sent; what is left in the queue came from clients that went away. A
    # stop during the warm-up does not wait for the compile under way (it cannot be cut short).
    drain = options.drain_seconds if batcher.ready.is_set() else 0
    if not batcher.close(timeout=drain) and drain:
      print("flax-transformer serve: the last search did not end within --drain_seconds.",
            file=sys.stderr)
  if batcher.failed is not None:
    raise RuntimeError("The warm-up failed (its traceback is above).") from batcher.failed
  return batcher.ready.is_set()


__all__ = ["ServerOptions", "listen", "read_api_keys", "serve"]
