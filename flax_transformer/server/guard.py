"""The ASGI middleware around the server's app: a body over the limit is answered 413 before
the app sees it, and every HTTP answer is counted in the metrics by endpoint and status."""

from __future__ import annotations

import json
import time
from typing import Any

import fastapi

from flax_transformer.server.metrics import Metrics

ENDPOINTS = ("/translate", "/v1/translate", "/languages", "/health", "/metrics", "/")


class Guard:
  """ASGI middleware around the app: a body over `max_body_bytes` is answered 413 before the
  app sees it (by its Content-Length, or as it streams in), and every HTTP answer is counted
  in the metrics by endpoint (`ENDPOINTS`, else "other") and status, with its time."""

  def __init__(self, app: fastapi.FastAPI, max_body_bytes: int, metrics: Metrics):
    self.app = app
    self.max_body_bytes = max_body_bytes
    self.metrics = metrics

  def __getattr__(self, name: str) -> Any:  # openapi(), routes, state, ...: the app's.
    return getattr(self.app, name)

  async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
      await self.app(scope, receive, send)
      return
    start = time.perf_counter()
    status = [500]
    path = scope.get("path", "")
    endpoint = path if path in ENDPOINTS else "other"

    async def sending(message: dict) -> None:
      if message["type"] == "http.response.start":
        status[0] = message["status"]
      await send(message)

    try:
      body = await self._body(scope, receive)
      if body is None:
        await _send_json(sending, 413, {"error": f"The request body is over the limit of "
                                        f"{self.max_body_bytes} bytes."})
        return
      replayed = [{"type": "http.request", "body": body, "more_body": False}]

      async def replay() -> dict:
        return replayed.pop() if replayed else await receive()

      await self.app(scope, replay, sending)
    finally:
      self.metrics.observe_request(endpoint, status[0], time.perf_counter() - start)

  async def _body(self, scope: dict, receive: Any) -> bytes | None:
    """The whole request body, or None once it passes the limit."""
    for name, value in scope.get("headers", ()):
      if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
        return None
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] == "http.disconnect":
        break
      chunk = message.get("body", b"")
      size += len(chunk)
      if size > self.max_body_bytes:
        return None
      chunks.append(chunk)
      if not message.get("more_body", False):
        break
    return b"".join(chunks)


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
  content = json.dumps(body).encode()
  await send({"type": "http.response.start", "status": status,
              "headers": [(b"content-type", b"application/json"),
                          (b"content-length", str(len(content)).encode())]})
  await send({"type": "http.response.body", "body": content})


__all__ = ["ENDPOINTS", "Guard"]
