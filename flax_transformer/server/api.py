"""The HTTP server's ASGI app (FastAPI): LibreTranslate's `/translate` and `/languages`, our own
`/v1/translate`, `/health`, `/metrics` and the web page at `/`.

    app = make_app(batcher, Service(source_lang="en", target_lang="de"))
    # POST /translate {"q": "A man.", "source": "en", "target": "de"}
    #   -> {"translatedText": "Ein Mann."}
    # POST /v1/translate {"sentences": ["A man."], "n": 2, "beam_size": 4}
    #   -> {"translations": [{"hypotheses": [{"text": ..., "score": ...}, ...], ...}], ...}
    app = make_app(batcher, Service(None, None, languages=tuple(translator.languages)))
    # POST /translate {"q": "A man.", "source": "eng_Latn", "target": "fra_Latn"}
    # POST /v1/translate {"sentences": ["A man."], "source_lang": "eng_Latn", "target_lang": ...}

The routes are module functions over the app's `Context` (`app.state.context`): the batcher,
the service (`server.languages`), the metrics and what is computed once. What they read and
answer is `server.schema`'s. Every error is one line, `{"error": "..."}`, with 400 (a bad
request), 403 (an API key), 413 (a body over the limit, or more sentences than the queue ever
holds), 429 (the queue is full now; with Retry-After), 500 (the search of the request's batch
failed) or 503 (compiling, or shutting down; with Retry-After). The handlers never search: they
queue a `Job` with the batcher and await its future, so the event loop keeps answering while
the worker thread searches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Sequence
from typing import Any

import fastapi
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from flax_transformer.errors import Error
from flax_transformer.server import languages as languages_lib
from flax_transformer.server import schema
from flax_transformer.server.guard import Guard
from flax_transformer.server.languages import Service
from flax_transformer.server.metrics import Metrics
from flax_transformer.server.page import render_page
from flax_transformer.server.schema import ApiError, TranslateRequest, TranslateResponse
from flax_transformer.serving import (
  COLD,
  Batcher,
  BatchFailed,
  Closed,
  Job,
  QueueFull,
  Sentence,
  TooLarge,
)


@dataclasses.dataclass(frozen=True)
class Context:
  """What every route reads: the started batcher, the service, the metrics, and the answers
  computed once (/languages, the page)."""

  batcher: Batcher
  service: Service
  metrics: Metrics
  languages: list[dict[str, Any]]
  page: str


def make_app(batcher: Batcher, service: Service, metrics: Metrics | None = None) -> Guard:
  """The ASGI app over a started `batcher`: the FastAPI app (its `.app`) inside the guard that
  limits bodies and counts answers. Without `metrics`, it makes its own and, if the batcher
  reports to nobody, makes it the batcher's `observe`."""
  service = languages_lib.served_by(service, batcher.translator)  # MADLAD: no source needed.
  metrics = metrics or Metrics(lambda: batcher.queued, batcher.ready.is_set,
                               lambda: batcher.programs)
  if batcher.observe is None:
    batcher.observe = metrics.observe_batch
  app = fastapi.FastAPI(
      title="flax-transformer", version="1",
      description=f"Translation {service.describe()}: "
      "LibreTranslate's /translate and /languages, and /v1/translate with every option.")
  page_html = render_page(service.source_lang or "", service.target_lang or "",
                          languages_lib.language_name(service.target_lang or ""),
                          keys=bool(service.api_keys))
  app.state.context = Context(batcher, service, metrics, languages_lib.languages_answer(service),
                              page_html)
  # Answers over 1 KB go gzipped to clients that accept it: /languages of NLLB-200's 202 codes
  # (40,602 pairs, which the web page asks for as it loads) is 498 KB of JSON, 5 KB gzipped.
  app.add_middleware(GZipMiddleware, minimum_size=1024)
  for error, handler in ((ApiError, api_error), (Exception, bug), (HTTPException, no_route),
                         (RequestValidationError, invalid)):
    app.add_exception_handler(error, handler)
  libre_body = {"application/json": {"schema": schema.LIBRE_SCHEMA},
                "application/x-www-form-urlencoded": {"schema": schema.LIBRE_SCHEMA}}
  app.add_api_route("/translate", translate, methods=["POST"],
                    summary="Translate (LibreTranslate's request and answer)",
                    openapi_extra={"requestBody": {"content": libre_body}})
  app.add_api_route("/languages", languages, methods=["GET"],
                    summary="The languages and their targets (LibreTranslate's answer)")
  app.add_api_route("/v1/translate", translate_v1, methods=["POST"],
                    response_model=TranslateResponse, response_model_exclude_none=True,
                    summary="Translate sentences with the Translator's options")
  app.add_api_route("/health", health, methods=["GET"],
                    summary="200 once the searches are compiled, else 503")
  app.add_api_route("/metrics", metrics_page, methods=["GET"], summary="Prometheus metrics")
  app.add_api_route("/", page, methods=["GET"], response_class=HTMLResponse,
                    include_in_schema=False)
  return Guard(app, service.max_body_bytes, metrics)


def _context(request: fastapi.Request) -> Context:
  return request.app.state.context


# ------------------------------------------------------------------------------------ errors
async def api_error(request: fastapi.Request, error: ApiError) -> JSONResponse:
  return JSONResponse({"error": str(error)}, error.status, headers=error.headers)


async def bug(request: fastapi.Request, error: Exception) -> JSONResponse:
  # Starlette's outermost middleware answers with this, then raises the error again: the
  # traceback still goes to the log. Clients get the JSON shape of every other error.
  return JSONResponse({"error": f"Internal error ({type(error).__name__}): a bug in the "
                       "server, which logged it."}, 500)


async def no_route(request: fastapi.Request, error: HTTPException) -> JSONResponse:
  # Starlette's 404 and 405 said {"detail": "Not Found"}: the JSON shape of no other answer.
  return JSONResponse({"error": _route_line(request.app, request, error)}, error.status_code,
                      headers=error.headers)


async def invalid(request: fastapi.Request, error: RequestValidationError) -> JSONResponse:
  return JSONResponse({"error": schema.validation_line(error.errors())}, 400)


def _route_line(app: fastapi.FastAPI, request: fastapi.Request, error: HTTPException) -> str:
  """One line for a request that no route takes (404, 405), naming the paths that are."""
  asked = f"{request.method} {request.url.path}"
  routes = sorted((route for route in app.routes if getattr(route, "methods", None)
                   and "oauth2" not in route.path),  # The API's paths, then /docs and the page.
                  key=lambda route: not getattr(route, "include_in_schema", False))
  methods = {route.path: sorted(route.methods - {"HEAD"}) for route in routes}
  if error.status_code == 405 and request.url.path in methods:
    return f"{asked} is not allowed: use {' or '.join(methods[request.url.path])}."
  if error.status_code != 404:
    return f"{asked}: {error.detail}"
  served = ", ".join(f"{' '.join(verbs)} {path}" for path, verbs in methods.items())
  why = (" (this server does not detect languages; name the source)"
         if request.url.path == "/detect" else "")
  return f"No such path: {asked}{why}. This server answers {served}."


# ------------------------------------------------------------------------ searching a request
async def translated(context: Context, request: fastapi.Request, job: Job) -> list[Sentence]:
  """The job's sentences, searched by the batcher (its errors as `ApiError`s); if the client
  of `request` hangs up first, the job is withdrawn (`Batcher.withdraw`: its sentences leave
  the engine's slots) and the answer, which no one reads, is a 499."""
  batcher, retry = context.batcher, {"Retry-After": str(schema.RETRY_AFTER_SECONDS)}
  if batcher.failed is not None:
    raise ApiError(500, "The server's warm-up failed; see its log.")
  if not batcher.ready.is_set():
    raise ApiError(503, "The server is still compiling its searches; retry shortly.", retry)
  try:
    future = batcher.submit(job)
  except TooLarge as error:
    raise ApiError(413, str(error)) from None
  except QueueFull as error:
    raise ApiError(429, f"Slowdown: {error}", retry) from None
  except Closed as error:
    raise ApiError(503, str(error), retry) from None
  except Error as error:
    raise ApiError(400, f"Invalid request: {error}") from None
  try:
    answers = await _unless_gone(future, batcher, request)
  except BatchFailed as error:
    raise ApiError(500, f"Cannot translate text: {error}; the server logged it.") from None
  except Error as error:
    raise ApiError(400, f"Invalid request: {error}") from None
  if answers is None:
    raise ApiError(499, "The client closed the connection before its answer.")
  return answers


async def _unless_gone(future: concurrent.futures.Future, batcher: Batcher,
                       request: fastapi.Request) -> list[Sentence] | None:
  """`future`'s answer; None once the client hangs up first (the job withdrawn), and the job
  withdrawn too when this task is cancelled."""
  answer, gone = asyncio.wrap_future(future), asyncio.ensure_future(_client_gone(request))
  try:
    await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
  except asyncio.CancelledError:
    batcher.withdraw(future)
    raise
  finally:
    gone.cancel()
  if not answer.done():
    batcher.withdraw(future)
    answer.cancel()
    return None
  return answer.result()


async def _client_gone(request: fastapi.Request) -> None:
  """Returns once the client of `request`, whose body was read, hangs up (ASGI's
  http.disconnect; the server sends it on a closed connection or once the response is sent)."""
  while (await request.receive())["type"] != "http.disconnect":
    await asyncio.sleep(0.1)  # Not expected once the body was read; no busy loop if it comes.


def _check_key(service: Service, key: Any) -> None:
  if not service.api_keys:
    return
  if not key:
    raise ApiError(403, "Missing API key: this server needs api_key.")
  if key not in service.api_keys:
    raise ApiError(403, "Invalid API key")


# ----------------------------------------------------------------------- LibreTranslate's API
async def translate(request: fastapi.Request) -> Response:
  """POST /translate: LibreTranslate's request (JSON or a form) and answer."""
  context = _context(request)
  fields = await schema.libre_fields(request)
  _check_key(context.service, fields.get("api_key"))
  texts, single = schema.libre_texts(fields.get("q"))
  source, target = fields.get("source"), fields.get("target")
  for name, value in (("source", source), ("target", target)):
    if not value and (name == "target" or context.service.needs_source):
      raise ApiError(400, f"Invalid request: missing {name} parameter")
  language = languages_lib.libre_source(context.service, source, target)
  text_format = fields.get("format") or "text"
  if text_format != "text":
    raise ApiError(400, f"{text_format} format is not supported: this server translates "
                   "plain text (format text); strip the markup first.")
  alternatives = _alternatives(context, fields.get("alternatives", 0))
  lines = [line for text in texts for line in text.split("\n")]
  if context.service.languages and language == target:  # LibreTranslate's rule: as it is.
    answers = [Sentence([(line, 0.0)]) for line in lines]
  else:
    answers = await translated(context, request, Job(
        tuple(lines), n=alternatives + 1,
        **languages_lib.job_pair(context.service, language, target)))
  results, alternates, truncated = _libre_texts(texts, answers, alternatives)
  body: dict[str, Any] = {"translatedText": results[0] if single else results}
  if source == "auto" and language:  # A MADLAD server without a default source says none.
    detected = {"confidence": 100.0, "language": language}
    body["detectedLanguage"] = detected if single else [detected] * len(texts)
  if alternatives:
    body["alternatives"] = alternates[0] if single else alternates
  headers = {"X-Truncated-Lines": str(truncated)} if truncated else None
  return JSONResponse(body, headers=headers)


def _alternatives(context: Context, value: Any) -> int:
  """LibreTranslate's `alternatives`, checked against its limit, here the beam's size."""
  alternatives = schema.count(value, "alternatives")
  search = context.batcher.translator.settings.search
  most = search.beam_size - 1 if search.method == "beam" else 0
  if alternatives > most:
    raise ApiError(400, f"Invalid request: alternatives parameter must be <= {most} (the "
                   "server's beam size minus one)")
  return alternatives


def _libre_texts(texts: Sequence[str], answers: Sequence[Sentence], alternatives: int
                 ) -> tuple[list[str], list[list[str]], int]:
  """(each text's translation, line by line; its alternatives; the truncated lines) from the
  answers of all texts' lines in order."""
  results, alternates, truncated, at = [], [], 0, 0
  for text in texts:
    count = text.count("\n") + 1
    mine = answers[at:at + count]
    at += count
    truncated += sum(answer.truncated for answer in mine)
    best = "\n".join(answer.hypotheses[0][0] for answer in mine)
    results.append(best)
    # LibreTranslate's rule: the other hypotheses, each once, without the translation; and
    # none that is empty (a beam's EOS-first hypothesis; LibreTranslate would give the
    # source text in its place).
    others = ["\n".join(a.hypotheses[min(k, len(a.hypotheses) - 1)][0] for a in mine)
              for k in range(1, alternatives + 1)]
    alternates.append(list(dict.fromkeys(o for o in others if o != best and o.strip())))
  return results, alternates, truncated


async def languages(request: fastapi.Request) -> list[dict[str, Any]]:
  """GET /languages: each code with its name and targets."""
  return _context(request).languages


# ------------------------------------------------------------------------------ our own API
async def translate_v1(body: TranslateRequest, request: fastapi.Request) -> TranslateResponse:
  """POST /v1/translate: sentences with the Translator's options."""
  context = _context(request)
  _check_key(context.service, body.api_key)
  schema.check_lines(body.sentences, "sentences")
  for name in ("target_prefix", "constraints", "forbid"):
    given = getattr(body, name)
    if given is not None and len(given) != len(body.sentences):
      raise ApiError(400, f"Invalid request: {len(given)} {name} for "
                     f"{len(body.sentences)} sentences; give one per sentence.")
  if body.target_prefix is not None:
    schema.check_lines(body.target_prefix, "target_prefix")
  pair = languages_lib.v1_pair(context.service, body.source_lang, body.target_lang)
  phrases = lambda lists: None if lists is None else tuple(tuple(p) for p in lists)
  job = Job(tuple(body.sentences), n=body.n, settings=body.settings(),
            target_prefix=None if body.target_prefix is None else tuple(body.target_prefix),
            constraints=phrases(body.constraints), forbid=phrases(body.forbid),
            alignments=body.alignments, **pair)
  answers = await translated(context, request, job)
  return TranslateResponse(step=context.service.step, translations=[schema.Translation(
      truncated=answer.truncated, hypotheses=[schema.Hypothesis(
          text=text, score=score,
          alignment=None if answer.alignments is None else answer.alignments[k],
          constraints_met=None if answer.constraints_met is None
          else answer.constraints_met[k])
          for k, (text, score) in enumerate(answer.hypotheses)]) for answer in answers])


async def health(request: fastapi.Request) -> JSONResponse:
  """GET /health: 200 once warm (with what still compiles on first use), else 503 or 500."""
  context = _context(request)
  batcher, step = context.batcher, context.service.step
  if batcher.failed is not None:
    return JSONResponse({"status": "failed", "step": step}, 500)
  if not batcher.ready.is_set():
    return JSONResponse({"status": "compiling", "step": step}, 503)
  return JSONResponse({"status": "ok", "step": step, "queued": batcher.queued,
                       "warm": batcher.warm, "compiled_on_first_use": _cold(batcher)})


def _cold(batcher: Batcher) -> str:
  """What a request still compiles on its first use, as /health says it."""
  if not batcher.warm:
    return "every search"
  if not batcher.not_warm:
    return COLD
  return f"{', '.join(batcher.not_warm)} (serve --warmup_kinds); {COLD}"


async def metrics_page(request: fastapi.Request) -> Response:
  """GET /metrics: Prometheus's text."""
  content, content_type = _context(request).metrics.render()
  return Response(content, media_type=content_type)


async def page(request: fastapi.Request) -> HTMLResponse:
  """GET /: the web page."""
  return HTMLResponse(_context(request).page)


__all__ = ["Context", "Service", "make_app"]
